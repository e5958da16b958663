"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real compile cache key
factors (vllm.envs.compile_factors, hashed as vLLM hashes them) under two HOMEs, before and after
turingbox_plugin.vllm_fixes.fix_compile_key_locations. Prints one JSON object."""
import inspect
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
homes = sys.argv[2:4]

import vllm.envs as envs  # noqa: E402
from vllm.config.utils import hash_factors  # noqa: E402

for name in ("VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH", "VLLM_CACHE_ROOT", "VLLM_PP_LAYER_PARTITION"):
    os.environ.pop(name, None)


def key_under(home: str, **extra: str) -> tuple[dict, str]:
    """compile_factors and their hash with HOME (and XDG_CONFIG_HOME / XDG_CACHE_HOME, as a user's profile sets
    them) at `home`."""
    os.environ.update(HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"),
                      XDG_CACHE_HOME=os.path.join(home, ".cache"), **extra)
    try:
        factors = envs.compile_factors()
    finally:
        for k in extra:
            os.environ.pop(k)
    return factors, hash_factors(factors)


def differing(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


before = [key_under(h) for h in homes]
from turingbox_plugin.vllm_fixes import fix_compile_key_locations  # noqa: E402

applied, applied_again = fix_compile_key_locations(), fix_compile_key_locations()
after = [key_under(h) for h in homes]
partition = key_under(homes[0], VLLM_PP_LAYER_PARTITION="32,32")    # changes the graph: must stay in the key
# vLLM's two callers look the function up on the module when they hash, so the patched one is what they call.
from vllm.compilation import backends, caching  # noqa: E402

callers = [m.__name__ for m in (backends, caching) if "envs.compile_factors()" in inspect.getsource(m)]
print(json.dumps({
    "differing_before": differing(before[0][0], before[1][0]),
    "same_hash_before": before[0][1] == before[1][1],
    "applied": applied, "applied_again": applied_again,
    "differing_after": differing(after[0][0], after[1][0]),
    "same_hash_after": after[0][1] == after[1][1],
    "factors_dropped": sorted(set(before[0][0]) - set(after[0][0])),
    "partition_changes_hash": partition[1] != after[0][1],
    "callers_use_module_attribute": callers,
}))
