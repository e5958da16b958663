"""turingbox_plugin.vllm_fixes.skip_text_only_model_import against vLLM 0.21.0's real
MultiModalRegistry.supports_multimodal_inputs (CPU, child process with vLLM's source on its path): with
--language-model-only vLLM answers "no multimodal inputs" only after importing the model class (which, for
Qwen3.6, initialises CUDA in the API server through FLA); the patch gives the same answer without the import,
and leaves every other configuration to vLLM."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402


@pytest.fixture(scope="module")
def run():
    root, results = vllm_source_root("multimodal/registry.py"), {}

    def go(mode):
        if mode not in results:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            r = subprocess.run([sys.executable, os.path.join(HERE, "text_only_check.py"), root, mode],
                               capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_imports_the_model_class_to_answer_false(run):
    out = run("unpatched")
    assert out["premise"] == 0                      # language_model_only: every modality's limit is 0
    assert out["language_model_only"] == {"supports": False, "model_imports": 1}


def test_language_model_only_answers_false_without_the_import(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == "applied"
    assert out["language_model_only"] == {"supports": False, "model_imports": 0}
    # vLLM's "running in text-only mode" line still appears in vLLM's log, once: startup timelines end a step on it
    assert sum("running in text-only mode" in line for line in out["said_for_language_model_only"]) == 1


def test_other_configurations_get_vllms_answer(run):
    plain, patched = run("unpatched"), run("patched")
    for case in ("language_model_only_with_embeds", "limits_zero", "images", "text_model"):
        assert patched[case] == plain[case], case
    assert patched["language_model_only_with_embeds"] == {"supports": True, "model_imports": 1}
    assert patched["limits_zero"] == {"supports": False, "model_imports": 1}
    assert patched["images"]["supports"] is True
    assert patched["text_model"] == {"supports": False, "model_imports": 0}


def test_steps_aside_when_vllm_changed(run):
    out = run("moved")
    assert out["applied"].startswith("skipped:") and out["applied_again"].startswith("skipped:")
    assert out["language_model_only"]["model_imports"] == 1
