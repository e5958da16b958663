"""The planner: (GPUs, model config, settings, software versions) -> Plan (plan/types.py). PURE.

No NVML, no files, no environment: the command layer reads those and passes values in, so every
decision here is table-testable on fake inventories. Every automatic decision adds one sentence to
`reasons`; every override (a non-None setting) wins after validation.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import AbstractSet, Any, Mapping, Sequence

from turingbox.errors import PlanError, UsageError
from turingbox.gpus.device import Gpu, pci_sort_key
from turingbox.gpus.inventory import Inventory
from turingbox.gpus.visibility import cuda_visible_devices
from turingbox.model.tokenizer import CHAT_TEMPLATE_FILE
from turingbox.plan import arch as archmod
from turingbox.plan import memory as mem
from turingbox.plan.types import Plan, PluginConfig
from turingbox.config import REGISTRY, PlanSettings
from turingbox_plugin.contract import AUTOTUNE_THREADS_ENV, BENCHMARK_MODE_ENV, RUNTIME_DIR_ENV, ModelConfig

WORKER_CLS = "turingbox_plugin.worker.TuringboxWorker"
CONTEXT_ROUNDING = 256          # a shrunk max_model_len is rounded down to this
REASONING_PARSER = "qwen3"
TOOL_PARSER = "qwen3_coder"     # Qwen3.5/3.6 emit Qwen3-Coder style XML tool calls
DEMO_TOOL_PARSER = "hermes"     # the demo model's ChatML template writes <tool_call>{json}</tool_call>
# The least context a real request needs: one chat turn (a templated prompt of a few sentences and a
# short answer; the Qwen chat template alone is ~20 tokens) plus the MTP drafts, which take KV slots
# past the last accepted token. Below it every request fails with "longer than max_model_len".
CHAT_TURN_TOKENS = 256
# vLLM 0.21 sampling_params.py _validate_spec_decode: these fail (400) while speculative decoding is on.
MTP_REFUSED_PARAMETERS = ("min_p", "logit_bias")
# vLLM 0.21 runs a dense model's data-parallel engines independently (each engine's parallel_config says
# data_parallel_size 1), so the strict warmup runs in each of them; a MoE model's DP engines step in lockstep,
# which the strict warmup does not drive (plugin driver.unsupported_reason): DP for MoE only with it off.


def dp_needs_strict_warmup_off(model: ModelConfig) -> bool:
    return model.is_moe

# The demo model's second served name: its directory (and so its first name) depends on the variant that fits
# the GPUs, and clients, the README's examples among them, need one name that works on every machine.
DEMO_ALIAS = "demo"


def setting_name(name: str) -> str:
    """'--max-num-seqs/TURINGBOX_MAX_NUM_SEQS': how refusals and reasons name a setting."""
    return f"{REGISTRY[name].flag_name}/{REGISTRY[name].env_name}"


def min_request_tokens(num_spec: int) -> int:
    return CHAT_TURN_TOKENS + num_spec


# FlashInfer versions whose fa2 prefill (head_dim >= 128) overflows sm_75's 64 KiB opt-in shared memory:
# 0.6.10 added 16-byte NVFP4 scale-factor placeholders (later also an FP8 repack one) to SharedStorageQKVO for
# every KV dtype (flashinfer-ai/flashinfer#3528: 65,584 B fp16 / 65,568 B fp8 at head_dim 256; #3620 at 128);
# 0.6.16 made them empty bases (#3526). The launch fails with cudaErrorInvalidValue at the first prefill.
FLASHINFER_SM75_BROKEN = ((0, 6, 10), (0, 6, 16))     # [first bad, first fixed)


def _release(version: str) -> tuple[int, ...] | None:
    import re
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", str(version or ""))
    return tuple(int(x) for x in m.groups()) if m else None


def flashinfer_sm75_problem(sm: int, backend: str, head_dim: int, software: Mapping[str, str]) -> str | None:
    """Why the installed FlashInfer cannot run this model's prefill on sm_75, or None."""
    version = software.get("flashinfer-python", "absent")
    release = _release(version)
    lo, hi = FLASHINFER_SM75_BROKEN
    if sm != 75 or backend != "FLASHINFER" or head_dim < 128 or release is None or not lo <= release < hi:
        return None
    return (f"attention backend FLASHINFER cannot run on sm_75 with the installed flashinfer-python {version}: "
            f"from 0.6.10 up to 0.6.15 its head_dim-{head_dim} prefill asks for more shared memory per block than "
            "sm_75's 65,536 bytes (65,568 B, and 65,584 B with a 16-bit KV cache from 0.6.13, at head_dim 256; "
            "flashinfer-ai/flashinfer#3528, fixed in 0.6.16 by #3526) and fails to launch at the first prompt; "
            "install flashinfer-python 0.6.8.post1 (this image's pin), 0.6.9 or 0.6.16 and later, or set "
            "TURINGBOX_ATTENTION_BACKEND=TRITON_ATTN with TURINGBOX_KV_CACHE_DTYPE=fp8_e5m2.")


# ---- reading the weights ---------------------------------------------------------------------------
# The load formats (config LOAD_FORMATS, "auto" resolved here) as vLLM 0.21's flags: --load-format takes vLLM's
# LoadFormats names (model_executor/model_loader/__init__.py) and --safetensors-load-strategy "prefetch" reads the
# checkpoint files into the page cache before the workers load them (config/load.py, weight_utils.py). The demo has
# no weights: "dummy". "auto" is vLLM's own default, planned only for a directory holding PyTorch .bin/.pt weights and
# no *.safetensors (every other format reads only *.safetensors; vLLM's auto falls back to .bin).
LOAD_FORMAT_ARGS: dict[str, tuple[str, ...]] = {
    "dummy": ("--load-format", "dummy"),
    "auto": ("--load-format", "auto"),
    "safetensors": ("--load-format", "safetensors"),
    "safetensors-prefetch": ("--load-format", "safetensors", "--safetensors-load-strategy", "prefetch"),
    "runai_streamer": ("--load-format", "runai_streamer"),
    "fastsafetensors": ("--load-format", "fastsafetensors"),
}
# The load formats that need a package beyond vLLM's own imports: format -> (import name, pip name). Whether each
# import name is importable is gathered at the edge (plan/from_settings.py) and passed to make_plan.
LOAD_FORMAT_PACKAGES: dict[str, tuple[str, str]] = {
    "runai_streamer": ("runai_model_streamer", "runai-model-streamer"),
    "fastsafetensors": ("fastsafetensors", "fastsafetensors"),
}
# Session 20 (H200, 2026-12-05, docs/benchmarks.md "Issue 35 item 3"): plain vLLM 0.21 with the plan's argv, TP=1,
# the 64-layer AWQ demo as a real 19.51 GB safetensors checkpoint (4 shards), page cache dropped, "Model loading
# took": safetensors 18.24 s, safetensors-prefetch 15.07 s, runai_streamer 14.15 s (runai-model-streamer 0.16.1).
# Session 27 (H100, same checkpoint): fastsafetensors 24.62 s against prefetch 15.06 s: the main model at the disk's
# speed (11.09 s), but MTP's drafter reads every shard again from disk (11.74 s), so auto never picks it.
LOAD_MEASURED = ("14.2 s vs 15.1 s safetensors-prefetch and 18.2 s safetensors, a 19.5 GB AWQ checkpoint from a "
                 "cold page cache, H200 2026-12-05")


