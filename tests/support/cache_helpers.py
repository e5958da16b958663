"""Helpers of the cache tests: plans whose fingerprints we control, turingbox's temporaries, a Python child."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

from turingbox.plan import fingerprint

SOFTWARE = {"vllm": "0.21.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
            "flashinfer-python": "0.6.8.post1", "turingbox-plugin": "0.1.0"}
PLAN = {"tensor_parallel_size": 1, "num_speculative_tokens": 3, "dtype": "float16", "kv_cache_dtype": "fp8",
        "attention_backend": "FLASHINFER", "gdn_prefill_backend": "triton", "gdn_path": "turbo",
        "quantization": "awq_marlin", "max_num_seqs": 16, "max_num_batched_tokens": 4096,
        "cudagraph_capture_sizes": [1, 2, 4, 8, 16], "enforce_eager": False,
        "max_model_len": 32768, "gpu_memory_utilization": 0.9}


def make_plan(**overrides):
    fields = {**PLAN, **overrides}
    inputs = fingerprint.fingerprint_inputs(fields, fields.pop("gpu_name", "NVIDIA GeForce RTX 2080 Ti"),
                                            fields.pop("compute_capability", "7.5"),
                                            fields.pop("software", SOFTWARE),
                                            fields.pop("model_config_hash", "cfg0"))
    return {**fields, "cache_inputs": inputs, "cache_key": fingerprint.cache_key(inputs)}


def turingbox_temporaries(tmpdir: str) -> list[str]:
    """What turingbox made with mkdtemp under tmpdir (private/cold cache copies, runtime dirs)."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(tmpdir, "turingbox-*")))


def run_py(code: str, *args: str, env=None, timeout=60, **kw) -> subprocess.CompletedProcess:
    """A real Python subprocess (its own interpreter, locks and pid)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, **kw)
