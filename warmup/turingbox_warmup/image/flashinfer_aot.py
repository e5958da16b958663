"""FlashInfer's JIT modules for turingbox's plans: derived from source, built without a GPU, checked, seeded.

    python -m turingbox_warmup.image.flashinfer_aot derive  [--vllm-src DIR] [--flashinfer-src DIR] [--out FILE]
    python -m turingbox_warmup.image.flashinfer_aot list    [--arch 7.5] [--variants default|all] [--plan-json FILE]
    python -m turingbox_warmup.image.flashinfer_aot build   --arch 7.5[,8.6] --out DIR [--build-dir DIR] [--plan-json FILE]
                                                      [--variants default|all] [--only URI ...] [--jobs N]
    python -m turingbox_warmup.image.flashinfer_aot check   --arch 7.5 [--dir DIR] [--json]
    python -m turingbox_warmup.image.flashinfer_aot install --from DIR --workspace-base DIR

What vLLM 0.21 asks FlashInfer 0.6.8.post1 for (read from their source; `derive` re-reads it, and
tests/turingbox_warmup/image/test_flashinfer_specs.py fails when either drifts):

  * attention (plans with --attention-backend FLASHINFER, no context parallelism, no TRTLLM below sm_100):
    `FlashInferMetadataBuilder._get_prefill_wrapper` makes a `BatchPrefillWithPagedKVCacheWrapper(backend="auto")`
    and plans it with q = o = the model dtype, kv = `FlashInferBackend.get_dtype_for_flashinfer(kv_cache_dtype)`
    (fp8 -> float8_e4m3fn), the model's head_dim, pos_encoding_mode NONE, window_left -1, no logits soft cap.
    Its decode wrapper is a `BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend="auto")`, which
    FlashInfer serves with the *batch prefill* module too. `determine_attention_backend` picks fa2 everywhere
    below sm_90, and on sm_90 too for a 16-bit q with an fp8 KV cache (fa3 needs an fp8 q then). So every
    plan needs ONE attention module, `gen_batch_prefill_module("fa2", q, kv, o, int32, D, D, 0, False, False,
    False)`: a single .so holding plan, paged_run and ragged_run (ragged is only called under DCP). The page
    size (vLLM's kernel block size) and head counts are run-time arguments, not part of the module.
  * sampling (every CUDA plan on sm_75..sm_121, whatever the attention backend): `TopKTopPSampler` uses
    FlashInfer's top-k/top-p sampler (`VLLM_USE_FLASHINFER_SAMPLER` defaults to on), and vLLM's dummy sampler
    run at startup calls it with top_p 0.9 and top_k: the `sampling` module is JIT-built at every cold start.

Where FlashInfer looks at run time (flashinfer/jit/env.py, core.py): `FLASHINFER_WORKSPACE_BASE` (read once at
import; turingbox points it at `<entry>/flashinfer`) -> `<base>/.cache/flashinfer/<version>/<archs>/cached_ops/
<uri>/<uri>.so`, `<archs>` being the sorted compute capabilities of the visible GPUs (`75`, `86`, `90a`). Before
loading, `JitSpec.build_and_load` runs `ninja -C <that dir> -f build.ninja` (it writes build.ninja only when
none exists). FlashInfer's own build.ninja names absolute paths of the build directory, so a module built
elsewhere and copied into an entry would make ninja rebuild it (command lines changed, no deps logged): nvcc
at start. The baked layout therefore holds, per module, `<uri>.so` and a build.ninja of ours that declares
that file prebuilt (a phony edge, no command): ninja has nothing to run, FlashInfer loads the .so. The version
and arch in the path keep a baked module from ever being used by another FlashInfer or GPU kind.

The build runs FlashInfer's own generators and `JitSpec.build()` (ninja + nvcc) in a child process with
FLASHINFER_CUDA_ARCH_LIST / FLASHINFER_WORKSPACE_BASE / CUDA_HOME set, so no GPU is needed; libcuda is linked
against a stub when no driver is installed (the .so resolves the real one when loaded).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable, Mapping, Sequence

from turingbox import config
from turingbox.cache.flashinfer_prebuilt import MARKER, prebuilt_modules, seed_workspace
from turingbox.config import envs
from turingbox.errors import UsageError
from turingbox.model import demo
from turingbox.plan.from_settings import plan_from_settings
from turingbox.plan.types import Plan
# The baked layout's marker and the copy into a cache entry are the cache's (serve seeds new entries with them).
from turingbox_warmup.image.aot_specs.derive import (  # one definition (installed, TURINGBOX_VLLM_SRC, .cache)
    default_vllm_src
)

FLASHINFER_VERSION = "0.6.8.post1"
VLLM_VERSION = "0.21.0"
HERE = os.path.dirname(os.path.abspath(__file__))
# where `make test-setup` unpacks FlashInfer's and vLLM's sources: .cache/ of the checkout this file is in
CHECKOUT_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), ".cache")
SPECS_DIR = os.path.join(HERE, "aot_specs")
SPEC_FILE = os.path.join(SPECS_DIR, f"flashinfer-{FLASHINFER_VERSION}.jsonl")
DEFAULT_AOT_DIR = "/opt/turingbox/flashinfer-aot"


def aot_dir() -> str:
    """Where the baked modules are: the aot_flashinfer_dir setting (TURINGBOX_AOT_FLASHINFER_DIR), else the image's."""
    return config.resolve(("aot_flashinfer_dir",))["aot_flashinfer_dir"] or DEFAULT_AOT_DIR


# Shared memory, bytes (CUDA programming guide, compute capabilities table): per SM (what FlashInfer's
# dispatch reads, cudaDevAttrMaxSharedMemoryPerMultiprocessor) and the per-block opt-in cap
# (cudaDevAttrMaxSharedMemoryPerBlockOptin, what cudaFuncSetAttribute accepts).
SMEM_PER_SM = {75: 65536, 80: 167936, 86: 102400, 87: 167936, 89: 102400, 90: 233472, 100: 233472,
               103: 233472, 110: 233472, 120: 102400, 121: 102400}
SMEM_OPTIN = {75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448,
              103: 232448, 110: 232448, 120: 101376, 121: 101376}

# vLLM 0.21 FlashInferBackend.supports_compute_capability: 7.5 <= cc <= 12.1 (the sampler uses it too).
MIN_SM, MAX_SM = 75, 121
TORCH_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16"}
# flashinfer/jit/utils.py filename_safe_dtype_map
SAFE_DTYPE = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
              "int32": "i32", "uint8": "u8"}


class FlashInferAotError(Exception):
    """Bad input or a failed build: one sentence."""


# ---- what a plan asks for (pure) ------------------------------------------------------------------------

def sm_of(compute_capability: str | int) -> int:
    if isinstance(compute_capability, int):
        return compute_capability
    text = str(compute_capability).strip().lower().removeprefix("sm_")
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major) * 10 + int(minor.rstrip("af") or 0)
    return int(text.rstrip("af"))


def arch_label(sm: int) -> str:
    return f"{sm // 10}.{sm % 10}"


def workspace_arch_dir(sm: int) -> str:
    """FlashInfer's `<archs>` directory for one GPU kind (compilation_context._normalize_cuda_arch, env.py):
    sm_9x gets the `a` suffix, sm_10x/11x `a`, sm_120 `f` (CUDA >= 12.9), sm_121 `a`."""
    major, minor = divmod(sm, 10)
    if major == 9 or major in (10, 11) or (major == 12 and minor != 0):
        return f"{major}{minor}a"
    if major == 12:
        return f"{major}{minor}f"
    return f"{major}{minor}"


def flashinfer_kv_dtype(kv_cache_dtype: str, model_dtype: str) -> str:
    """vLLM 0.21 FlashInferMetadataBuilder: a quantized cache goes through get_dtype_for_flashinfer
    (fp8/fp8_e4m3 -> float8_e4m3fn, fp8_e5m2 -> float8_e5m2); otherwise the cache has the model dtype."""
    kv = (kv_cache_dtype or "auto").lower()
    if kv in ("fp8", "fp8_e4m3"):
        return "float8_e4m3fn"
    if kv == "fp8_e5m2":
        return "float8_e5m2"
    if kv in ("auto", "float16", "bfloat16", "half"):
        return TORCH_DTYPES.get(kv, TORCH_DTYPES[model_dtype]) if kv != "auto" else TORCH_DTYPES[model_dtype]
    raise FlashInferAotError(f"kv_cache_dtype {kv_cache_dtype!r} has no FlashInfer fa2 module in vLLM {VLLM_VERSION}")