def _pt_only(model: ModelConfig, weight_files: str | None) -> bool:
    """The model directory holds PyTorch .bin/.pt weights and no *.safetensors (weight_files "pt", found at the edge;
    None, not known yet, counts as safetensors, what hub checkpoints ship)."""
    return not model.is_demo and weight_files == "pt"


def load_format_problem(model: ModelConfig, s: PlanSettings, load_packages: AbstractSet[str],
                        weight_files: str | None = None) -> str | None:
    """Why the load format asked for cannot load this model here (its directory holds only .bin/.pt weights, which
    it cannot read, or its package is not importable), or None."""
    if s.load_format != "auto" and _pt_only(model, weight_files):
        return (f"{setting_name('load_format')} {s.load_format} reads only *.safetensors files, but {model.path} "
                "holds only PyTorch .bin/.pt weights, so vLLM would fail to load them; set auto (which plans vLLM's "
                "own auto format, which reads .bin) or convert the checkpoint to safetensors.")
    needed = LOAD_FORMAT_PACKAGES.get(s.load_format)
    if model.is_demo or needed is None or needed[0] in load_packages:
        return None
    module, dist = needed
    return (f"{setting_name('load_format')} {s.load_format} needs the Python package {dist} (import {module}), "
            "which is not installed here, so vLLM would fail to load the weights; install it, or set auto (which "
            "picks among what is installed) or safetensors-prefetch (which needs no package).")


def choose_load_format(model: ModelConfig, s: PlanSettings, tp: int, dp: int,
                       load_packages: AbstractSet[str], weight_files: str | None = None) -> tuple[str, str | None]:
    """(load format, its reason or None): the demo's dummy weights, a set format, vLLM's auto for a directory of
    .bin/.pt weights only, or auto's measured choice."""
    if model.is_demo:
        if s.load_format == "auto":
            return "dummy", None      # the demo's own reason says --load-format dummy
        return "dummy", (f"load format dummy: {setting_name('load_format')} {s.load_format} does not apply to the "
                         "demo model, which has no weights to read.")
    if s.load_format != "auto":
        return s.load_format, f"load format {s.load_format}: set by {setting_name('load_format')}."
    if _pt_only(model, weight_files):
        return "auto", (f"load format auto (vLLM's default): {model.path} holds no *.safetensors, only PyTorch "
                        ".bin/.pt weights, which runai_streamer and safetensors cannot read.")
    runai = LOAD_FORMAT_PACKAGES["runai_streamer"]
    if tp == 1 and dp == 1 and runai[0] in load_packages:
        return "runai_streamer", (f"load format runai_streamer: the fastest measured at TP=1 ({LOAD_MEASURED}).")
    if tp == 1 and dp == 1:
        why = (f"runai_streamer, measured fastest at TP=1 ({LOAD_MEASURED}), needs {runai[1]}, which is not "
               "installed here; prefetch was second and needs no package")
    else:
        why = (f"only TP=1 with one engine was measured, where runai_streamer was fastest ({LOAD_MEASURED}); at "
               f"TP={tp}" + (f" x DP={dp}" if dp > 1 else "") + " prefetch needs no package and every rank reads "
               "the same page cache")
    return "safetensors-prefetch", f"load format safetensors-prefetch (--safetensors-load-strategy prefetch): {why}."


# ---- tensor parallelism ----------------------------------------------------------------------------

