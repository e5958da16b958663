"""turingbox_plugin.vllm_fixes.defer_tokenizer_pool against vLLM 0.21.0's real maybe_make_thread_pool and
CoreEngineProcManager (CPU, child process with vLLM's source on its path).

vLLM's API server deep-copies its tokenizer twice for the renderer's thread pool before it starts the engine core
(4.9 s of session 12's py-spy profile on the H200 host). The patch makes those copies in a thread started after the
engine processes are (fork-safe), with vLLM's own pool code; fails when vLLM's pool changes under it."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402


@pytest.fixture(scope="module")
def run():
    root, results = vllm_source_root("tokenizers/hf.py"), {}

    def go(mode):
        if mode not in results:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            r = subprocess.run([sys.executable, os.path.join(HERE, "tokenizer_pool_check.py"), root, mode],
                               capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        return results[mode]
    return go


def test_vllm_copies_the_tokenizer_before_it_starts_the_engine(run):
    out = run("unpatched")
    assert out["pool_class"].startswith("TokenizerPool") and out["pool_found"]
    assert out["copies_before_engine_start"] == 2 and out["queued_before_engine_start"] == 2
    assert out["copy_threads"] == ["MainThread"]


def test_the_copies_are_made_after_the_engine_start_off_the_main_thread(run):
    out = run("patched")
    assert out["applied"] == out["applied_again"] == "applied"
    assert out["module_attribute_is_patched"] and out["renderer_uses_patched"]
    assert out["pool_class"].startswith("TokenizerPool")              # vLLM's own pool class, thread-safe as before
    assert out["copies_before_engine_start"] == 0 and out["queued_before_engine_start"] == 0
    assert out["threads_started_before_engine_start"] == 0           # nothing runs beside the fork
    assert out["vllm_start_ran"]
    assert out["copies_after_engine_start"] == 2 and out["queued_after_engine_start"] == 2
    assert out["copy_threads"] == ["turingbox-tokenizer-pool"]
    assert any(s.startswith("turingbox: tokenizer pool filled after the engine processes started") for s in out["said"])


def test_the_pool_answers_as_the_tokenizer_and_a_pool_built_later_fills_at_once(run):
    out = run("patched")
    assert out["encode_same"] and out["decode_same"] and out["encode_copies_made"] == 0
    assert out["copies_after_start_at_once"] == 2


def test_a_renderer_module_imported_before_the_patch_uses_it(run):
    out = run("renderer-first")
    assert out["applied"] == "applied" and out["renderer_uses_patched"]
    assert out["copies_before_engine_start"] == 0 and out["copy_threads"] == ["turingbox-tokenizer-pool"]


def test_a_server_whose_engines_run_elsewhere_fills_before_its_client_returns(run):
    """An API server among several (vLLM's api_server_count with data parallelism): its parent started the engines,
    so nothing forks here; the copies are made when vLLM's client is built, before the server serves."""
    out = run("client")
    assert out["applied"] == "applied" and out["client_ran"] and not out["vllm_start_ran"]
    assert out["copies_before_engine_start"] == 0
    assert out["copies_after_engine_start"] == 2 and out["copy_threads"] == ["MainThread"]
    assert out["queued_after_engine_start"] == 2
    assert any("filled when the engine client was built" in s for s in out["said"])


def test_the_patched_function_pickles_by_vllms_name(run):
    assert run("patched")["pickles_by_reference"] is True


def test_when_the_engine_start_cannot_be_hooked_the_pool_is_filled_at_once(run):
    out = run("no-hook")
    assert out["applied"] == "applied"
    assert out["copies_before_engine_start"] == 2 and out["copy_threads"] == ["MainThread"]
    assert any("tokenizer pool filled at once (ImportError" in s for s in out["said"])


def test_a_changed_vllm_pool_is_left_alone(run):
    out = run("moved")
    assert out["applied"].startswith("skipped: vllm.tokenizers.hf.maybe_make_thread_pool is not vLLM 0.21.0's")
    assert out["copies_before_engine_start"] == 2 and out["copy_threads"] == ["MainThread"]
