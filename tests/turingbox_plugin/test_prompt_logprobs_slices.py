"""turingbox_plugin.vllm_fixes.fix_prompt_logprobs_slices against vLLM 0.21.0's real
GPUModelRunner._get_prompt_logprobs_dict and Sampler (CPU, in a child process with vLLM's source on its path).

vLLM 0.21 turns a prompt_logprobs request's whole scheduled chunk into vocabulary-wide logits at once, a peak its
memory profile never sees (session 10's AWQ soak: 7.6 GiB over the engine's budget; an out-of-memory error on a
22 GB card). With the fix no call holds more than `prompt_logprobs_rows` tokens and the answers are vLLM's. Fails
when vLLM's source no longer holds the calls the fix slices (it would step aside)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402

_result = None


def result():
    global _result
    if _result is None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([sys.executable, os.path.join(HERE, "prompt_logprobs_check.py"),
                            vllm_source_root("v1/worker/gpu_model_runner.py")],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        _result = json.loads(r.stdout.strip().splitlines()[-1])
    return _result


def test_vllm_0_21_turns_a_whole_chunk_into_logits_at_once():
    assert result()["max_rows_unpatched"] == 200          # request a's first chunk, in one call


def test_the_fix_slices_the_chunk_and_answers_as_vllm_does():
    out = result()
    assert out["applied"] == out["applied_again"] == "applied"
    assert out["slice_rows"] == 45                        # 128 MiB over 248,320 entries x 12 bytes
    assert out["max_rows_patched"] == 45
    assert out["calls_patched"] == 12                     # 200+80 tokens, then 99+49: 5+2+3+2 slices
    assert out["answers"] == ["a", "b"] and out["shape_a"] == [299, 6]
    assert out["same_answers"] is True                    # ids, logprobs and ranks of every prompt token


def test_the_fix_leaves_the_model_and_sampler_as_they_were_even_after_an_error():
    out = result()
    assert out["leftover_attributes"] == []
    assert out["error_passes_through"] == "CUDA out of memory (stand-in)"


def test_the_slice_never_has_zero_rows():
    from turingbox_plugin.vllm_fixes import prompt_logprobs_rows

    assert prompt_logprobs_rows(10 ** 9) == 1
