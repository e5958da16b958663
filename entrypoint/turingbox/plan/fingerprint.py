"""The plan's fingerprint: everything of a plan that changes compiled code, hashed to one `cache_key`
(`Plan.fingerprinted` fills a plan's `cache_inputs` and `cache_key`, `Plan.compute_hash` hashes them again;
cache/ keeps one entry per key).

Pure functions of their inputs; `software_versions()` reads package metadata only (it never
imports torch or vLLM, so it is cheap and initialises no CUDA).
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from typing import Any, Mapping

# Packages whose versions change generated code.
SOFTWARE = ("vllm", "torch", "triton", "flashinfer-python", "turingbox-plugin")

# Plan fields that reach kernels (shapes, specialisations, graphs). Context length and memory
# utilisation are deliberately absent: they change block counts, not compiled code.
KERNEL_PLAN_FIELDS = (
    "tensor_parallel_size",
    "num_speculative_tokens",
    "dtype",
    "kv_cache_dtype",
    "attention_backend",
    "gdn_prefill_backend",
    "gdn_path",
    "quantization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "cudagraph_capture_sizes",
    "enforce_eager",
)


# Raised when what an entry holds for the same inputs changes: vLLM would look for its compiled code in another
# folder of the entry, so the old entry would be a hit that recompiles. 2 (session 11): the plugin's
# compile_key_locations fix changed vLLM's compile folder names, and text-only plans run --language-model-only.
KEY_REVISION = 2


def software_versions() -> dict[str, str]:
    out = {}
    for name in SOFTWARE:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def fingerprint_inputs(plan_fields: Mapping[str, Any], gpu_name: str, compute_capability: str,
                       software: Mapping[str, str], model_config_hash: str) -> dict[str, Any]:
    """The exact, JSON-able inputs of the key (also stored in the entry's manifest)."""
    return {
        "revision": KEY_REVISION,
        "software": {k: software.get(k, "absent") for k in SOFTWARE},
        "gpu_name": gpu_name,
        "compute_capability": compute_capability,
        "plan": {k: plan_fields.get(k) for k in KERNEL_PLAN_FIELDS},
        "model_config_hash": model_config_hash,
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the inputs that differ between two fingerprints (for miss logs)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        name = f"{prefix}{k}"
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out.extend(differences(va, vb, name + "."))
        elif va != vb:
            out.append(f"{name}: {va!r} != {vb!r}")
    return out