def tp_problem(model: ModelConfig, tp: int) -> str | None:
    """Why vLLM 0.21 cannot split this model tp ways, or None when it can."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if heads % tp:
        return f"{tp} does not divide the {heads} attention heads"
    # QKVParallelLinear / Qwen3NextAttention: split when kv >= tp, replicate when tp is a multiple of kv.
    if kv >= tp and kv % tp:
        return f"{tp} does not divide the {kv} KV heads"
    if kv < tp and tp % kv:
        return f"{tp} is not a multiple of the {kv} KV heads, so they can be neither split nor replicated"
    if model.num_linear_attention_layers:
        # gdn_linear_attn.py: divide(num_v_heads, tp), num_k_heads // tp heads per rank.
        for label, n in (("GDN key", model.linear_num_key_heads), ("GDN value", model.linear_num_value_heads)):
            if n % tp:
                return f"{tp} does not divide the {n} {label} heads"
    if model.intermediate_size % tp:
        return f"{tp} does not divide the MLP width {model.intermediate_size}"
    return mem.tp_quantization_problem(model, tp)


def legal_tps(model: ModelConfig, n: int) -> list[int]:
    return [t for t in range(n, 0, -1) if tp_problem(model, t) is None]


def head_summary(model: ModelConfig) -> str:
    text = f"{model.num_attention_heads} attention heads and {model.num_key_value_heads} KV heads"
    if model.num_linear_attention_layers:
        text += f" and {model.linear_num_key_heads}/{model.linear_num_value_heads} GDN key/value heads"
    return text


# ---- memory sizing for one candidate ---------------------------------------------------------------

@dataclass
class Sizing:
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    layout: mem.KvLayout
    memory: mem.MemoryBreakdown
    capture_sizes: list[int]
    reasons: list[str]


def _explicit_text(s: PlanSettings, names: Sequence[str]) -> str:
    parts = [f"{setting_name(n)} {getattr(s, n)}" for n in names if getattr(s, n) is not None]
    return (" with " + ", ".join(parts)) if parts else ""


def _fail_fit(gpus: Sequence[Gpu], s: PlanSettings, requested: int, weights: int, act: int, logits: int,
              cg: int, non_torch: int, kv_avail: int, need: int, floor: int, logit_tokens: int) -> PlanError:
    g = gpus[0]
    # Name what the user set: the sentence must point at the setting that broke the fit.
    util = (f"{setting_name('gpu_memory_utilization')} {s.gpu_memory_utilization} gives vLLM "
            f"{mem.gib(requested):.2f} GiB per GPU" if s.gpu_memory_utilization is not None
            else f"vLLM may budget {mem.gib(requested):.2f} GiB per GPU")
    seqs = (f"{setting_name('max_num_seqs')} {s.max_num_seqs} makes the sampler hold logits for "
            f"{logit_tokens} tokens ({mem.gib(logits):.2f} GiB), " if s.max_num_seqs is not None else "")
    return PlanError(
        f"the model does not fit on {len(gpus)}x {g.name} ({g.memory_total_mib / 1024:.1f} GiB each)"
        f"{_explicit_text(s, ('tensor_parallel_size', 'max_num_batched_tokens', 'max_model_len'))}: "
        f"{util}, its weights need {mem.gib(weights):.2f} GiB per GPU, {seqs}"
        f"vLLM's runtime needs {mem.gib(act + cg + non_torch):.2f} GiB more (activations {mem.gib(act):.2f}, "
        f"CUDA graphs {mem.gib(cg):.2f}, other {mem.gib(non_torch):.2f}), leaving {mem.gib(max(kv_avail, 0)):.2f} GiB "
        f"for the KV cache where {mem.gib(need):.2f} GiB is needed for one {floor}-token sequence.")


def size_memory(gpus: Sequence[Gpu], model: ModelConfig, tp: int, num_spec: int, rules: archmod.ArchRules,
                s: PlanSettings, include_vision: bool, dp: int = 1) -> Sizing:
    reasons: list[str] = []
    total_mib = min(g.memory_total_mib for g in gpus)
    free_mib = min(g.memory_free_mib for g in gpus)
    act_bytes = mem.dtype_bytes(rules.dtype)
    ranks = tp * dp      # NCCL communicators exist whenever more than one rank runs

    # gpu_memory_utilization: what vLLM may budget, the rest stays for context/NCCL/late allocations.
    util_auto, outside = mem.gpu_memory_utilization(total_mib, free_mib, ranks, rules.attention_backend == "FLASHINFER")
    if s.gpu_memory_utilization is not None:
        util = float(s.gpu_memory_utilization)
        limit_mib = free_mib - outside.cuda_context_mib - outside.nccl_mib
        if util * total_mib > limit_mib:
            raise UsageError(f"{setting_name('gpu_memory_utilization')} {util} asks for {util * total_mib / 1024:.2f} GiB "
                             f"per GPU but only {limit_mib / 1024:.2f} GiB are free after the CUDA context.")
        reasons.append(f"gpu_memory_utilization={util}: set by TURINGBOX_GPU_MEMORY_UTILIZATION.")
    else:
        util = util_auto
        if util <= 0:
            raise PlanError(f"{gpus[0].name} has {free_mib / 1024:.2f} GiB free of {total_mib / 1024:.2f} GiB, "
                            f"less than the {outside.total_mib / 1024:.2f} GiB vLLM needs outside its budget.")
        shared = " (another process uses the card, so 0.5 GiB more is kept free)" \
            if outside.shared_gpu_headroom_mib else ""
        reasons.append(f"gpu_memory_utilization={util}: {free_mib / 1024:.2f} GiB free of {total_mib / 1024:.2f} GiB, "
                       f"minus {outside.total_mib / 1024:.2f} GiB for CUDA context, "
                       f"{'NCCL, ' if ranks > 1 else ''}late allocations and slack{shared}.")
    requested = int(util * total_mib * mem.MIB)

    weights = mem.weight_bytes_per_rank(model, tp, act_bytes, include_vision)
    layout = mem.kv_layout(model, tp, num_spec, rules.kv_cache_dtype, rules.dtype, bool(s.prefix_caching))

    # Batched tokens: align mode schedules whole blocks, so a block must fit in one step.
    need_mnbt = max(layout.block_size if s.prefix_caching else 1, 1)
    if s.max_num_batched_tokens is not None:
        mnbt = int(s.max_num_batched_tokens)
        if mnbt < need_mnbt:
            raise UsageError(f"{setting_name('max_num_batched_tokens')} {mnbt} is below the {need_mnbt}-token KV block "
                             "that --mamba-cache-mode align must schedule in one step.")
        reasons.append(f"max_num_batched_tokens={mnbt}: set by TURINGBOX_MAX_NUM_BATCHED_TOKENS.")
        mnbt_auto = False
    else:
        mnbt = max(rules.default_max_num_batched_tokens, mem.cdiv(need_mnbt, 256) * 256)
        mnbt_auto = True

    seqs_cap = int(s.max_num_seqs) if s.max_num_seqs is not None else rules.default_max_num_seqs

    def kv_available(seqs: int, batched: int) -> tuple[int, int, int, int, list[int]]:
        """(KV pool, activation peak, CUDA-graph estimate, non-torch growth, capture sizes) in bytes."""
        act = mem.activation_bytes(model, tp, batched, seqs, num_spec, act_bytes)
        if include_vision:
            act += VISION_PROFILE_MIB * mem.MIB
        sizes: list[int] = []
        cg = 0
        if not s.enforce_eager:
            sizes = mem.cudagraph_capture_sizes(seqs, num_spec, batched)
            graphs = {"PIECEWISE": len(sizes)}
            if rules.full_decode_graphs:
                graphs["FULL"] = len([x for x in mem.full_decode_sizes(sizes, num_spec)
                                      if x <= seqs * (1 + num_spec)])
            cg = mem.cudagraph_bytes(model, graphs, sizes[-1] if sizes else 0, act_bytes)
        non_torch = mem.NON_TORCH_INCREASE_MIB * mem.MIB
        return requested - weights.total - act - cg - non_torch, act, cg, non_torch, sizes

    # The context asked for, and the least a real request needs.
    model_max = model.max_position_embeddings
    bound = min_request_tokens(num_spec)
    explicit_len = s.max_model_len is not None
    if explicit_len:
        want_len = int(s.max_model_len)
        if want_len > model_max:
            raise UsageError(f"{setting_name('max_model_len')} {want_len} exceeds the model's {model_max}-token context "
                             "(max_position_embeddings).")
        if want_len < bound:
            raise UsageError(f"{setting_name('max_model_len')} {want_len} is below {bound} tokens, the least one chat "
                             f"turn needs ({CHAT_TURN_TOKENS} tokens of templated prompt and answer"
                             + (f" plus {num_spec} MTP draft slots" if num_spec else "") + ").")
        len_source = "requested"
    else:
        want_len = model_max
        len_source = "the model's full context"
    # Shrinking stops at min_model_len (the user's floor), never below what one request needs.
    floor = max(bound, min(int(s.min_model_len), want_len))

    # When memory is tight, a smaller prefill chunk lowers the activation peak (auto only).
    options = [mnbt]
    if mnbt_auto:
        smaller = mnbt // 2
        while smaller >= max(need_mnbt, 512):
            options.append(mem.cdiv(smaller, 256) * 256)
            smaller //= 2
    for option in options:
        batched = max(option, seqs_cap * (1 + num_spec))
        kv_avail, act, cg, non_torch, sizes = kv_available(seqs_cap, batched)
        margin = max(mem.KV_SAFETY_MIN_MIB * mem.MIB, int(mem.KV_SAFETY_FRACTION * max(kv_avail, 0)))
        usable = kv_avail - margin
        if usable >= layout.bytes_for(floor, 1):
            break
    else:
        logit_tokens = seqs_cap * (1 + num_spec)
        logits = logit_tokens * model.vocab_size * 4 * 2
        raise _fail_fit(gpus, s, requested, weights.total, act, logits, cg, non_torch, usable,
                        layout.bytes_for(floor, 1), floor, logit_tokens)
    lowered_from = mnbt if option != mnbt else None
    mnbt = option

    # vLLM 0.21's rule (v1/core/kv_cache_utils.py check_enough_kv_cache_memory): the engine starts
    # when ONE request of max_model_len fits in the pool, i.e. ceil(len / block) blocks per attention
    # group plus (2 + MTP) GDN state blocks per GDN group (align mode). Sequences share the pool and
    # the scheduler preempts when it runs out, so max_num_seqs does not multiply the context.
    one_full = layout.bytes_for(want_len, 1)
    full_at_once = usable // one_full if one_full else 0
    after = f"after {mem.gib(weights.total):.2f} GiB of weights and {mem.gib(act + cg + non_torch):.2f} GiB of runtime"

    if s.max_num_seqs is not None:
        seqs = int(s.max_num_seqs)
        reasons.append(f"max_num_seqs={seqs}: set by TURINGBOX_MAX_NUM_SEQS.")
    else:
        # Automatic concurrency stays conservative: every sequence may reach max_model_len at once.
        seqs = max(1, min(seqs_cap, full_at_once))
        if full_at_once >= seqs_cap:
            reasons.append(f"max_num_seqs={seqs}: the {rules.arch} default; {seqs} sequences of {want_len} tokens fit.")
        elif full_at_once >= 1:
            reasons.append(f"max_num_seqs={seqs}: {seqs} sequence{'s' if seqs > 1 else ''} of {want_len} tokens "
                           f"fit{'' if seqs > 1 else 's'} in {mem.gib(usable):.2f} GiB of KV cache per GPU (at {mem.gib(one_full):.2f} GiB each).")
        else:
            reasons.append(f"max_num_seqs=1: not even one sequence of {want_len} tokens fits, so the context shrinks.")

    if one_full > usable:
        # One sequence cannot fit: vLLM itself would refuse to start, so shrink (explicit or not).
        fit = layout.max_len_for(usable, 1)
        fit = min(want_len, fit // CONTEXT_ROUNDING * CONTEXT_ROUNDING if fit >= CONTEXT_ROUNDING else fit)
        if fit < floor:
            raise PlanError(
                f"max_model_len would shrink to {fit} tokens, below the {floor}-token floor"
                f"{_explicit_text(s, ('max_model_len', 'max_num_seqs', 'gpu_memory_utilization', 'tensor_parallel_size'))}: "
                f"one sequence of {floor} tokens needs {mem.gib(layout.bytes_for(floor, 1)):.2f} GiB of KV cache and GDN "
                f"state per GPU but only {mem.gib(usable):.2f} GiB fit {after}.")
        reasons.append(f"max_model_len={fit} (shrunk by {want_len - fit} tokens from {len_source}, {want_len}): one "
                       f"sequence of {want_len} tokens needs {mem.gib(one_full):.2f} GiB of KV cache and GDN state per "
                       f"GPU, {mem.gib(one_full - usable):.2f} GiB more than the {mem.gib(usable):.2f} GiB that fit {after}; "
                       "vLLM refuses to start unless one full-length sequence fits.")
        max_len = fit
    elif explicit_len or layout.bytes_for(want_len, seqs) <= usable:
        max_len = want_len
        at_once = min(seqs, full_at_once)
        reasons.append(f"max_model_len={want_len}: {len_source}; one sequence of {want_len} tokens needs "
                       f"{mem.gib(one_full):.2f} GiB of the {mem.gib(usable):.2f} GiB KV pool per GPU, so "
                       f"{full_at_once} full-length sequence{'s fit' if full_at_once != 1 else ' fits'} at once"
                       + ("" if at_once >= seqs else
                          f" and the {seqs} sequences share the pool (vLLM preempts when it fills)") + ".")
    else:
        # Automatic context with an explicit max_num_seqs: conservative, all of them at full length,
        # but never below the floor while one floor-length sequence fits (vLLM's own rule).
        fit = layout.max_len_for(usable, seqs)
        fit = min(want_len, fit // CONTEXT_ROUNDING * CONTEXT_ROUNDING if fit >= CONTEXT_ROUNDING else fit)
        max_len = max(fit, floor)
        at_once = usable // layout.bytes_for(max_len, 1)
        reasons.append(f"max_model_len={max_len} (shrunk from {len_source}, {want_len}): {seqs} sequences of {want_len} "
                       f"tokens need {mem.gib(layout.bytes_for(want_len, seqs)):.2f} GiB of KV cache and GDN state per GPU "
                       f"but only {mem.gib(usable):.2f} GiB fit {after}; {min(at_once, seqs)} sequences of {max_len} tokens "
                       f"fit at once" + ("" if at_once >= seqs else " and the rest share the pool (vLLM preempts)")
                       + f"; set {setting_name('max_model_len')} to keep more (vLLM needs only one full-length sequence to fit).")

    # Every running sequence holds its GDN state slots; more than fit at once wait in the queue.
    per_running = layout.state_bytes_per_seq() + layout.attention_groups * layout.pool_block_bytes
    running_cap = usable // per_running if per_running else seqs
    if running_cap < seqs:
        reasons.append(f"at most {running_cap} of the {seqs} sequences can run at once: each holds "
                       f"{mem.gib(per_running) * 1024:.0f} MiB of GDN state and its first KV block per GPU in the "
                       f"{mem.gib(usable):.2f} GiB pool; vLLM queues the rest.")

    # Settle batched tokens (vLLM needs >= max_num_seqs x decode tokens) and recompute the budget exactly.
    need_batched = seqs * (1 + num_spec)
    if mnbt < need_batched:
        if not mnbt_auto:
            raise UsageError(f"{setting_name('max_num_batched_tokens')} {mnbt} is below max_num_seqs x (1 + MTP) = "
                             f"{seqs} x {1 + num_spec} = {need_batched}, the decode tokens of one step.")
        mnbt = mem.cdiv(need_batched, 256) * 256
    if mnbt_auto and lowered_from:
        reasons.append(f"max_num_batched_tokens={mnbt}: lowered from {lowered_from} so the prefill activation "
                       "peak leaves room for the KV cache.")
    elif mnbt_auto:
        reasons.append(f"max_num_batched_tokens={mnbt}: the {rules.arch} prefill chunk"
                       + (f", raised to hold one {layout.block_size}-token KV block" if mnbt > rules.default_max_num_batched_tokens else "")
                       + ".")
    kv_avail, act, cg, non_torch, sizes = kv_available(seqs, mnbt)
    margin = max(mem.KV_SAFETY_MIN_MIB * mem.MIB, int(mem.KV_SAFETY_FRACTION * max(kv_avail, 0)))
    memory = mem.MemoryBreakdown(
        gpu_total_gib=round(total_mib / 1024, 3),
        gpu_free_gib=round(free_mib / 1024, 3),
        gpu_memory_utilization=util,
        requested_gib=mem.gib(requested),
        outside_budget_gib=round(outside.total_mib / 1024, 3),
        outside_budget_mib=outside,
        weights_gib=mem.gib(weights.total),
        weights_breakdown_gib=mem.WeightsGib(layers=mem.gib(weights.layers), embeddings=mem.gib(weights.embeddings),
                                             mtp=mem.gib(weights.mtp), vision=mem.gib(weights.vision),
                                             other=mem.gib(weights.small)),
        activation_gib=mem.gib(act),
        non_torch_gib=mem.gib(non_torch),
        cudagraph_gib=mem.gib(cg),
        kv_cache_gib=mem.gib(kv_avail),
        kv_cache_bytes=int(kv_avail),
        kv_cache_tokens=layout.tokens_in(kv_avail, max_len),
        kv_safety_margin_gib=mem.gib(margin),
        # vLLM's start condition: one max_model_len sequence (KV blocks + GDN state slots).
        kv_needed_gib=mem.gib(layout.bytes_for(max_len, 1)),
        kv_all_seqs_at_max_len_gib=mem.gib(layout.bytes_for(max_len, seqs)),
        kv_bytes_per_token=round(layout.kv_bytes_per_token(), 1),
        gdn_state_per_seq_gib=mem.gib(layout.state_bytes_per_seq()),
        num_gpu_blocks=int(kv_avail // layout.pool_block_bytes),
        block_size=layout.block_size,
        page_size_bytes=layout.page_bytes,
        layers_per_pool_block=layout.group_size,
        kv_cache_groups=mem.KvCacheGroups(attention=layout.attention_groups, gdn=layout.state_groups),
        max_concurrency_at_max_len=round(int(kv_avail // layout.pool_block_bytes) / layout.blocks_per_request(max_len), 2),
    )
    reasons.append(f"KV cache: {memory.kv_cache_gib:.2f} GiB per GPU ({memory.kv_cache_tokens} tokens, "
                   f"block size {layout.block_size}) after {memory.weights_gib:.2f} GiB of weights, "
                   f"{memory.activation_gib:.2f} GiB of activations and {memory.cudagraph_gib:.2f} GiB of CUDA graphs; "
                   f"the plan keeps a {memory.kv_safety_margin_gib:.2f} GiB safety margin.")
    return Sizing(gpu_memory_utilization=util, max_model_len=max_len, max_num_seqs=seqs,
                  max_num_batched_tokens=mnbt, layout=layout, memory=memory, capture_sizes=sizes, reasons=reasons)


# The multimodal profile run encodes a maximal dummy image batch through the vision tower.
VISION_PROFILE_MIB = 1024


# ---- the plan --------------------------------------------------------------------------------------

@dataclass
class Candidate:
    kind: tuple
    gpus: list[Gpu]       # the chosen tp x dp GPUs, PCI order (replica r: gpus[r*tp:(r+1)*tp])
    group: list[Gpu]      # all GPUs of this kind
    tp: int
    tp_reason: str
    num_spec: int
    mtp_reason: str
    rules: archmod.ArchRules
    sizing: Sizing
    why_not_all: str = ""     # why TP x DP does not use every GPU of the group
    dp: int = 1
    dp_reason: str = ""


def _choose_gpus(group: list[Gpu], count: int) -> list[Gpu]:
    # Most free memory first (a desktop may use one card), then PCI order.
    ranked = sorted(group, key=lambda g: (-g.memory_free_mib, pci_sort_key(g)))
    return sorted(ranked[:count], key=pci_sort_key)


def _build(group: list[Gpu], model: ModelConfig, s: PlanSettings, include_vision: bool, tp: int,
           dp: int) -> tuple[list[Gpu], int, str, archmod.ArchRules, Sizing]:
    chosen = _choose_gpus(group, tp * dp)
    num_spec, mtp_reason = archmod.mtp_depth(chosen[0], tp, model.has_mtp, s.mtp)
    quantized = model.quantization is not None and model.quantization.bits < 16
    rules = archmod.rules_for(chosen[0], tp, num_spec, model.torch_dtype, quantized, s)
    sizing = size_memory(chosen, model, tp, num_spec, rules, s, include_vision, dp)
    return chosen, num_spec, mtp_reason, rules, sizing


def _smaller_fit(group: list[Gpu], model: ModelConfig, s: PlanSettings, include_vision: bool, tp: int,
                 max_len: int) -> tuple | None:
    """The smallest legal TP below `tp` that keeps max_model_len (DP replicas then fill the group)."""
    n = len(group)
    for t in sorted(legal_tps(model, tp - 1)) if tp > 1 else []:
        try:
            built = _build(group, model, s, include_vision, t, n // t)
        except UsageError:       # PlanError included: does not fit at this width
            continue
        if built[4].max_model_len >= max_len:
            return t, n // t, built
    return None


def _candidate(group: list[Gpu], model: ModelConfig, s: PlanSettings, include_vision: bool) -> Candidate:
    n = len(group)
    kind_text = group[0].describe()
    if s.tensor_parallel_size is not None:
        tp = int(s.tensor_parallel_size)
        if tp > n:
            raise UsageError(f"{setting_name('tensor_parallel_size')} {tp} asks for more GPUs than the {n} identical {kind_text} visible.")
        problem = tp_problem(model, tp)
        if problem:
            raise UsageError(f"{setting_name('tensor_parallel_size')} {tp} cannot split the model: {problem}.")
        tp_reason = f"TP={tp}: set by TURINGBOX_TP/--tensor-parallel-size."
    else:
        tps = legal_tps(model, n)
        tp = tps[0]        # 1 is always legal for an unquantized model; quantized checks may refuse all
        if tp_problem(model, tp):
            raise PlanError(f"the model cannot run on {kind_text}: {tp_problem(model, tp)}.")
        if tp == n:
            tp_reason = (f"TP={tp}: {n} identical {kind_text} GPU{'s' if n > 1 else ''}; "
                         f"{tp} splits {head_summary(model)} legally.")
        else:
            tp_reason = (f"TP={tp}: the largest count of the {n} identical {kind_text} GPUs that splits "
                         f"{head_summary(model)} legally ({tp_problem(model, tp + 1) if tp + 1 <= n else ''}).")
    objective = str(s.objective or "latency")
    strict = bool(s.strict_warmup)
    dp = 1
    dp_reason = ""
    built = None
    if s.tensor_parallel_size is not None:
        if objective == "throughput" and n // tp > 1 and not (strict and dp_needs_strict_warmup_off(model)):
            dp = n // tp
            dp_reason = (f"DP={dp}: TURINGBOX_OBJECTIVE=throughput runs {dp} replicas of the set TP={tp} on "
                         f"{dp * tp} of the {n} GPUs, each with its own scheduler and KV cache.")
        built = _build(group, model, s, include_vision, tp, dp)
    else:
        built = _build(group, model, s, include_vision, tp, 1)
        smaller = _smaller_fit(group, model, s, include_vision, tp, built[4].max_model_len) if tp > 1 else None
        if smaller is not None:
            t, d, alt = smaller
            same = (f"the model also fits in {t} GPU{'s' if t > 1 else ''} with the same max_model_len "
                    f"{alt[4].max_model_len}")
            if objective == "throughput" and strict and dp_needs_strict_warmup_off(model):
                dp_reason = (f"DP=1: TURINGBOX_OBJECTIVE=throughput, and {same}, but {d} replicas of TP={t} of this "
                             f"MoE model ({model.num_experts} experts) need TURINGBOX_STRICT_WARMUP=0: vLLM steps a "
                             "MoE model's data-parallel engines in lockstep, which the strict warmup does not drive.")
            elif objective == "throughput":
                tp_reason = (f"TP={t}: TURINGBOX_OBJECTIVE=throughput, and {same}; {d} data-parallel replicas "
                             f"serve {d}x the sequences instead of one TP={tp} group.")
                tp, dp, built = t, d, alt
                dp_reason = (f"DP={d}: {d} replicas of TP={t} on {t * d} of the {n} GPUs (--data-parallel-size), "
                             "each with its own scheduler, max_num_seqs and KV cache"
                             + (", and its own strict warmup (vLLM runs a dense model's DP engines independently)."
                                if strict else "."))
            else:
                dp_reason = (f"DP=1: TURINGBOX_OBJECTIVE=latency (the default) keeps one TP={tp} group for the "
                             f"fastest single stream; {same}, so TURINGBOX_OBJECTIVE=throughput would run {d} "
                             f"replicas of TP={t} instead.")
    chosen, num_spec, mtp_reason, rules, sizing = built
    used = tp * dp
    if used == n:
        why = ""
    elif s.tensor_parallel_size is not None:
        why = "TP was set by TURINGBOX_TP"
    else:
        why = f"TP={n} is illegal: {tp_problem(model, n)}"
    return Candidate(kind=group[0].kind, gpus=chosen, group=group, tp=tp, tp_reason=tp_reason,
                     num_spec=num_spec, mtp_reason=mtp_reason, rules=rules, sizing=sizing, why_not_all=why,
                     dp=dp, dp_reason=dp_reason)


def _excluded(all_gpus: Sequence[Gpu], chosen: Candidate, unsupported: dict[str, str],
              failed: dict[tuple, str]) -> list[dict]:
    out = []
    for g in all_gpus:
        if g in chosen.gpus:
            continue
        if g.uuid in unsupported:
            reason = unsupported[g.uuid]
        elif g.kind == chosen.kind:
            reason = (f"TP={chosen.tp}{f' x DP={chosen.dp}' if chosen.dp > 1 else ''} uses {chosen.tp * chosen.dp} of the {len(chosen.group)} identical GPUs "
                      f"({chosen.why_not_all}); this one had less free memory or a later PCI slot")
        else:
            reason = (f"a different kind, {g.describe()}, than the chosen TP group of {chosen.gpus[0].describe()}: "
                      "one TP group never mixes architectures or memory sizes")
            if g.kind in failed:
                reason += f" (on its own: {failed[g.kind]})"
        out.append({"uuid": g.uuid, "index": g.index, "reason": reason})
    return out


def make_plan(gpus: Sequence[Gpu] | Inventory, model: ModelConfig, settings: PlanSettings,
              software: Mapping[str, str], load_packages: AbstractSet[str] = frozenset(), *,
              weight_files: str | None = None) -> Plan:
    """The whole plan. Raises PlanError/UsageError (one sentence, exit 2) when no plan is possible.

    load_packages: the import names of LOAD_FORMAT_PACKAGES that are importable where vLLM runs (the edge finds them).
    weight_files: which weight files the model directory holds (the edge finds them): "safetensors", "pt" (only
    PyTorch .bin/.pt) or None (not known, e.g. a hub id not downloaded yet; planned as safetensors).
    """
    s = settings
    hidden: list[dict] = []
    if isinstance(gpus, Inventory):
        hidden = list(gpus.hidden)
        gpus = list(gpus.gpus)
    gpus = sorted(gpus, key=pci_sort_key)
    context_floor_problem = min_model_len_problem(model, s)
    if context_floor_problem:
        raise UsageError(context_floor_problem)
    load_problem = load_format_problem(model, s, load_packages, weight_files)
    if load_problem:
        raise UsageError(load_problem)
    if not gpus:
        raise PlanError("no GPU is visible" + (f" ({len(hidden)} hidden by NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES)"
                                              if hidden else "") + "; turingbox needs at least one NVIDIA GPU.")
    if not model.num_hidden_layers:
        raise PlanError(f"{model.path} describes a model without layers.")

    unsupported = {g.uuid: why for g in gpus if (why := archmod.check_supported(g))}
    groups: dict[tuple, list[Gpu]] = {}
    for g in gpus:
        if g.uuid not in unsupported:
            groups.setdefault(g.kind, []).append(g)
    if not groups:
        g = gpus[0]
        raise PlanError(f"no usable GPU: {g.name} has {unsupported[g.uuid]}.")

    include_vision = model.has_vision and not model.is_demo
    candidates: list[Candidate] = []
    failures: dict[tuple, BaseException] = {}
    tp_override = s.tensor_parallel_size
    if tp_override is not None and len(groups) > 1 and all(int(tp_override) > len(g) for g in groups.values()):
        kinds = " and ".join(f"{len(g)}x {g[0].describe()}" for g in sorted(groups.values(), key=len, reverse=True))
        biggest = max(groups.values(), key=len)
        fallback = legal_tps(model, len(biggest))
        raise UsageError(f"{setting_name('tensor_parallel_size')} {tp_override} needs {tp_override} identical GPUs, "
                         f"but the visible ones are {kinds}, and one TP group never mixes kinds"
                         + (f"; the widest legal TP on the {len(biggest)} {biggest[0].name} is {fallback[0]}" if fallback else "")
                         + ".")
    for kind, group in groups.items():
        if tp_override is not None and int(tp_override) > len(group) and len(groups) > 1:
            failures[kind] = UsageError(f"only {len(group)} GPU(s) of the kind {group[0].describe()}")
            continue
        try:
            candidates.append(_candidate(group, model, s, include_vision))
        except UsageError as exc:     # PlanError included
            failures[kind] = exc
    if not candidates:
        # Report the failure of the biggest group (the one most likely meant).
        biggest = max(groups, key=lambda k: (len(groups[k]), k[2]))
        raise failures[biggest]
    # latency: the widest TP group; throughput: the most GPUs in use (TP x DP).
    width = (lambda c: c.tp * c.dp) if s.objective == "throughput" else (lambda c: c.tp)
    best = max(candidates, key=lambda c: (width(c), c.sizing.memory.kv_cache_gib, c.gpus[0].sm))
    guard = flashinfer_sm75_problem(best.gpus[0].sm, best.rules.attention_backend, model.head_dim, software)
    if guard:
        raise PlanError(guard)
    failed_text = {k: str(e).rstrip(".") for k, e in failures.items()}
    excluded = hidden + _excluded(gpus, best, unsupported, failed_text)
    return _assemble(best, model, s, software, excluded, load_packages, weight_files)


def min_model_len_problem(model: ModelConfig, s: PlanSettings) -> str | None:
    """Why min_model_len can never be met, or None. Only a value someone set is checked: the declared
    default floor means "at most the model's context", so a model with a shorter context still plans."""
    floor = s.min_model_len
    if floor is None or int(floor) == REGISTRY["min_model_len"].default:
        return None
    floor, model_max, wanted = int(floor), model.max_position_embeddings, s.max_model_len
    if model_max and floor > model_max:
        return (f"{setting_name('min_model_len')} {floor} exceeds the model's {model_max}-token context "
                "(max_position_embeddings), so no plan can keep that much.")
    if wanted is not None and floor > int(wanted):
        return (f"{setting_name('min_model_len')} {floor} is above {setting_name('max_model_len')} {int(wanted)}: "
                "the least context to accept cannot be longer than the context asked for.")
    return None


def served_model_names(plan: Plan) -> tuple[str, ...]:
    """The names vLLM answers to (`--served-model-name`, nargs='+' in vLLM 0.21; OpenAIServingModels.is_base_model
    accepts any of them). The first is plan.served_model_name: the name vLLM writes into every response and its
    metrics, and the one active warmup and the benches send; a demo plan adds DEMO_ALIAS."""
    names = [plan.served_model_name]
    if plan.demo and DEMO_ALIAS not in names:
        names.append(DEMO_ALIAS)
    return tuple(names)


def _tool_parser(model: ModelConfig) -> str:
    # The demo's own chat template writes JSON tool calls (hermes); real Qwen3.5/3.6 checkpoints
    # ship a template with Qwen3-Coder style XML calls.
    return DEMO_TOOL_PARSER if model.is_demo else TOOL_PARSER


def _assemble(c: Candidate, model: ModelConfig, s: PlanSettings, software: Mapping[str, str],
              excluded: list[dict], load_packages: AbstractSet[str], weight_files: str | None = None) -> Plan:
    r, z = c.rules, c.sizing
    gpu = c.gpus[0]
    reasons = [c.tp_reason]
    if c.dp_reason:
        reasons.append(c.dp_reason)
    if excluded:
        reasons.append(f"Left out {len(excluded)} GPU(s): " + "; ".join(
            f"GPU {e['index']} ({e['uuid'][:12]}) {e['reason']}" for e in excluded) + ".")
    reasons.append(c.mtp_reason)
    refused = MTP_REFUSED_PARAMETERS if c.num_spec else ()
    if refused:
        reasons.append(f"MTP cost: vLLM 0.21 answers 400 to requests that set {' or '.join(refused)} while speculative "
                       f"decoding is on; TURINGBOX_MTP=0 (--mtp 0) accepts them at the cost of decode speed.")
    reasons += r.reasons
    quant = model.quantization.method if model.quantization and model.quantization.bits < 16 else None
    if quant:
        reasons.append(f"quantization={quant}: from the model's quantization_config "
                       f"({model.quantization.bits}-bit, group {model.quantization.group_size}; "
                       f"{', '.join(model.quantization.modules_to_not_convert) or 'nothing'} kept at 16 bits).")
    prefix = bool(s.prefix_caching)
    if prefix and model.num_linear_attention_layers:
        reasons.append("prefix caching on with --mamba-cache-mode align: GDN states are cached at block boundaries, "
                       "the mode vLLM 0.21 requires with MTP.")
    reasons += z.reasons
    enforce_eager = bool(s.enforce_eager)
    capture = () if enforce_eager else tuple(z.capture_sizes)
    if enforce_eager:
        reasons.append("enforce_eager: set by TURINGBOX_ENFORCE_EAGER (no CUDA graphs; decode is several times slower).")
    else:
        mode = "FULL decode + PIECEWISE" if r.full_decode_graphs else "PIECEWISE only (FlashInfer decodes MTP without full graphs)"
        reasons.append(f"CUDA graphs {mode} for {len(capture)} batch sizes up to {capture[-1] if capture else 0}.")
    if model.model_type.startswith("qwen3"):
        reasons.append(f"parsers: reasoning {REASONING_PARSER} and tools {_tool_parser(model)} (<think> blocks and "
                       + ("the demo template's JSON tool calls)." if model.is_demo else "Qwen3-Coder style XML tool calls)."))
    if model.is_demo:
        reasons.append("demo model: --load-format dummy (random weights of the real architecture)"
                       + (", text only (--language-model-only: the vision tower is not built)." if model.has_vision
                          else "."))
    load_format, load_reason = choose_load_format(model, s, c.tp, c.dp, load_packages, weight_files)
    if load_reason:
        reasons.append(load_reason)
    text_only = text_only_plan(model)
    if text_only:
        reasons.append("engine core forked (VLLM_WORKER_MULTIPROC_METHOD=fork): text only, vLLM's API server never "
                       "initialises CUDA (the plugin answers its multimodal check without importing the model), so "
                       "its engine core starts without a second Python interpreter, ~15 s sooner on the H200 "
                       "(session 11); a VLLM_WORKER_MULTIPROC_METHOD of your own wins.")
    served = s.served_model_name or (model.path.rstrip("/").rsplit("/", 1)[-1])
    if model.is_demo and served != DEMO_ALIAS:
        reasons.append(f"served as {served} and {DEMO_ALIAS}: requests may name either (vLLM answers to every "
                       f"--served-model-name), and responses and metrics name {served}; {DEMO_ALIAS} is the same "
                       "on every machine, whichever demo variant fits.")
    # runtime_dir, benchmark_mode and autotune_compile_threads travel as environment variables, not in the plugin
    # config: vLLM hashes additional_config into its compile-cache key, so anything volatile there would split the
    # cache (and a CPU count changes no kernel).
    plugin = PluginConfig(strict_warmup=bool(s.strict_warmup), require_plugin=bool(s.require_plugin),
                          gdn=r.gdn_path, num_speculative_tokens=c.num_spec, max_num_seqs=z.max_num_seqs,
                          cudagraph_capture_sizes=capture)
    plan = Plan(
        tensor_parallel_size=c.tp,
        data_parallel_size=c.dp,
        objective=s.objective,
        num_speculative_tokens=c.num_spec,
        mtp_refused_parameters=refused,
        gpu_memory_utilization=z.gpu_memory_utilization,
        max_model_len=z.max_model_len,
        max_num_seqs=z.max_num_seqs,
        max_num_batched_tokens=z.max_num_batched_tokens,
        kv_cache_dtype=r.kv_cache_dtype,
        attention_backend=r.attention_backend,
        dtype=r.dtype,
        gdn_prefill_backend=r.gdn_prefill_backend,
        gdn_path=r.gdn_path,
        quantization=quant,
        cudagraph_capture_sizes=capture,
        enforce_eager=enforce_eager,
        prefix_caching=prefix,
        disable_custom_all_reduce=r.disable_custom_all_reduce,
        compute_capability=gpu.compute_capability,
        gpu_name=gpu.name,
        gpus=tuple(g.uuid for g in c.gpus),
        gpu_indices=tuple(g.index for g in c.gpus),
        excluded_gpus=tuple(dict(e) for e in excluded),
        model=model.path,
        served_model_name=served,
        demo=model.is_demo,
        demo_fallback=None,           # set by the command layer when a smaller demo variant was used
        load_format=load_format,
        memory=z.memory,
        plugin=plugin,
        env={
            "CUDA_VISIBLE_DEVICES": cuda_visible_devices(c.gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # Must be set before FLA is imported to reuse autotune results (DESIGN: 93 s per start otherwise).
            "TRITON_CACHE_AUTOTUNING": "1",
            RUNTIME_DIR_ENV: str(s.runtime_dir),          # PLUGIN_ENV: the settings' values under the plugin's names
            BENCHMARK_MODE_ENV: "1" if s.benchmark_mode else "0",
            # None: unset, the plugin's default (the worker's CPUs per GPU worker)
            AUTOTUNE_THREADS_ENV: str(s.autotune_compile_threads) if s.autotune_compile_threads else None,
            "VLLM_PLUGINS": None,           # None = remove from the environment (all plugins load)
            # `vllm serve` spawns its engine core (a fresh interpreter that imports everything again) unless told
            # otherwise; vLLM itself falls back to spawn if CUDA is initialised in the API server after all.
            **({"VLLM_WORKER_MULTIPROC_METHOD": "fork"} if text_only else {}),
        },
        vllm_args=(),
        reasons=tuple(reasons),
        cache_inputs={},
        cache_key="",
    )
    plan = replace(plan, vllm_args=vllm_args(plan, model))
    return plan.fingerprinted(software, model.config_hash)


def text_only_plan(model: ModelConfig) -> bool:
    """A multimodal architecture served as text only: the demo (its vision tower is never built or planned)."""
    return model.is_demo and model.has_vision


def vllm_args(plan: Plan, model: ModelConfig) -> tuple[str, ...]:
    """The argv after `vllm` for this plan: the one place the plan's fields become vLLM flags.

    model: the ModelConfig the plan was made for (its layer kinds, type and vision tower pick flags).
    """
    args = ["serve", plan.model,
            "--served-model-name", *served_model_names(plan),
            "--tensor-parallel-size", str(plan.tensor_parallel_size),
            *(["--data-parallel-size", str(plan.data_parallel_size)] if plan.data_parallel_size > 1 else []),
            "--dtype", plan.dtype,
            "--max-model-len", str(plan.max_model_len),
            "--max-num-seqs", str(plan.max_num_seqs),
            "--max-num-batched-tokens", str(plan.max_num_batched_tokens),
            "--gpu-memory-utilization", f"{plan.gpu_memory_utilization}",
            "--kv-cache-dtype", plan.kv_cache_dtype,
            "--attention-backend", plan.attention_backend]
    if model.num_linear_attention_layers:
        args += ["--gdn-prefill-backend", plan.gdn_prefill_backend]
    if plan.prefix_caching:
        args += ["--enable-prefix-caching"]
        if model.num_linear_attention_layers:
            args += ["--mamba-cache-mode", "align"]
    else:
        args += ["--no-enable-prefix-caching"]
    if plan.disable_custom_all_reduce:
        args += ["--disable-custom-all-reduce"]
    if model.model_type.startswith("qwen3"):
        args += ["--reasoning-parser", REASONING_PARSER, "--enable-auto-tool-choice",
                 "--tool-call-parser", _tool_parser(model)]
    if plan.num_speculative_tokens:
        args += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": plan.num_speculative_tokens},
                                                    separators=(",", ":"))]
    args += LOAD_FORMAT_ARGS[plan.load_format]
    if text_only_plan(model):
        # every modality's limit 0 without naming them, which the plugin can answer without importing the model
        args += ["--language-model-only"]
        # The demo's template file (turingbox writes it, the same text as tokenizer_config.json's): without it, vLLM's
        # API server looks for the template in the model's AutoProcessor, loading the tokenizer again and the image
        # and video processors that a text-only server never uses (~3.6 s before it serves, session 11).
        args += ["--chat-template", os.path.join(plan.model, CHAT_TEMPLATE_FILE)]
    if plan.enforce_eager:
        args += ["--enforce-eager"]
    elif plan.cudagraph_capture_sizes:
        args += ["--compilation-config", json.dumps({"cudagraph_capture_sizes": list(plan.cudagraph_capture_sizes)},
                                                    separators=(",", ":"))]
    args += ["--worker-cls", WORKER_CLS,
             "--additional-config", json.dumps({"turingbox": plan.plugin.to_dict()}, separators=(",", ":"),
                                               sort_keys=True)]
    return tuple(args)
