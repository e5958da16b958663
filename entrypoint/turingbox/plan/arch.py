"""Per-architecture rules for vLLM 0.21.0, each with its reason. PURE.

Facts behind them (read from vLLM 0.21.0 / FlashInfer 0.6.8, see DESIGN.md):
  * sm_75 has no bf16 (platforms/cuda.py supported_dtypes) -> half.
  * FLASH_ATTN needs sm_80 (supports_compute_capability), and takes an fp8 KV cache only with
    FlashAttention 3, i.e. on sm_90 (fa_utils.flash_attn_supports_fp8). FLASHINFER accepts
    sm_75..sm_121 and fp8/fp8_e4m3/fp8_e5m2 KV caches (software conversion below sm_89).
  * On sm_90 FlashInfer with an fp8 KV cache fails at the first request with half output
    ("For FP8 input, output must have dtype BF16", measured on an H200).
  * TRITON_ATTN cannot compile fp8_e4m3 on sm_75 (fp8_e5m2 compiles).
  * FlashInfer's GDN prefill kernel runs only on sm_90 (gdn_linear_attn.ChunkGatedDeltaRule); there
    its nvcc JIT kept a cold start from being ready within 500 s, so Triton/FLA is chosen everywhere.
  * With MTP, FlashInfer below sm_100 (no TRTLLM-gen decode) reports single-token decode only, so
    vLLM downgrades FULL decode CUDA graphs to PIECEWISE.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from turingbox.errors import UsageError
from turingbox.gpus.device import Gpu
from turingbox.config import BACKENDS, KV_DTYPES, MTP_MAX  # noqa: F401  (the settings' vocabulary, re-exported)
from turingbox.config import PlanSettings

MIN_SM = 75
DTYPES = ("half", "bfloat16")


@dataclass
class ArchRules:
    arch: str
    dtype: str
    attention_backend: str
    kv_cache_dtype: str
    gdn_prefill_backend: str
    gdn_path: str
    disable_custom_all_reduce: bool
    full_decode_graphs: bool
    default_max_num_seqs: int
    default_max_num_batched_tokens: int
    reasons: list[str] = field(default_factory=list)


def check_supported(gpu: Gpu) -> str | None:
    """Why this GPU cannot serve at all (None when it can). A phrase that follows "<GPU name> has": the
    planner says "no usable GPU: <name> has <this>." and lists it as an excluded GPU's reason."""
    if gpu.sm < MIN_SM:
        return (f"compute capability {gpu.compute_capability} ({gpu.arch}), below the minimum of "
                f"{MIN_SM // 10}.{MIN_SM % 10} (sm_{MIN_SM}) that FlashInfer and vLLM 0.21's AWQ-Marlin need")
    return None


def is_consumer(gpu: Gpu) -> bool:
    name = gpu.name.lower()
    return any(word in name for word in ("geforce", "rtx", "titan")) and "rtx a" not in name \
        and "rtx pro" not in name and "quadro" not in name


def mtp_depth(gpu: Gpu, tp: int, has_mtp: bool, override: int | None) -> tuple[int, str]:
    """Speculative tokens per step for the model's MTP head, with its reason."""
    if override is not None:
        if override > 0 and not has_mtp:
            raise UsageError(f"TURINGBOX_MTP {override} asks for MTP, but the model has no MTP head "
                             "(mtp_num_hidden_layers is 0); use 0.")
        return override, f"MTP={override}: set by TURINGBOX_MTP/--mtp."
    if not has_mtp:
        return 0, "MTP=0: the model has no MTP head."
    if gpu.sm == 75:
        if tp >= 4:
            return 4, f"MTP=4: {tp} sm_75 GPUs in TP (the seed's rule: 4 or more Turing cards verify 5 tokens per step as cheaply as 4)."
        return 3, f"MTP=3: {tp} sm_75 GPU{'s' if tp > 1 else ''} in TP (the seed's rule for 1-3 Turing cards)."
    if "H200" in gpu.name:
        return 3, ("MTP=3: measured on this GPU kind (H200, vLLM 0.21, Qwen3.6-27B architecture): mean "
                   "acceptance length 3.45 of 4 and ~170 tok/s at batch 1; deeper drafts add verify work "
                   "whose acceptance falls off.")
    # Only the H200 was measured; acceptance is a property of the MTP head and the prompts, the
    # verify cost of deeper drafts is the GPU's, and that was not measured here.
    return 3, (f"MTP=3: {gpu.name} ({gpu.arch}) has no turingbox measurement; depth 3 follows the MTP "
               "head's acceptance (mean 3.45 tokens of 4 in the one measured run, on an H200), which "
               "depends on the model and prompts rather than the GPU, and deeper drafts add verify work "
               "whose acceptance falls off.")


