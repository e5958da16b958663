"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real CacheConfig hash (a
factor of the compile cache folder's name) with and without `--kv-cache-memory-bytes`, before and after
turingbox_plugin.vllm_fixes.fix_kv_size_out_of_compile_key. Prints one JSON object."""
import inspect
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])

from vllm.config.cache import CacheConfig  # noqa: E402

GIB = 1 << 30


def hashes() -> dict:
    flagless, given = CacheConfig(), CacheConfig(kv_cache_memory_bytes=81 * GIB)
    other_size = CacheConfig(kv_cache_memory_bytes=40 * GIB)
    other_block = CacheConfig(kv_cache_memory_bytes=81 * GIB, block_size=32)    # changes the graph: stays in the key
    return {"flagless": flagless.compute_hash(), "given": given.compute_hash(), "other_size": other_size.compute_hash(),
            "other_block": other_block.compute_hash(), "kept": given.kv_cache_memory_bytes}


before = hashes()
from turingbox_plugin.vllm_fixes import fix_kv_size_out_of_compile_key  # noqa: E402

applied, applied_again = fix_kv_size_out_of_compile_key(), fix_kv_size_out_of_compile_key()
after = hashes()
# vLLM's compile key (VllmConfig.compute_hash) calls the method on the instance, so the patched one is what it calls
from vllm.config import vllm as vllm_config_module  # noqa: E402

print(json.dumps({
    "applied": applied, "applied_again": applied_again,
    "before": {"given_moves_key": before["given"] != before["flagless"]},
    "after": {"given_moves_key": after["given"] != after["flagless"],
              "sizes_share_key": after["given"] == after["other_size"],
              "block_size_moves_key": after["other_block"] != after["given"],
              "flagless_unchanged": after["flagless"] == before["flagless"],
              "value_kept": after["kept"] == 81 * GIB},
    "vllm_config_hashes_cache_config": "self.cache_config.compute_hash()" in inspect.getsource(vllm_config_module),
}))
