"""turingbox_plugin.vllm_fixes.fix_compile_key_locations against vLLM 0.21.0's real vllm.envs.compile_factors
(CPU, in a child process with vLLM's source on its path).

vLLM names its torch.compile cache folder after a hash that includes VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH,
which default to folders under HOME: session 11's startup A/B recompiled every graph on a seeded copy made under
another HOME. Fails when vLLM's key changes (then the fix steps aside and this test says so)."""
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
        r = subprocess.run([sys.executable, os.path.join(HERE, "compile_key_check.py"), vllm_source_root("envs.py"),
                            "/home/seeder", "/home/turingbox"], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        _result = json.loads(r.stdout.strip().splitlines()[-1])
    return _result


def test_vllm_0_21_keys_its_compile_cache_on_two_home_folders():
    out = result()
    assert out["differing_before"] == ["VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"]
    assert out["same_hash_before"] is False


def test_the_fix_makes_the_key_the_same_under_any_home():
    out = result()
    assert out["applied"] == out["applied_again"] == "applied"
    assert out["differing_after"] == [] and out["same_hash_after"] is True
    assert out["factors_dropped"] == ["VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"]


def test_what_changes_compiled_code_still_changes_the_key():
    assert result()["partition_changes_hash"] is True


def test_vllm_hashes_through_the_patched_function():
    assert result()["callers_use_module_attribute"] == ["vllm.compilation.backends", "vllm.compilation.caching"]