def rules_for(gpu: Gpu, tp: int, num_spec: int, model_dtype: str, quantized: bool,
              overrides: PlanSettings) -> ArchRules:
    """The per-architecture choices for a TP group of `gpu`s; overrides win and are validated."""
    sm, arch = gpu.sm, gpu.arch
    reasons: list[str] = []

    # dtype
    dtype = overrides.dtype
    if dtype:
        dtype = {"float16": "half", "fp16": "half", "bf16": "bfloat16"}.get(dtype, dtype)
        if dtype == "bfloat16" and sm < 80:
            raise UsageError(f"TURINGBOX_DTYPE bfloat16 is not supported on {arch} ({gpu.name}); use half.")
        reasons.append(f"dtype={dtype}: set by TURINGBOX_DTYPE/--dtype.")
    elif sm < 80:
        dtype = "half"
        reasons.append(f"dtype=half: {arch} has no bfloat16.")
    else:
        dtype = "half" if model_dtype in ("float16", "half") else "bfloat16"
        reasons.append(f"dtype={dtype}: {arch} runs the model's {model_dtype} natively"
                       + (" (AWQ-Marlin takes bfloat16 activations)." if quantized else "."))

    # attention backend
    backend = overrides.attention_backend
    if backend:
        backend = backend.upper()
        if backend == "FLASH_ATTN" and sm < 80:
            raise UsageError(f"TURINGBOX_ATTENTION_BACKEND FLASH_ATTN needs sm_80 or newer; {gpu.name} is {arch}.")
        reasons.append(f"attention backend {backend}: set by TURINGBOX_ATTENTION_BACKEND/--attention-backend.")
    elif sm == 75:
        backend = "FLASHINFER"
        reasons.append("attention backend FLASHINFER: FLASH_ATTN needs sm_80 and TRITON_ATTN cannot use an fp8_e4m3 KV cache on sm_75.")
    elif sm == 90:
        backend = "FLASH_ATTN"
        reasons.append("attention backend FLASH_ATTN: FlashAttention 3 on sm_90 is vLLM's first choice and takes an fp8 KV cache without FlashInfer's nvcc JIT.")
    elif sm >= 100:
        backend = "FLASHINFER"
        reasons.append(f"attention backend FLASHINFER: vLLM's first choice on {arch}.")
    else:
        backend = "FLASHINFER"
        reasons.append(f"attention backend FLASHINFER: on {arch} FlashAttention 2 has no fp8 KV cache and FlashInfer has.")

    # KV cache dtype
    kv = overrides.kv_cache_dtype
    if kv:
        reasons.append(f"kv_cache_dtype={kv}: set by TURINGBOX_KV_CACHE_DTYPE/--kv-cache-dtype.")
    else:
        kv = "fp8"
        reasons.append(f"kv_cache_dtype=fp8: {backend} supports an fp8 KV cache on {arch}; it halves KV memory.")
    fp8 = kv.startswith("fp8")
    if fp8 and backend == "FLASH_ATTN" and sm // 10 != 9:
        raise UsageError(f"TURINGBOX_KV_CACHE_DTYPE {kv} does not work with FLASH_ATTN on {arch}: "
                         "FlashAttention takes an fp8 KV cache only on sm_90.")
    if kv in ("fp8", "fp8_e4m3") and backend == "TRITON_ATTN" and sm < 80:
        raise UsageError(f"TURINGBOX_KV_CACHE_DTYPE {kv} does not compile with TRITON_ATTN on {arch}; use fp8_e5m2.")
    if fp8 and backend == "FLASHINFER" and sm // 10 == 9 and dtype != "bfloat16":
        raise UsageError(f"TURINGBOX_DTYPE {dtype} with FLASHINFER and an fp8 KV cache fails on {arch} at the first "
                         "request (FlashInfer needs bfloat16 output there); use bfloat16.")
    if kv == "bfloat16" and sm < 80:
        raise UsageError(f"TURINGBOX_KV_CACHE_DTYPE bfloat16 is not supported on {arch}; use fp8 or float16.")

    # GDN prefill kernel and the GDN path inside workers
    gdn_prefill = overrides.gdn_prefill_backend
    if gdn_prefill:
        if gdn_prefill == "flashinfer" and sm != 90:
            raise UsageError(f"TURINGBOX_GDN_PREFILL_BACKEND flashinfer runs only on sm_90 in vLLM 0.21; {gpu.name} is {arch}.")
        reasons.append(f"GDN prefill backend {gdn_prefill}: set by TURINGBOX_GDN_PREFILL_BACKEND.")
    else:
        gdn_prefill = "triton"
        reasons.append("GDN prefill backend triton: " + (
            "FlashInfer's GDN prefill JIT kept a cold start from being ready within 500 s on sm_90."
            if sm == 90 else f"FlashInfer's GDN prefill kernel runs only on sm_90, not {arch}."))
    gdn_path = overrides.gdn
    if gdn_path and gdn_path != "auto":
        reasons.append(f"GDN path {gdn_path}: set by TURINGBOX_GDN.")
    else:
        gdn_path = "turbo" if sm == 75 else "vllm"
        reasons.append("GDN path turbo: turingbox's sm_75 GDN kernels replace FLA's, which run on CUDA cores there."
                       if gdn_path == "turbo" else f"GDN path vllm: vLLM's own GDN kernels are used on {arch}.")

    # custom all-reduce: vLLM's needs P2P/NVLink; consumer cards over PCIe lack it (the seed turned it off)
    disable_car = tp > 1 and (sm == 75 or is_consumer(gpu))
    if disable_car:
        reasons.append(f"custom all-reduce off: {gpu.name} cards talk over PCIe without P2P/NVLink (the seed turned it off).")

    # FlashInfer without TRTLLM-gen (sm_100 only) supports single-token decode graphs only.
    full_decode = not (backend == "FLASHINFER" and sm < 100 and num_spec > 0)
    if sm < 80:
        seqs, mnbt = 8, 2048
    else:
        seqs, mnbt = 16, 8192
    return ArchRules(arch=arch, dtype=dtype, attention_backend=backend, kv_cache_dtype=kv,
                     gdn_prefill_backend=gdn_prefill, gdn_path=gdn_path,
                     disable_custom_all_reduce=disable_car, full_decode_graphs=full_decode,
                     default_max_num_seqs=seqs, default_max_num_batched_tokens=mnbt, reasons=reasons)