def attention_backend(sm: int, q: str, kv: str, decode: bool) -> str:
    """flashinfer/utils.py determine_attention_backend (prefill wrapper with backend="auto"); the tensor-core
    decode wrapper (decode.py plan) asks it only when q or kv is fp8 and takes fa2 otherwise."""
    fp8 = {"float8_e4m3fn", "float8_e5m2"}
    if decode and not ({q, kv} & fp8):
        return "fa2"
    fa3_ok = not (kv in fp8 and q not in fp8)   # is_fa3_backend_supported: an fp8 KV cache needs an fp8 query
    return "fa3" if sm // 10 == 9 and fa3_ok else "fa2"


def batch_prefill_uri(backend: str, dtype_q: str, dtype_kv: str, dtype_o: str, dtype_idx: str, head_dim_qk: int,
                      head_dim_vo: int,
                      pos_encoding_mode: int = 0, use_sliding_window: bool = False, use_logits_soft_cap: bool = False,
                      use_fp16_qk_reduction: bool = False) -> str:
    """flashinfer/jit/attention/modules.py get_batch_prefill_uri (checked against FlashInfer's own by the tests
    and at build time)."""
    return (f"batch_prefill_with_kv_cache_dtype_q_{SAFE_DTYPE[dtype_q]}_dtype_kv_{SAFE_DTYPE[dtype_kv]}_"
            f"dtype_o_{SAFE_DTYPE[dtype_o]}_dtype_idx_{SAFE_DTYPE[dtype_idx]}_head_dim_qk_{head_dim_qk}_head_dim_vo_{head_dim_vo}_posenc_{pos_encoding_mode}_"
            f"use_swa_{use_sliding_window}_use_logits_cap_{use_logits_soft_cap}_f16qk_{use_fp16_qk_reduction}"
            + ("_sm90" if backend == "fa3" else ""))


