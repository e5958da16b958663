#!/usr/bin/env python3
"""Stand-in engine for seeding tests: fills the caches it is pointed at, then becomes fake vLLM.

Like a real vLLM start, it writes compiled artefacts into the directories named by the cache
environment (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, ...), so a test sees whether warmup handed the
engine the entry's directories and whether the completed manifest indexes what the engine wrote.
Then it exec()s tests/support/fake_vllm.py with the same argv (same pid: serve's supervisor and
signals see one process).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_VLLM = os.path.join(HERE, "fake_vllm.py")

ARTEFACTS = {
    "TRITON_CACHE_DIR": ("KERNELHASH/_zero_kv_blocks_kernel.cubin", b"\x7fELF" + b"\0" * 252),
    "VLLM_CACHE_ROOT": ("torch_compile_cache/abc123/rank_0_0/backbone/artifact_shape_None_subgraph_0", b"G" * 512),
    "TORCHINDUCTOR_CACHE_DIR": ("fxgraph/xy/entry", b"I" * 128),
}


def flashinfer_sampling_module() -> str | None:
    """FlashInfer's first use of its sampling module, as flashinfer/jit (0.6.8) finds it: the prebuilt module of an
    installed flashinfer-jit-cache package first, then the JIT workspace (FLASHINFER_WORKSPACE_BASE, else HOME), and an
    nvcc build into that workspace when neither has it. Only when FAKE_FLASHINFER_ARCH names the arch folder (90a):
    the stand-in then leaves on disk what a real start leaves. Its line about it is the stand-in's own: a real vLLM log
    says nothing of the build (FlashInfer logs through its own logger), so the bench counts modules on disk."""
    arch = os.environ.get("FAKE_FLASHINFER_ARCH")
    if not arch:
        return None
    try:
        import flashinfer_jit_cache
        prebuilt = os.path.join(flashinfer_jit_cache.get_jit_cache_dir(), "sampling", "sampling.so")
        if os.path.exists(prebuilt):
            return f"prebuilt {prebuilt}"
    except ImportError:
        pass
    workspace = os.environ.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~")
    module = os.path.join(workspace, ".cache", "flashinfer", os.environ.get("FAKE_FLASHINFER_VERSION", "0.6.8.post1"),
                          arch, "cached_ops", "sampling")
    if os.path.exists(os.path.join(module, "sampling.so")):
        return f"loaded {module}"
    os.makedirs(module, exist_ok=True)
    with open(os.path.join(module, "build.ninja"), "w") as f:
        f.write("build sampling.so: link sampling.cuda.o\n")
    with open(os.path.join(module, "sampling.so"), "wb") as f:
        f.write(b"\x7fELF" + b"\0" * 60)
    return f"built {module}"


def main() -> None:
    written, found = {}, []
    for var, (rel, data) in ARTEFACTS.items():
        base = os.environ.get(var)
        if not base and var == "VLLM_CACHE_ROOT":    # vLLM's default: a plain `vllm serve` caches under HOME
            base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
        if not base:
            continue
        path = os.path.join(base, rel)
        if os.path.exists(path):
            found.append(var)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        written[var] = path
    # The autotune result FLA would persist when TRITON_CACHE_AUTOTUNING=1 reaches the engine.
    if os.environ.get("TRITON_CACHE_AUTOTUNING") == "1" and os.environ.get("TRITON_CACHE_DIR"):
        with open(os.path.join(os.environ["TRITON_CACHE_DIR"], "KERNELHASH", "chunk_fwd.autotune.json"), "w") as f:
            json.dump({"key": [1], "configs_timings": [[{"num_warps": 4}, [0.1]]]}, f)
    # vLLM compiles its graphs when its compile cache holds none, and loads them otherwise
    if "VLLM_CACHE_ROOT" in written:
        os.environ["FAKE_VLLM_GRAPHS"] = "loaded" if "VLLM_CACHE_ROOT" in found else "compiled"
        # ENGINE_FAIL_WHEN_LOADED=<stage>: only a start that loads its graphs fails there (a seed's second start)
        if os.environ.get("ENGINE_FAIL_WHEN_LOADED") and "VLLM_CACHE_ROOT" in found:
            os.environ["FAKE_VLLM_FAIL_AT"] = os.environ["ENGINE_FAIL_WHEN_LOADED"]
    sampling = flashinfer_sampling_module()
    print(f"engine_filling_caches: HOME {os.environ.get('HOME')}, found {json.dumps(sorted(found))}", flush=True)
    if sampling:
        print(f"engine_filling_caches: FlashInfer sampling module {sampling}", flush=True)
    print(f"engine_filling_caches: wrote {json.dumps(written, sort_keys=True)}", flush=True)
    os.execv(sys.executable, [sys.executable, FAKE_VLLM, *sys.argv[1:]])


if __name__ == "__main__":
    main()
