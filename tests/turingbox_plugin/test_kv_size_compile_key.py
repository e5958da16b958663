"""turingbox_plugin.vllm_fixes.fix_kv_size_out_of_compile_key against vLLM 0.21.0's real CacheConfig (CPU, in a child
process with vLLM's source on its path).

vLLM 0.21 hashes `--kv-cache-memory-bytes` into its compile cache key (vllm#47356, fixed after 0.21), so a start given
the KV size a seed measured would recompile every graph. Fails when vLLM's hash changes (the fix then steps aside and
this test says so)."""
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
        r = subprocess.run([sys.executable, os.path.join(HERE, "kv_size_key_check.py"),
                            vllm_source_root("config/cache.py")], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        _result = json.loads(r.stdout.strip().splitlines()[-1])
    return _result


def test_vllm_0_21_moves_its_compile_key_with_the_kv_size():
    assert result()["before"]["given_moves_key"] is True


def test_the_fix_keys_a_start_given_the_kv_size_as_one_without_it():
    out = result()
    assert out["applied"] == out["applied_again"] == "applied"
    after = out["after"]
    assert after["given_moves_key"] is False and after["sizes_share_key"] is True
    assert after["flagless_unchanged"] is True          # entries seeded before the fix still load
    assert after["value_kept"] is True                  # the engine's own config keeps the size it was given


def test_what_changes_the_graph_still_changes_the_key():
    out = result()
    assert out["after"]["block_size_moves_key"] is True
    assert out["vllm_config_hashes_cache_config"] is True