def model_attention(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """head_dim, sliding window and logits soft cap of the full-attention layers (vLLM passes window_left
    -1 and no soft cap for Qwen3.5/3.6: their full-attention layers have neither)."""
    text = cfg.get("text_config", cfg)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    window = text.get("sliding_window") if text.get("use_sliding_window") else None
    softcap = text.get("attn_logit_softcapping") or text.get("logits_soft_cap")
    return {"head_dim": head_dim, "sliding_window": bool(window), "logits_soft_cap": bool(softcap)}


def modules_for_plan(plan: Plan, model_cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The FlashInfer JIT modules vLLM 0.21 builds for this plan on its GPU kind."""
    sm = sm_of(plan.compute_capability)
    if not MIN_SM <= sm <= MAX_SM:
        return []
    out: list[dict[str, Any]] = []
    if plan.attention_backend == "FLASHINFER":
        att = model_attention(model_cfg)
        q = o = TORCH_DTYPES[plan.dtype]
        kv = flashinfer_kv_dtype(plan.kv_cache_dtype, plan.dtype)
        roles: dict[str, list[str]] = {}
        for role, decode in (("prefill: BatchPrefillWithPagedKVCacheWrapper(backend=auto).plan, causal", False),
                             ("decode: BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True).plan", True)):
            roles.setdefault(attention_backend(sm, q, kv, decode), []).append(role)
        for backend, why in roles.items():
            args = {"backend": backend, "dtype_q": q, "dtype_kv": kv, "dtype_o": o, "dtype_idx": "int32",
                    "head_dim_qk": att["head_dim"], "head_dim_vo": att["head_dim"], "pos_encoding_mode": 0,
                    "use_sliding_window": att["sliding_window"], "use_logits_soft_cap": att["logits_soft_cap"],
                    "use_fp16_qk_reduction": False}
            out.append({"module": "batch_prefill", "generator": "flashinfer.jit.attention.modules:gen_batch_prefill_module",
                        "uri": batch_prefill_uri(**args), "args": args, "requested_by": why})
    out.append({"module": "sampling", "generator": "flashinfer.jit.sampling:gen_sampling_module", "uri": "sampling",
                "args": {}, "requested_by": ["TopKTopPSampler.forward_cuda -> flashinfer.sampling (vLLM's dummy sampler "
                                             "run at startup: top_p 0.9, top_k)"]})
    for rec in out:
        rec.update(arch=arch_label(sm), workspace_arch=workspace_arch_dir(sm))
    return out


# ---- derivation over the image's plans ----------------------------------------------------------------------

# GPU kinds without a fixture whose plans pick FLASHINFER (sm_80/86/89), as `turingbox plan` sees them.
SYNTHETIC_GPUS = {
    "1xa100-80g": [{"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_total_mib": 81920,
                    "memory_free_mib": 81000}],
    "1x3090": [{"name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6", "memory_total_mib": 24576,
                "memory_free_mib": 24000}],
    "1x4090": [{"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "memory_total_mib": 24564,
                "memory_free_mib": 24000}],
}
# (variant, TURINGBOX_* settings): "default" is what the image bakes; the others are the documented overrides.
VARIANTS = (
    ("default", {}),
    ("kv_cache_dtype=auto", {"TURINGBOX_KV_CACHE_DTYPE": "auto"}),
    ("kv_cache_dtype=fp8_e5m2", {"TURINGBOX_KV_CACHE_DTYPE": "fp8_e5m2"}),
)
# The H200 run of bench/gpu/flashinfer_baked_check.sh (FlashInfer forced on sm_90).
SM90_FLASHINFER = ("attention_backend=FLASHINFER,dtype=bfloat16",
                   {"TURINGBOX_ATTENTION_BACKEND": "FLASHINFER", "TURINGBOX_DTYPE": "bfloat16"})


def _inventory(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, g in enumerate(gpus):
        uuid = "GPU-" + hashlib.sha256(f"{g['name']}/{i}".encode()).hexdigest()[:12]
        out.append({"index": i, "uuid": uuid, "pci_bus_id": f"00000000:{i + 1:02X}:00.0", **g})
    return out


def _plan(gpus_json: str, settings: Mapping[str, str]) -> Plan:
    # environ: image build: plans from the given settings alone, the host's TURINGBOX_* left out
    env = {k: v for k, v in envs.process_environment().items() if not k.startswith("TURINGBOX_")}
    env.update(settings)
    env["TURINGBOX_GPUS_JSON"] = gpus_json
    loaded = config.load(None, env, groups=("plan", "demo"))
    return plan_from_settings(loaded.plan, loaded.demo, write_demo=False, environ=env)


def plan_cases(fixtures_dir: str) -> Iterable[tuple[str, str, dict[str, str], str]]:
    """(case name, inventory JSON path, settings, variant) for every plan the derivation covers."""
    work = tempfile.mkdtemp(prefix="turingbox-fi-derive-")
    try:
        for name in sorted(os.listdir(fixtures_dir)):
            if name.endswith(".json"):
                for variant, settings in VARIANTS:
                    yield name[:-5], os.path.join(fixtures_dir, name), settings, variant
        for name, gpus in SYNTHETIC_GPUS.items():
            path = os.path.join(work, name + ".json")
            with open(path, "w") as f:
                json.dump(_inventory(gpus), f)
            for variant, settings in VARIANTS:
                yield name, path, settings, variant
        for name in ("1xh200", "2xh200"):
            yield name, os.path.join(fixtures_dir, name + ".json"), SM90_FLASHINFER[1], SM90_FLASHINFER[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def demo_model_config() -> dict[str, Any]:
    cfg = demo.make_config(awq=False)
    assert model_attention(cfg) == model_attention(demo.make_config(awq=True))  # AWQ keeps the attention shape
    return cfg


def collect(fixtures_dir: str) -> tuple[dict[str, dict], list[dict[str, Any]]]:
    """({case: plan summary}, records), each record once per (uri, arch) with the cases that need it."""
    cfg = demo_model_config()
    plans: dict[str, dict] = {}
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for case, path, settings, variant in plan_cases(fixtures_dir):
        try:
            plan = _plan(path, settings)
        except UsageError:        # PlanError included: an inventory the image refuses (V100, empty, ...)
            continue
        label = case if variant == "default" else f"{case}[{variant}]"
        plans[label] = {k: getattr(plan, k) for k in ("gpu_name", "compute_capability", "tensor_parallel_size",
                                                      "attention_backend", "dtype", "kv_cache_dtype")}
        plans[label]["kernel_block_size"] = kernel_block_size(plan)
        plans[label]["variant"] = variant
        for rec in modules_for_plan(plan, cfg):
            key = (rec["uri"], rec["arch"])
            have = by_key.setdefault(key, {**rec, "variants": [], "plans": [], "page_sizes": []})
            if label not in have["plans"]:
                have["plans"].append(label)
            if variant not in have["variants"]:
                have["variants"].append(variant)
            if rec["module"] == "batch_prefill" and plans[label]["kernel_block_size"] not in have["page_sizes"]:
                have["page_sizes"].append(plans[label]["kernel_block_size"])
    records = sorted(by_key.values(), key=lambda r: (sm_of(r["arch"]), r["module"], r["uri"]))
    for r in records:
        r["page_sizes"].sort()
        r["default"] = "default" in r["variants"]
        if r["module"] != "batch_prefill":
            r.pop("page_sizes")
    return plans, records


def kernel_block_size(plan: Plan) -> int:
    """The page size FlashInfer is planned with: vLLM's attention kernel block size, the largest of the
    backend's [16, 32, 64] dividing the hybrid block size (aot_specs/derive.py kv_layout)."""
    block = plan.memory.block_size
    return next(s for s in (64, 32, 16) if block % s == 0)


# The source each derived fact comes from: (file under the package root, qualified function or class.method).
VLLM_EVIDENCE = (
    ("v1/attention/backends/flashinfer.py", "FlashInferBackend.get_dtype_for_flashinfer"),
    ("v1/attention/backends/flashinfer.py", "FlashInferBackend.supports_compute_capability"),
    ("v1/attention/backends/flashinfer.py", "FlashInferBackend.get_supported_head_sizes"),
    ("v1/attention/backends/flashinfer.py", "FlashInferMetadataBuilder.__init__"),
    ("v1/attention/backends/flashinfer.py", "FlashInferMetadataBuilder._get_prefill_wrapper"),
    ("v1/attention/backends/flashinfer.py", "FlashInferMetadataBuilder._get_decode_wrapper"),
    ("v1/attention/backends/flashinfer.py", "FlashInferMetadataBuilder.build"),
    ("v1/attention/backends/flashinfer.py", "fast_plan_decode"),
    ("utils/flashinfer.py", "supports_trtllm_attention"),
    ("v1/sample/ops/topk_topp_sampler.py", "TopKTopPSampler.__init__"),
    ("v1/sample/ops/topk_topp_sampler.py", "flashinfer_sample"),
    ("v1/worker/gpu_model_runner.py", "GPUModelRunner._dummy_sampler_run"),
)
FLASHINFER_EVIDENCE = (
    ("jit/attention/modules.py", "get_batch_prefill_uri"),
    ("jit/attention/modules.py", "gen_batch_prefill_module"),
    ("jit/sampling.py", "gen_sampling_module"),
    ("prefill.py", "BatchPrefillWithPagedKVCacheWrapper.plan"),
    ("decode.py", "BatchDecodeWithPagedKVCacheWrapper.plan"),
    ("utils.py", "determine_attention_backend"),
    ("utils.py", "is_fa3_backend_supported"),
    ("compilation_context.py", "CompilationContext._normalize_cuda_arch"),
    ("jit/env.py", None),
    ("jit/core.py", "JitSpec.build_and_load"),
    ("jit/core.py", "JitSpec.build"),
)


def source_of(path: str, qualname: str | None) -> str:
    """The exact source text of a top-level function/class method (or the whole file)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if qualname is None:
        return text
    tree = ast.parse(text, filename=path)
    node: Any = tree
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                              ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise FlashInferAotError(f"{path} defines no {qualname}")
    import textwrap
    return textwrap.dedent(ast.get_source_segment(text, node, padded=True) or "")


def evidence(root: str, items: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    return {f"{rel}:{qual or '*'}": hashlib.sha256(source_of(os.path.join(root, rel), qual).encode()).hexdigest()[:16]
            for rel, qual in items}


def read_vllm_facts(vllm_src: str) -> dict[str, Any]:
    """The literal facts modules_for_plan relies on, read from vLLM's source (fails loudly when they change)."""
    fi = os.path.join(vllm_src, "v1", "attention", "backends", "flashinfer.py")
    facts: dict[str, Any] = {}
    ns: dict[str, Any] = {}
    import torch
    code = source_of(fi, "FlashInferBackend.get_dtype_for_flashinfer")
    exec(compile("import torch\n" + code, fi, "exec"), ns)  # noqa: S102
    facts["kv_dtypes"] = {k: str(ns["get_dtype_for_flashinfer"](k)).removeprefix("torch.")
                          for k in ("fp8", "fp8_e4m3", "fp8_e5m2")}
    decode = source_of(fi, "FlashInferMetadataBuilder._get_decode_wrapper")
    prefill = source_of(fi, "FlashInferMetadataBuilder._get_prefill_wrapper")
    build = source_of(fi, "FlashInferMetadataBuilder.build")
    facts["decode_use_tensor_cores"] = bool(re.search(r"use_tensor_cores=True", decode))
    facts["wrappers_backend_auto"] = all('"trtllm-gen" if self.is_kvcache_nvfp4 else "auto"' in s
                                         for s in (decode, prefill))
    facts["decode_pos_encoding_mode"] = re.search(r'pos_encoding_mode="(\w+)"', build).group(1)
    facts["prefill_causal"] = "causal=True" in build
    facts["prefill_o_dtype_model"] = "self.model_config.dtype" in build
    caps = source_of(fi, "FlashInferBackend.supports_compute_capability")
    facts["compute_capability_range"] = [list(map(int, m)) for m in re.findall(r"DeviceCapability\(\s*(\d+),\s*(\d+)\s*\)", caps)]
    heads = source_of(fi, "FlashInferBackend.get_supported_head_sizes")
    facts["head_sizes"] = ast.literal_eval(re.search(r"return (\[[^\]]*\])", heads).group(1))
    trt = source_of(os.path.join(vllm_src, "utils", "flashinfer.py"), "supports_trtllm_attention")
    facts["trtllm_family"] = int(re.search(r"is_device_capability_family\((\d+)\)", trt).group(1))
    dummy = source_of(os.path.join(vllm_src, "v1", "worker", "gpu_model_runner.py"), "GPUModelRunner._dummy_sampler_run")
    facts["dummy_sampler_top_p_top_k"] = "top_p=dummy_tensors(" in dummy and "top_k=dummy_tensors(" in dummy
    with open(os.path.join(vllm_src, "envs.py"), encoding="utf-8") as f:
        envs = f.read()
    m = re.search(r'"VLLM_USE_FLASHINFER_SAMPLER": lambda: \((.*?)\),\n', envs, re.S)
    facts["flashinfer_sampler_default_on"] = bool(m and m.group(1).rstrip().endswith("else True"))
    del torch
    return facts


# What modules_for_plan assumes of vLLM; derive() refuses to write a file when the source says otherwise.
EXPECTED_VLLM_FACTS = {
    "kv_dtypes": {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"},
    "decode_use_tensor_cores": True, "wrappers_backend_auto": True, "decode_pos_encoding_mode": "NONE",
    "prefill_causal": True, "prefill_o_dtype_model": True, "compute_capability_range": [[7, 5], [12, 1]],
    "head_sizes": [64, 128, 256], "trtllm_family": 100, "dummy_sampler_top_p_top_k": True,
    "flashinfer_sampler_default_on": True,
}


def derive(vllm_src: str, flashinfer_src: str, fixtures_dir: str) -> list[dict[str, Any]]:
    facts = read_vllm_facts(vllm_src)
    wrong = {k: (facts.get(k), v) for k, v in EXPECTED_VLLM_FACTS.items() if facts.get(k) != v}
    if wrong:
        raise FlashInferAotError("vLLM's FlashInfer call sites changed (read, expected): "
                                 + "; ".join(f"{k}: {a!r} != {b!r}" for k, (a, b) in wrong.items())
                                 + "; update modules_for_plan before re-deriving")
    version = flashinfer_version(flashinfer_src)
    if version != FLASHINFER_VERSION:
        raise FlashInferAotError(f"{flashinfer_src} is FlashInfer {version}, not {FLASHINFER_VERSION}")
    plans, records = collect(fixtures_dir)
    header = {
        "comment": (f"FlashInfer {FLASHINFER_VERSION} JIT modules that vLLM {VLLM_VERSION} requests for turingbox's "
                    "plans (fixture inventories + sm_80/86/89 kinds, default settings and the KV-dtype overrides), "
                    "derived from both sources by `python -m turingbox_warmup.image.flashinfer_aot derive`; `build` compiles "
                    "the `default` records for an arch. Hashes: the vLLM/FlashInfer source the derivation read; a "
                    "change means re-derive and review."),
        "flashinfer_version": FLASHINFER_VERSION, "vllm_version": VLLM_VERSION,
        "vllm_facts": facts,
        "vllm_source_sha256": evidence(vllm_src, VLLM_EVIDENCE),
        "flashinfer_source_sha256": evidence(flashinfer_src, FLASHINFER_EVIDENCE),
        "plans": plans,
    }
    return [header] + records


def flashinfer_version(flashinfer_src: str) -> str:
    with open(os.path.join(flashinfer_src, "_build_meta.py"), encoding="utf-8") as f:
        m = re.search(r'__version__ = "([^"]+)"', f.read())
    return m.group(1) if m else "unknown"


def write_specs(records: Sequence[Mapping[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, sort_keys=False) + "\n")


def load_specs(path: str = SPEC_FILE) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header = next((r for r in lines if "comment" in r), {})
    return header, [r for r in lines if "uri" in r]


def select(records: Iterable[Mapping[str, Any]], arch: str, variants: str = "default",
           only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    sm = sm_of(arch)
    out = [dict(r) for r in records if sm_of(r["arch"]) == sm and (variants == "all" or r.get("default"))
           and (not only or r["uri"] in only or r["module"] in only)]
    return out


# ---- source locations ----------------------------------------------------------------------------------------

def default_flashinfer_src() -> str | None:
    """The flashinfer package directory: TURINGBOX_FLASHINFER_SRC, the installed package, or the copy
    `make test-setup` unpacks (pip --no-deps --target .cache/flashinfer-cpu in the checkout)."""
    # environ: a build/dev tool's source path (documented in test_settings_names), not a setting
    env = envs.flashinfer_src()
    if env:
        return env
    import importlib.util
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    cpu = os.path.join(CHECKOUT_CACHE, "flashinfer-cpu", "flashinfer")
    return cpu if os.path.isdir(cpu) else None


def find_cuda_home() -> str | None:
    """CUDA_HOME, the directory above `nvcc` on PATH, /usr/local/cuda, or the nvidia-cuda-nvcc wheel."""
    # environ: the CUDA toolkit's own variables (image build time)
    for cand in envs.cuda_homes():
        if cand and os.path.isfile(os.path.join(cand, "bin", "nvcc")):
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = os.path.realpath(nvcc)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(real, encoding="utf-8") as f:      # a shell shim `exec /path/nvcc "$@"`
                m = re.search(r'exec\s+(\S+/bin/nvcc)', f.read(256))
            if m:
                real = m.group(1)
        return os.path.dirname(os.path.dirname(real))
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    try:
        import nvidia
        for base in nvidia.__path__:
            for sub in ("cu13", "cuda_nvcc"):
                if os.path.isfile(os.path.join(base, sub, "bin", "nvcc")):
                    return os.path.join(base, sub)
    except ImportError:
        pass
    return None


def find_tool(name: str, cuda_home: str | None = None) -> str | None:
    for d in filter(None, (cuda_home and os.path.join(cuda_home, "bin"),)):
        if os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia
        for base in nvidia.__path__:
            for sub in ("cu13", "cuda_cuobjdump", "cuda_nvcc"):
                path = os.path.join(base, sub, "bin", name)
                if os.path.isfile(path):
                    return path
    except ImportError:
        pass
    return None


def extra_include_dirs(cuda_home: str) -> list[str]:
    """Header directories FlashInfer's modules need that the toolkit lacks: curand.h (sampling.cuh) ships in
    the nvidia-curand wheel (a torch dependency, so the image's venv has it) when the toolkit is nvcc wheels
    or a copy without the math libraries; TURINGBOX_CUDA_EXTRA_INCLUDE adds more (os.pathsep-separated)."""
    # environ: a build tool's header path (documented in test_settings_names), not a setting
    dirs = envs.cuda_extra_include()
    if not os.path.isfile(os.path.join(cuda_home, "include", "curand.h")):
        try:
            import nvidia
            dirs += [os.path.join(b, "cu13", "include") for b in nvidia.__path__
                     if os.path.isfile(os.path.join(b, "cu13", "include", "curand.h"))]
        except ImportError:
            pass
    return list(dict.fromkeys(dirs))


@contextlib.contextmanager
def libcuda_dir():
    """A directory to link -lcuda against: the toolkit's stubs, or a stub with the soname libcuda.so.1."""
    home = find_cuda_home()
    for d in filter(None, (home and os.path.join(home, "lib64", "stubs"), home and os.path.join(home, "lib", "stubs"))):
        if os.path.isfile(os.path.join(d, "libcuda.so")):
            yield d
            return
    with tempfile.TemporaryDirectory(prefix="turingbox-libcuda-stub-") as tmp:
        for lib in filter(None, (home and os.path.join(home, "lib"), home and os.path.join(home, "lib64"))):
            versioned = sorted(n for n in os.listdir(lib) if n.startswith("libcudart.so.")) if os.path.isdir(lib) else []
            if versioned and not os.path.exists(os.path.join(lib, "libcudart.so")):
                os.symlink(os.path.join(lib, versioned[0]), os.path.join(tmp, "libcudart.so"))   # -lcudart
                break
        with open(os.path.join(tmp, "stub.c"), "w") as f:
            f.write("int turingbox_libcuda_stub;\n")
        # environ: the build host's C compiler (image build time)
        subprocess.check_call([envs.c_compiler(), "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                               os.path.join(tmp, "libcuda.so"), os.path.join(tmp, "stub.c")])
        yield tmp


# ---- the baked layout ----------------------------------------------------------------------------------------

def module_dir(base: str, arch_dir: str, uri: str, version: str = FLASHINFER_VERSION) -> str:
    return os.path.join(base, ".cache", "flashinfer", version, arch_dir, "cached_ops", uri)


PREBUILT_NINJA = """# Written by turingbox_warmup.image.flashinfer_aot: {uri}.so was built ahead of time (FlashInfer {version}, {arch_dir})
# with FlashInfer's own JitSpec.build(). A phony edge has no command, so `ninja` finds nothing to do and FlashInfer
# loads the file. Delete this directory to let FlashInfer JIT-build the module again.
ninja_required_version = 1.3
build {uri}.so: phony
default {uri}.so
"""


def export_module(build_base: str, out_base: str, rec: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    """Copy a built module into the baked layout: <uri>.so, a prebuilt build.ninja and a marker (atomically)."""
    uri, arch_dir = rec["uri"], rec["workspace_arch"]
    src = os.path.join(module_dir(build_base, arch_dir, uri), f"{uri}.so")
    dst = module_dir(out_base, arch_dir, uri)
    tmp = dst + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copy2(src, os.path.join(tmp, f"{uri}.so"))
    with open(os.path.join(tmp, "build.ninja"), "w") as f:
        f.write(PREBUILT_NINJA.format(uri=uri, version=FLASHINFER_VERSION, arch_dir=arch_dir))
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({**{k: rec[k] for k in ("module", "uri", "arch", "workspace_arch", "args", "generator")},
                   "flashinfer_version": FLASHINFER_VERSION, **extra}, f, indent=2, sort_keys=True)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.replace(tmp, dst)
    return dst


def relocatable_ninja(module_path: str) -> str | None:
    """For a FlashInfer module directory JIT-built in a cache entry (`.../cached_ops/<uri>/` with `<uri>.so`): the
    prebuilt build.ninja to ship instead of FlashInfer's, whose absolute paths name the directory it was built
    in (an entry baked from a seed made elsewhere would be rebuilt at start). None for anything else."""
    parts = os.path.normpath(module_path).split(os.sep)
    if len(parts) < 5 or parts[-2] != "cached_ops" or parts[-6:-4] != [".cache", "flashinfer"]:
        return None
    uri = parts[-1]
    if not os.path.isfile(os.path.join(module_path, f"{uri}.so")):
        return None
    return PREBUILT_NINJA.format(uri=uri, version=parts[-4], arch_dir=parts[-3])


# ---- build (child process: the environment must be set before flashinfer is imported) ------------------------

_CHILD = r"""
import importlib, json, sys, time
import torch
recs = json.loads(sys.argv[1])
verbose = sys.argv[2] == "1"
for rec in recs:
    mod_name, fn_name = rec["generator"].split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    args = dict(rec["args"])
    for k, v in list(args.items()):
        if k.startswith("dtype_"):
            args[k] = getattr(torch, v)
    spec = fn(**args)
    if spec.name != rec["uri"]:
        print(json.dumps({"uri": rec["uri"], "error": f"FlashInfer names this module {spec.name}"}), flush=True)
        sys.exit(3)
    t = time.time()
    spec.build(verbose)
    print(json.dumps({"uri": rec["uri"], "seconds": round(time.time() - t, 1),
                      "so": str(spec.jit_library_path)}), flush=True)
"""


def build_env(arch: str, build_base: str, cuda_home: str, jobs: int | None, stub_dir: str | None,
              flashinfer_src: str | None = None) -> dict[str, str]:
    # environ: the FlashInfer build's subprocess environment (image build time)
    env = dict(envs.process_environment())
    env.update(FLASHINFER_CUDA_ARCH_LIST=arch_label(sm_of(arch)), FLASHINFER_WORKSPACE_BASE=build_base,
               CUDA_HOME=cuda_home, PATH=os.path.join(cuda_home, "bin") + os.pathsep + env.get("PATH", ""))
    extra = " ".join(f"-isystem {d}" for d in extra_include_dirs(cuda_home))
    env["FLASHINFER_EXTRA_CUDAFLAGS"] = " ".join(filter(None, (env.get("FLASHINFER_EXTRA_CUDAFLAGS", ""),
                                                                "--resource-usage", extra)))
    ld = [env.get("FLASHINFER_EXTRA_LDFLAGS", "")]
    if stub_dir:
        ld.append(f"-L{stub_dir}")
    if not os.path.isdir(os.path.join(cuda_home, "lib64")) and os.path.isdir(os.path.join(cuda_home, "lib")):
        ld.append(f"-L{os.path.join(cuda_home, 'lib')}")          # the nvidia-cuda-* wheels have lib/, no lib64/
    env["FLASHINFER_EXTRA_LDFLAGS"] = " ".join(filter(None, ld))
    if jobs:
        env["MAX_JOBS"] = str(jobs)
    if flashinfer_src:
        env["PYTHONPATH"] = os.path.dirname(flashinfer_src) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FLASHINFER_DISABLE_JIT", None)
    return env


def build(records: Sequence[Mapping[str, Any]], out_base: str, build_base: str | None = None, jobs: int | None = None,
          flashinfer_src: str | None = None, log=print) -> list[dict[str, Any]]:
    """Build `records` (one arch or several) with FlashInfer's JitSpec.build() and export them to out_base."""
    cuda_home = find_cuda_home()
    if not cuda_home:
        raise FlashInferAotError("no nvcc found (CUDA_HOME, PATH, /usr/local/cuda or the nvidia-cuda-nvcc wheel)")
    if flashinfer_src is None:
        import importlib.util
        if importlib.util.find_spec("flashinfer") is None:
            flashinfer_src = default_flashinfer_src()
    results = []
    own_build = build_base is None
    build_base = build_base or tempfile.mkdtemp(prefix="turingbox-fi-build-")
    try:
        with libcuda_dir() as stub:
            by_arch: dict[str, list[Mapping[str, Any]]] = {}
            for rec in records:
                by_arch.setdefault(rec["arch"], []).append(rec)
            for arch, recs in by_arch.items():
                env = build_env(arch, build_base, cuda_home, jobs, stub, flashinfer_src)
                for rec in recs:
                    started = time.time()
                    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([rec]), "1"], env=env,
                                          capture_output=True, text=True)
                    seconds = round(time.time() - started, 1)
                    out = proc.stdout + proc.stderr
                    if proc.returncode != 0:
                        tail = " | ".join(out.strip().splitlines()[-6:])
                        raise FlashInferAotError(f"building {rec['uri']} for sm_{sm_of(arch)} failed: {tail}")
                    usage = parse_ptxas_log(out)
                    path = export_module(build_base, out_base, rec,
                                         {"build_seconds": seconds, "nvcc": nvcc_version(cuda_home),
                                          "ptxas_resource_usage": usage})
                    row = {"uri": rec["uri"], "arch": arch, "seconds": seconds, "path": path}
                    log(json.dumps(row))
                    results.append(row)
    finally:
        if own_build:
            shutil.rmtree(build_base, ignore_errors=True)
    return results


def nvcc_version(cuda_home: str) -> str:
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    return m.group(2) if m else "unknown"


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PTXAS_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas_log(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v / nvcc --resource-usage output -> {mangled kernel: registers, spills, stack, static smem}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = m.group(1)
            out[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0, "static_smem": 0}
            continue
        if current is None:
            continue
        m = _PTXAS_PROPS.search(line)
        if m:
            out[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = _PTXAS_USED.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            if m.group(2):
                out[current]["static_smem"] = int(m.group(2))
    return out


# ---- resource check ------------------------------------------------------------------------------------------

def cta_tiles_q(sm: int, head_dim: int) -> list[int]:
    """include/flashinfer/utils.cuh FA2DetermineCtaTileQ: every CTA_TILE_Q a plan can pick on this arch."""
    tiles = [128] if head_dim < 256 else []
    tiles += [64, 16] if sm >= 80 else [64]         # Turing: "not enough shared memory for 1x4 warp layout"
    return tiles


def dispatch(sm: int, cta_tile_q: int, head_dim: int, q_bytes: int, kv_bytes: int) -> dict[str, int]:
    """include/flashinfer/attention/prefill.cuh (BatchPrefillWith{Paged,Ragged}KVCacheDispatched) on this arch:
    warps, NUM_MMA_Q and the NUM_MMA_KV it picks from the SM's shared memory and the register budget."""
    warps_q = 4 if cta_tile_q > 16 else 1                 # get_num_warps_q
    warps_kv = 4 // warps_q                               # get_num_warps_kv
    mma_q = 2 if cta_tile_q > 64 else 1                   # get_num_mma_q
    per_sm = SMEM_PER_SM[sm]
    q_smem = cta_tile_q * head_dim * q_bytes
    kv_row = 2 * head_dim * 16 * warps_kv * kv_bytes
    ctas = 2 if per_sm >= 2 * (q_smem + kv_row) else 1
    per_block = per_sm // ctas
    max_kv_smem = max(per_block - q_smem, 0) // kv_row
    max_kv_reg = 8 // mma_q                               # no RoPE-llama (vLLM applies RoPE itself)
    want = min(max_kv_smem, max_kv_reg)
    mma_kv = next((n for n in (8, 4, 2, 1) if want >= n), 0)
    return {"cta_tile_q": cta_tile_q, "num_warps_q": warps_q, "num_warps_kv": warps_kv, "num_mma_q": mma_q,
            "num_mma_kv": mma_kv, "cta_tile_kv": mma_kv * warps_kv * 16}


CPP_DTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float8_e4m3fn": "__nv_fp8_e4m3",
             "float8_e5m2": "__nv_fp8_e5m2"}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
# vLLM plans the prefill wrapper causal (MaskMode kCausal = 1) and the tensor-core decode one not (kNone = 0).
MASK_MODES = {"causal": 1, "none": 0}


def attention_launches(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The paged-KV kernels this module launches on rec's arch for vLLM (prefill causal, decode none)."""
    a = rec["args"]
    sm = sm_of(rec["arch"])
    out = []
    for tile in cta_tiles_q(sm, a["head_dim_qk"]):
        d = dispatch(sm, tile, a["head_dim_qk"], DTYPE_BYTES[a["dtype_q"]], DTYPE_BYTES[a["dtype_kv"]])
        for mask, mode in MASK_MODES.items():
            out.append({**d, "mask": mask, "mask_mode": mode})
    return out


_PROBE = """#include <cstdio>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
namespace tbprobe {{
using namespace flashinfer;
{types}
}}
int main() {{
{body}
  return 0;
}}
"""


def probe_source(rec: Mapping[str, Any], launches: Sequence[Mapping[str, Any]]) -> str:
    a = rec["args"]
    q, kv, o = (CPP_DTYPE[a[k]] for k in ("dtype_q", "dtype_kv", "dtype_o"))
    variant = (f"DefaultAttention<false, {str(a['use_sliding_window']).lower()}, "
               f"{str(a['use_logits_soft_cap']).lower()}, false>")
    types, body = [], []
    for i, L in enumerate(launches):
        types.append(f"using KT{i} = KernelTraits<static_cast<MaskMode>({L['mask_mode']}), {L['cta_tile_q']}, "
                     f"{L['num_mma_q']}, {L['num_mma_kv']}, {a['head_dim_qk'] // 16}, {a['head_dim_vo'] // 16}, "
                     f"{L['num_warps_q']}, {L['num_warps_kv']}, PosEncodingMode::kNone, {q}, {kv}, {o}, float, "
                     f"int32_t, {variant}>;")
        body.append(f'  std::printf("{i} %zu %d\\n", sizeof(tbprobe::KT{i}::SharedStorage), '
                    f"(int)tbprobe::KT{i}::IsInvalid());")
    return _PROBE.format(types="\n".join(types), body="\n".join(body))


def kernel_probe_source(rec: Mapping[str, Any], launch: Mapping[str, Any], config_inc: str) -> str:
    """A translation unit instantiating exactly one launched kernel with the module's generated config."""
    a = rec["args"]
    variant = (f"DefaultAttention<false, {str(a['use_sliding_window']).lower()}, "
               f"{str(a['use_logits_soft_cap']).lower()}, false>")
    return (f'#include <flashinfer/attention/prefill.cuh>\n#include <flashinfer/attention/variants.cuh>\n'
            f'#include "{config_inc}"\nnamespace tbprobe {{\nusing namespace flashinfer;\n'
            f"using KT = KernelTraits<static_cast<MaskMode>({launch['mask_mode']}), {launch['cta_tile_q']}, "
            f"{launch['num_mma_q']}, {launch['num_mma_kv']}, HEAD_DIM_QK / 16, HEAD_DIM_VO / 16, "
            f"{launch['num_warps_q']}, {launch['num_warps_kv']}, POS_ENCODING_MODE, DTypeQ, DTypeKV, DTypeO, float, "
            f"IdType, {variant}>;\n"
            f"void* kernel() {{ return (void*)&BatchPrefillWithPagedKVCacheKernel<KT, PagedParams>; }}\n}}\n")


def nvcc_flags(flashinfer_src: str, sm: int) -> list[str]:
    """FlashInfer's gen_jit_spec flags for a non-debug build, and its include directories."""
    import tvm_ffi.libinfo as libinfo  # FlashInfer's headers need tvm-ffi's (a FlashInfer dependency)
    data = os.path.join(flashinfer_src, "data")
    gencode = f"-gencode=arch=compute_{workspace_arch_dir(sm)},code=sm_{workspace_arch_dir(sm)}"
    return ["-std=c++17", "-O3", "-DNDEBUG", "-use_fast_math", "--expt-relaxed-constexpr",
            "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16", "-DFLASHINFER_ENABLE_FP8_E4M3",
            "-DFLASHINFER_ENABLE_FP8_E5M2", "-DFLASHINFER_ENABLE_FP8_E8M0", "-DFLASHINFER_ENABLE_FP4_E2M1",
            gencode, "-I" + os.path.join(data, "include"), "-I" + os.path.join(data, "csrc"),
            "-I" + os.path.join(data, "cutlass", "include"), "-I" + os.path.join(data, "spdlog", "include"),
            "-isystem", libinfo.find_include_path(), "-isystem", libinfo.find_dlpack_include_path()]


def exec_dir() -> str | None:
    """A temporary directory the probe program can run from: /tmp is often mounted noexec (docker --tmpfs)."""
    candidates = [tempfile.gettempdir(), os.path.join(os.path.expanduser("~"), ".cache", "turingbox", "tmp"),
                  os.getcwd()]
    for d in candidates:
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK) and not os.statvfs(d).f_flag & os.ST_NOEXEC:
                return d
        except OSError:
            continue
    return None


def shared_storage_sizes(rec: Mapping[str, Any], launches: Sequence[Mapping[str, Any]], flashinfer_src: str,
                         cuda_home: str, timeout: float = 600) -> list[tuple[int, bool]]:
    """sizeof(KTraits::SharedStorage) (the dynamic shared memory FlashInfer launches with) and IsInvalid(),
    computed by FlashInfer's own headers: a host program compiled with nvcc and run on the CPU."""
    with tempfile.TemporaryDirectory(prefix="turingbox-fi-probe-", dir=exec_dir()) as tmp:
        src = os.path.join(tmp, "probe.cu")
        with open(src, "w") as f:
            f.write(probe_source(rec, launches))
        exe = os.path.join(tmp, "probe")
        cmd = [os.path.join(cuda_home, "bin", "nvcc"), *nvcc_flags(flashinfer_src, sm_of(rec["arch"])), src, "-o", exe]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise FlashInferAotError("the shared-memory probe did not compile: "
                                     + " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:]))
        out = subprocess.run([exe], capture_output=True, text=True, timeout=60).stdout.split("\n")
    sizes = [ln.split() for ln in out if ln.strip()]
    return [(int(s[1]), s[2] != "0") for s in sizes]


def compile_launch(rec: Mapping[str, Any], launch: Mapping[str, Any], flashinfer_src: str, cuda_home: str,
                   timeout: float = 1200) -> dict[str, int]:
    """Compile exactly one launched kernel for rec's arch (FlashInfer's generated config, FlashInfer's flags)
    and return ptxas's resource usage for it."""
    with tempfile.TemporaryDirectory(prefix="turingbox-fi-kernel-") as tmp:
        inc = os.path.join(tmp, "batch_prefill_config.inc")
        with open(inc, "w") as f:
            f.write(render_prefill_config(rec, flashinfer_src))
        src = os.path.join(tmp, "kernel.cu")
        with open(src, "w") as f:
            f.write(kernel_probe_source(rec, launch, "batch_prefill_config.inc"))
        cmd = [os.path.join(cuda_home, "bin", "nvcc"), *nvcc_flags(flashinfer_src, sm_of(rec["arch"])),
               "--resource-usage", "-c", src, "-o", os.path.join(tmp, "kernel.o")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    if r.returncode != 0:
        raise FlashInferAotError("the kernel probe did not compile: "
                                 + " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:]))
    usage = [u for k, u in parse_ptxas_log(r.stdout + r.stderr).items() if "BatchPrefillWithPagedKVCacheKernel" in k]
    if len(usage) != 1:
        raise FlashInferAotError(f"expected one BatchPrefillWithPagedKVCacheKernel from ptxas, found {len(usage)}")
    return usage[0]


def render_prefill_config(rec: Mapping[str, Any], flashinfer_src: str) -> str:
    """batch_prefill_config.inc as FlashInfer's gen_batch_prefill_module renders it (run in a child process
    with a throw-away workspace, so nothing of FlashInfer's is imported here)."""
    with tempfile.TemporaryDirectory(prefix="turingbox-fi-gen-") as tmp:
        env = build_env(rec["arch"], tmp, find_cuda_home() or "/usr/local/cuda", None, None, flashinfer_src)
        code = ("import importlib, json, sys, torch\n"
                "rec = json.loads(sys.argv[1]); m, f = rec['generator'].split(':')\n"
                "args = {k: (getattr(torch, v) if k.startswith('dtype_') else v) for k, v in rec['args'].items()}\n"
                "spec = getattr(importlib.import_module(m), f)(**args)\n"
                "inc = [p for p in spec.sources if p.name.endswith('.cu')][0].parent / 'batch_prefill_config.inc'\n"
                "print(json.dumps({'name': spec.name, 'inc': inc.read_text()}))\n")
        r = subprocess.run([sys.executable, "-c", code, json.dumps(dict(rec))], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise FlashInferAotError("FlashInfer could not generate the module sources: "
                                 + " | ".join(r.stderr.strip().splitlines()[-3:]))
    data = json.loads(r.stdout.strip().splitlines()[-1])
    if data["name"] != rec["uri"]:
        raise FlashInferAotError(f"FlashInfer names the module {data['name']}, the spec says {rec['uri']}")
    return data["inc"]


_CUOBJ_FN = re.compile(r"^\s*Function ([^:\s]+):\s*$")
_CUOBJ_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def parse_cuobjdump_resources(text: str) -> dict[str, dict[str, int]]:
    """cuobjdump --dump-resource-usage -> {mangled function: registers, stack, static smem, local}."""
    out: dict[str, dict[str, int]] = {}
    fn = None
    for line in text.splitlines():
        m = _CUOBJ_FN.match(line)
        if m:
            fn = m.group(1)
            continue
        m = _CUOBJ_RES.search(line)
        if m and fn:
            out[fn] = {"registers": int(m.group(1)), "stack_bytes": int(m.group(2)), "static_smem": int(m.group(3)),
                       "local_bytes": int(m.group(4))}
            fn = None
    return out


_KT = re.compile(r"KernelTraits<\(flashinfer::MaskMode\)(\d+), (\d+)u, (\d+)u, (\d+)u, (\d+)u, (\d+)u, (\d+)u, (\d+)u")


def kernel_config(demangled: str) -> tuple[int, ...] | None:
    """(mask, CTA_TILE_Q, NUM_MMA_Q, NUM_MMA_KV, D_QK/16, D_VO/16, NUM_WARPS_Q, NUM_WARPS_KV) of a prefill kernel."""
    m = _KT.search(demangled)
    return tuple(int(x) for x in m.groups()) if m else None


def demangle(names: Sequence[str]) -> dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, r.stdout.splitlines())) if r.returncode == 0 else {n: n for n in names}


def module_resources(so_path: str, sm: int) -> dict[str, dict[str, int]] | None:
    """Per-kernel resources of the sm_XY code in a built module (None without cuobjdump)."""
    tool = find_tool("cuobjdump", find_cuda_home())
    if not tool:
        return None
    r = subprocess.run([tool, "--dump-resource-usage", f"-arch=sm_{workspace_arch_dir(sm)}", so_path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise FlashInferAotError(f"cuobjdump failed on {so_path}: {r.stderr.strip()[-200:]}")
    return parse_cuobjdump_resources(r.stdout)


def resource_report(arch: str, aot_dir: str | None = None, flashinfer_src: str | None = None,
                    records: Sequence[Mapping[str, Any]] | None = None, compile_kernels: bool = True,
                    variants: str = "default") -> list[dict[str, Any]]:
    """One row per launched kernel of every FlashInfer module for `arch`: static + dynamic shared memory
    against the arch's opt-in limit, registers, spills. Static smem, registers and spills come from the built
    module (cuobjdump on the .so, ptxas's log kept at build) when aot_dir has it, else from compiling exactly
    that kernel (FlashInfer's generated config and flags); dynamic smem is FlashInfer's own
    sizeof(KTraits::SharedStorage), from a probe compiled against the FlashInfer headers in use."""
    sm = sm_of(arch)
    src = flashinfer_src or default_flashinfer_src()
    cuda_home = find_cuda_home()
    if records is None:
        records = select(load_specs()[1], arch, variants)
    limit = SMEM_OPTIN.get(sm)
    built = {(m["uri"], m.get("workspace_arch")): m for m in prebuilt_modules(aot_dir)} \
        if aot_dir and os.path.isdir(aot_dir) else {}
    rows: list[dict[str, Any]] = []
    for rec in records:
        base = {"name": f"flashinfer:{rec['module']}", "uri": rec["uri"], "arch": arch_label(sm), "kind": "flashinfer",
                "shared_limit_bytes": limit}
        prebuilt = built.get((rec["uri"], rec["workspace_arch"]))
        if rec["module"] != "batch_prefill":
            rows.extend(_plain_module_rows(base, prebuilt, sm, limit))
            continue
        launches = attention_launches(rec)
        try:
            if not src or not cuda_home:
                raise FlashInferAotError("needs FlashInfer's headers and nvcc")
            sizes = shared_storage_sizes(rec, launches, src, cuda_home)
        except (FlashInferAotError, OSError, subprocess.TimeoutExpired) as exc:
            rows.append({**base, "ok": False, "error": str(exc)})
            continue
        so_usage = None
        ptxas: dict[str, Any] = {}
        if prebuilt:
            so = os.path.join(prebuilt["path"], f"{rec['uri']}.so")
            res = module_resources(so, sm)
            if res is not None:
                so_usage = {kernel_config(demangle([k])[k]): (k, v) for k, v in res.items()
                            if "BatchPrefillWithPagedKVCacheKernel" in k}
            ptxas = prebuilt.get("ptxas_resource_usage") or {}
        for L, (dyn, invalid) in zip(launches, sizes):
            row = {**base, "name": f"flashinfer:{rec['module']}[paged, {L['mask']}, CTA_TILE_Q={L['cta_tile_q']}, "
                                   f"NUM_MMA_KV={L['num_mma_kv']}]",
                   "launch": L, "shared_dynamic_bytes": dyn, "invalid_config": invalid}
            if L["num_mma_kv"] == 0 or invalid:
                rows.append({**row, "ok": False, "error": "FlashInfer's dispatch finds no valid NUM_MMA_KV here"})
                continue
            key = (L["mask_mode"], L["cta_tile_q"], L["num_mma_q"], L["num_mma_kv"], rec["args"]["head_dim_qk"] // 16,
                   rec["args"]["head_dim_vo"] // 16, L["num_warps_q"], L["num_warps_kv"])
            if dyn > limit:           # fails whatever the static part: no need to compile the kernel
                rows.append({**row, "shared_bytes": dyn, "fits": False, "ok": False,
                             "error": f"needs at least {dyn} bytes of dynamic shared memory "
                                      f"(sizeof(SharedStorage)), sm_{sm} allows {limit}"})
                continue
            try:
                if so_usage is not None and key in so_usage:
                    mangled, usage = so_usage[key]
                    spill = ptxas.get(mangled, {})
                    usage = {**usage, "spill_stores": spill.get("spill_stores"), "spill_loads": spill.get("spill_loads"),
                             "source": "cuobjdump of the built module"}
                elif compile_kernels and src and cuda_home:
                    usage = {**compile_launch(rec, L, src, cuda_home), "source": "ptxas (kernel compiled alone)"}
                else:
                    usage = None
            except (FlashInferAotError, OSError, subprocess.TimeoutExpired) as exc:
                rows.append({**row, "ok": False, "error": str(exc)})
                continue
            static = int(usage["static_smem"]) if usage else 0
            total = static + dyn
            row.update(shared_static_bytes=static if usage else None, shared_bytes=total, fits=total <= limit,
                       ok=total <= limit)
            if usage:
                spills = (usage.get("spill_stores") or 0) + (usage.get("spill_loads") or 0)
                row.update(registers=usage["registers"], stack_bytes=usage.get("stack_bytes"),
                           spills=spills if usage.get("spill_stores") is not None else None,
                           resource_source=usage["source"])
            if not row["ok"]:
                row["error"] = (f"needs {total} bytes of shared memory ({static} static + {dyn} dynamic), "
                                f"sm_{sm} allows {limit}")
            rows.append(row)
    return rows


def _plain_module_rows(base: Mapping[str, Any], prebuilt: Mapping[str, Any] | None, sm: int, limit: int | None):
    """Modules other than attention (sampling): static smem, registers and spills of every kernel in the built
    module; their dynamic shared memory is CUB temp storage of a 1024-thread block (a few KiB), not computed."""
    if not prebuilt:
        return [{**base, "name": f"{base['name']} (not built here: nothing to measure)", "ok": True,
                 "skipped": "not built here (python -m turingbox_warmup.image.flashinfer_aot build --only sampling)"}]
    so = os.path.join(prebuilt["path"], f"{prebuilt['uri']}.so")
    res = module_resources(so, sm)
    ptxas = prebuilt.get("ptxas_resource_usage") or {}
    if res is None:
        res = {k: {"registers": v["registers"], "static_smem": v["static_smem"], "stack_bytes": v["stack_bytes"]}
               for k, v in ptxas.items()}
    rows = []
    static_max = max((v["static_smem"] for v in res.values()), default=0)
    regs_max = max((v["registers"] for v in res.values()), default=0)
    spills = sum(ptxas.get(k, {}).get("spill_stores", 0) + ptxas.get(k, {}).get("spill_loads", 0) for k in res)
    ok = limit is None or static_max <= limit
    rows.append({**base, "kernels": len(res), "shared_static_bytes": static_max, "shared_bytes": static_max,
                 "registers": regs_max, "spills": spills if ptxas else None, "fits": ok, "ok": ok,
                 "note": "largest static shared memory and register count over the module's kernels; dynamic "
                         "shared memory (CUB temp storage) not computed"})
    return rows


def verify_rows(arch: int) -> list[dict[str, Any]]:
    """`turingbox verify --compile-only` rows (entry point turingbox_plugin.compile_reports): every kernel the
    image's FlashInfer modules launch on `arch` (75 = sm_75). Uses the modules baked at
    TURINGBOX_AOT_FLASHINFER_DIR when present, else compiles each launched kernel alone; needs an installed
    flashinfer (or TURINGBOX_FLASHINFER_SRC naming its package directory) and nvcc, and adds nothing without them."""
    import importlib.util

    # environ: a build/dev tool's source path (documented in test_settings_names), not a setting
    src = envs.flashinfer_src()
    if not src:
        spec = importlib.util.find_spec("flashinfer")
        src = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
    if not src or not find_cuda_home():
        return []
    label = arch_label(arch)
    return resource_report(label, aot_dir(), src, select(load_specs()[1], label))


# ---- CLI ------------------------------------------------------------------------------------------------------

def _records_from_args(a) -> list[dict[str, Any]]:
    if getattr(a, "plan_json", None):
        with open(a.plan_json, encoding="utf-8") as f:
            plan = Plan.from_dict(json.load(f))
        cfg_path = os.path.join(plan.model, "config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
        else:
            cfg = demo_model_config()
        recs = modules_for_plan(plan, cfg)
        return [r for r in recs if not a.only or r["uri"] in a.only or r["module"] in a.only]
    _header, recs = load_specs(a.specs)
    out = []
    for arch in a.arch.split(","):
        if arch.strip():
            out += select(recs, arch.strip(), a.variants, a.only)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turingbox_warmup.image.flashinfer_aot", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("derive", help="re-derive the shipped spec file from vLLM's and FlashInfer's source")
    d.add_argument("--vllm-src", default=None)
    d.add_argument("--flashinfer-src", default=None)
    d.add_argument("--fixtures", default=None, help="inventory fixtures (default: the repository's tests/fixtures/gpus)")
    d.add_argument("--out", default=SPEC_FILE)
    for name, helptext in (("list", "print the modules for an arch or a plan"),
                           ("build", "build the modules for one or more archs into a baked layout")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--arch", default="7.5", help="comma-separated compute capabilities (default 7.5)")
        s.add_argument("--variants", choices=("default", "all"), default="default",
                       help="default: the plans with default settings; all: the KV-dtype overrides too")
        s.add_argument("--plan-json", default=None, help="the modules of this plan (turingbox plan --json) instead")
        s.add_argument("--only", action="append", default=[], metavar="URI|MODULE", help="restrict (repeatable)")
        s.add_argument("--specs", default=SPEC_FILE)
        if name == "build":
            s.add_argument("--out", required=True, help="baked workspace base to fill (<out>/.cache/flashinfer/...)")
            s.add_argument("--build-dir", default=None, help="keep FlashInfer's build tree here (incremental rebuilds)")
            s.add_argument("--jobs", type=int, default=None, help="ninja jobs (MAX_JOBS; default: ninja's)")
            s.add_argument("--flashinfer-src", default=None)
    c = sub.add_parser("check", help="shared memory, registers and spills of every launched kernel for an arch")
    c.add_argument("--arch", default="7.5")
    c.add_argument("--dir", default=aot_dir())
    c.add_argument("--variants", choices=("default", "all"), default="default")
    c.add_argument("--flashinfer-src", default=None)
    c.add_argument("--json", action="store_true")
    i = sub.add_parser("install", help="copy baked modules into a FlashInfer workspace base that lacks them")
    i.add_argument("--from", dest="src", default=aot_dir())
    i.add_argument("--workspace-base", required=True, help="FLASHINFER_WORKSPACE_BASE (a cache entry's flashinfer/)")
    a = p.parse_args(argv)
    try:
        if a.cmd == "derive":
            vsrc = a.vllm_src or default_vllm_src()
            fsrc = a.flashinfer_src or default_flashinfer_src()
            if not fsrc:
                raise FlashInferAotError("no FlashInfer source (--flashinfer-src, TURINGBOX_FLASHINFER_SRC)")
            repo = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))     # warmup/turingbox_warmup/image
            fixtures = a.fixtures or os.path.join(repo, "tests", "fixtures", "gpus")
            write_specs(derive(vsrc, fsrc, fixtures), a.out)
            print(a.out)
        elif a.cmd == "list":
            for rec in _records_from_args(a):
                print(json.dumps(rec))
        elif a.cmd == "build":
            recs = _records_from_args(a)
            if not recs:
                raise FlashInferAotError(f"no FlashInfer module matches --arch {a.arch} --variants {a.variants}"
                                         + (f" --only {' '.join(a.only)}" if a.only else ""))
            t = time.time()
            build(recs, a.out, a.build_dir, a.jobs, a.flashinfer_src)
            print(json.dumps({"built": len(recs), "seconds": round(time.time() - t, 1), "out": a.out}))
        elif a.cmd == "check":
            rows = resource_report(a.arch, a.dir, a.flashinfer_src, variants=a.variants)
            ok = all(r.get("ok") for r in rows)
            if a.json:
                print(json.dumps({"ok": ok, "kernels": rows}, indent=2, sort_keys=True))
            else:
                for r in rows:
                    print(f"{'PASS' if r.get('ok') else 'FAIL'}  {r['name']}: shared {r.get('shared_bytes', '?')} B "
                          f"of {r.get('shared_limit_bytes')}, registers {r.get('registers', '?')}, spills "
                          f"{r.get('spills', '?')}" + (f" ({r['error']})" if r.get("error") else ""))
            return 0 if ok else 1
        elif a.cmd == "install":
            n = seed_workspace(a.src, a.workspace_base)
            print(json.dumps({"installed": n, "from": a.src, "workspace_base": a.workspace_base}))
    except (FlashInferAotError, OSError, ValueError) as exc:
        print(f"flashinfer_aot: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
