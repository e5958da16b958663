"""turingbox_plugin.vllm_fixes against vLLM 0.21.0's real InputBatch and RejectionSampler (CPU, in a child
process with vLLM's source on its path): without the fixes a request inherits another's allowed_token_ids
mask and an out-of-vocabulary id fails the logprobs gather; with them neither happens. Fails when vLLM's
source no longer holds the code the fixes correct (they would step aside)."""
import json
import os
import subprocess
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root as _source_root  # noqa: E402
V = 248320


def vllm_source_root():
    return _source_root("v1/worker/gpu_input_batch.py")


def run(mode):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, os.path.join(HERE, "vllm_fixes_check.py"), vllm_source_root(), mode],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_vllm_0_21_has_the_faults_the_fixes_correct():
    out = run("unpatched")
    assert out["recycled_row"] == 5             # a new request inherited a finished request's 5-token mask
    assert out["swapped"] != {"x": 5, "y": V}   # after a swap the masks no longer follow their requests
    assert out["gather"]["ok"] is False         # an id == vocab size fails the logprobs gather
    assert out["sampled_ids"] == [[5, V, -1]]    # and goes on to the next step's input
    assert out["kernel_signature_same"] is True


def test_fixes_keep_masks_with_their_requests_and_the_gather_in_range():
    out = run("patched")
    assert out["applied"] == {"mask_rows": "applied", "logprobs_ids": "applied", "out_of_vocab_ids": "applied",
                             "min_tokens_vs_grammar": "applied", "prompt_logprobs_slices": "applied",
                             "prompt_logprobs_vs_drafter": "applied", "compile_key_locations": "applied",
                             "kv_size_out_of_compile_key": "applied"} \
        == out["applied_again"]
    assert out["recycled_row"] == V and out["moved_row"] == 5
    assert out["swapped"] == {"x": 5, "y": V}
    assert out["gather"] == {"ok": True, "max_id": 3, "sampled_after": [[8, 3]]}   # the output ids untouched
    assert out["sampled_ids"] == [[5, 0, -1]]    # past the vocabulary: 0, as without MTP; drafts and -1 untouched
