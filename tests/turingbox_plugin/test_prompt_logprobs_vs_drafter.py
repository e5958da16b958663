"""fix_prompt_logprobs_vs_drafter (session 23's two NaN prompt logprobs under MTP, vllm#53488) against vLLM 0.21.0's
real GPUModelRunner on CPU, in a child process with vLLM's source on its path: the drafter-before-bookkeeping order
the fix relies on is vLLM's, and with a stand-in drafter that writes over the hidden states (as its CUDA graphs do
on the GPU) the prompt logprobs come from the target's rows only with the fix, in graph-sized steps."""
import json
import os
import subprocess
import sys

from tests.turingbox_plugin.vllm_source import vllm_source_root

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "plugin")


def test_prompt_logprobs_read_the_target_rows_not_the_drafters():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = PLUGIN
    r = subprocess.run([sys.executable, os.path.join(HERE, "prompt_rows_check.py"),
                        vllm_source_root("v1/worker/gpu_model_runner.py")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hidden_at"] == 3                                  # scheduler_output, sampled, metadata, hidden_states
    assert out["unpatched"] == {"finite": False, "as_before_the_drafter": False}      # vLLM's order: NaN
    assert out["graph_step"] == out["graph_step_keyword"] == {"finite": True, "as_before_the_drafter": True}
    # past the largest CUDA graph, or with no graphs or no prompt logprobs, nothing is copied: vLLM's own behaviour
    assert out["eager_step"] == out["eager_plan"] == {"finite": False, "as_before_the_drafter": False}
    assert out["eager_step_kept"] == out["no_prompt_logprobs_kept"] == "popped"     # never left for a later step
    assert out["applied"] == out["applied_again"] == "applied" and out["wraps_vllms"] is True
