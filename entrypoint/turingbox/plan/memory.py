"""AutoMem: the memory model of one tensor-parallel rank under vLLM 0.21.0. PURE arithmetic.

How vLLM 0.21 spends a GPU (v1/worker/gpu_worker.py, utils/mem_utils.py, v1/worker/utils.py):

    outside the budget  CUDA context + NCCL buffers (made before the worker's memory snapshot), and
                        what is allocated after the KV pool exists (FlashInfer's 394 MiB workspace,
                        sampler buffers, allocator slack)
    requested           = total x gpu_memory_utilization; must be <= free memory at worker start
    KV pool             = requested - weights - torch activation peak of the profile run
                          - non-torch growth during load/profile - CUDA-graph estimate
                          (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 is the 0.21 default)

The KV pool of a hybrid GDN model (v1/core/kv_cache_utils.py, platforms/interface.py
_align_hybrid_block_size, v1/kv_cache_interface.py):

  * one attention token page per layer = 2 x kv_heads_per_rank x head_dim x kv_dtype_bytes;
  * one GDN (mamba) state page per layer = conv state (conv_dim/tp x (kernel-1+K)) in the model
    dtype + SSM state (v_heads/tp x dv x dk) in mamba_ssm_dtype (fp32 for Qwen3.5/3.6: vLLM reads
    the config's mamba_ssm_dtype), K = speculative tokens;
  * block_size is raised to 16 x ceil(mamba_page / (16 x attn_token_page)) so one attention page
    >= one state page, and the state page is padded to exactly the attention page;
  * layers are grouped by spec: the full-attention layers (+1 per MTP layer, same spec) form one
    group, the GDN layers are split into groups of the same size; group_size = the larger of the
    two counts if within 1.5x, else the smaller; every group draws blocks from ONE pool, and one
    pool block costs page_size x group_size bytes;
  * a request needs ceil(len / block_size) attention blocks, plus per GDN group (2 + K) blocks with
    --mamba-cache-mode align (1 + K without prefix caching).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from turingbox_plugin.contract import ModelConfig

GIB = 1 << 30
MIB = 1 << 20

# ---- constants of the model; each one is an estimate with its reason -----------------------------
# CUDA context of a torch 2.11 / CUDA 13 process on one device, lazy module loading on, cuBLAS handle:
# created before vLLM's memory snapshot, so it is not inside gpu_memory_utilization's budget.
CUDA_CONTEXT_MIB = 600
# NCCL communicator buffers, proxies and vLLM's custom all-reduce IPC buffers for TP > 1: also made
# in init_worker_distributed_environment, before the snapshot.
NCCL_MIB = 320
# Allocated after the KV pool exists, hence outside the budget: FlashInfer's workspace buffer
# (VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE = 394 MiB, lazily on the first metadata build) ...
FLASHINFER_WORKSPACE_MIB = 394
# ... and, on every backend, sampler/penalty buffers, CUDA-graph capture beyond vLLM's estimate,
# caching-allocator fragmentation, and one slice of prompt logprobs (the plugin computes them in slices of
# at most turingbox_plugin.vllm_fixes.PROMPT_LOGPROBS_SLICE_MIB; vLLM's own whole-chunk peak is GiBs).
POST_KV_SLACK_MIB = 384
# When another process already uses the card (desktop, X server: more than SHARED_GPU_USED_MIB in use;
# an idle datacenter card shows ~0.5 GiB used by driver reservations), keep this much more for it to grow.
SHARED_GPU_USED_MIB = 1024
SHARED_GPU_HEADROOM_MIB = 512
# Never ask vLLM for more than this fraction of a card.
MAX_GPU_MEMORY_UTILIZATION = 0.96
# Non-torch memory that grows during load and the profile run (kernel images of torch, Triton/FLA,
# FlashInfer/FlashAttention modules, cuBLASLt workspaces): counted by vLLM as non_torch_increase.
NON_TORCH_INCREASE_MIB = 400
# Fixed part of the profile run's torch peak (rotary caches, sampler dummy run, workspace manager).
ACTIVATION_FIXED_MIB = 192
# CUDA graphs: vLLM captures the largest size and one more per mode and extrapolates; observed
# per-graph costs are a few MiB (piecewise graphs hold one piece per split op: every attention and
# GDN layer).
CUDAGRAPH_BASE_MIB = 96
CUDAGRAPH_PER_GRAPH_MIB = {"FULL": 2, "PIECEWISE": 4}
# The KV pool the plan relies on is the estimate minus this margin (the estimate of everything
# else can be off by a few percent; vLLM refuses to start when one max-length request does not fit).
KV_SAFETY_FRACTION = 0.05
KV_SAFETY_MIN_MIB = 256
# vLLM's attention kernel block alignment for FlashInfer / FlashAttention (hybrid, fp32 SSM state):
# get_supported_kernel_block_sizes() -> [16, 32, 64], min = 16.
KERNEL_BLOCK_ALIGNMENT = 16
# FLA chunked GDN prefill works on 64-token chunks; it keeps one (dk x dv) state per chunk and head.
GDN_CHUNK = 64
MARLIN_TILE_N = 64            # AWQ-Marlin: output features per rank must be a multiple of this

DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float32": 4, "float": 4,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "auto": 2}


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES.get(str(name).lower(), 2)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gib(n_bytes: float) -> float:
    return round(n_bytes / GIB, 3)


# ---- weights -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Linear:
    name: str          # vLLM module path fragment (matched against modules_to_not_convert)
    in_features: int   # per rank
    out_features: int  # per rank
    part: str          # "layers", "mtp", "vision", "embed"


def text_config(model: ModelConfig) -> dict:
    raw = model.extra.get("raw", {}) if isinstance(model.extra, dict) else {}
    return raw.get("text_config") or raw


def kv_heads_per_rank(model: ModelConfig, tp: int) -> int:
    # QKVParallelLinear: KV heads are split when kv >= tp, replicated (1 per rank) otherwise.
    return max(1, model.num_key_value_heads // tp)


def _attention_linears(model: ModelConfig, tp: int, prefix: str, part: str) -> list[Linear]:
    h, hd = model.hidden_size, model.head_dim
    gate = 2 if text_config(model).get("attn_output_gate", False) else 1   # Qwen3.5 gated attention
    q_out = model.num_attention_heads // tp * hd * gate
    kv_out = 2 * kv_heads_per_rank(model, tp) * hd
    return [Linear(f"{prefix}.self_attn.qkv_proj", h, q_out + kv_out, part),
            Linear(f"{prefix}.self_attn.o_proj", model.num_attention_heads * hd // tp, h, part)]


def _mlp_linears(model: ModelConfig, tp: int, prefix: str, part: str) -> list[Linear]:
    h, inter = model.hidden_size, model.intermediate_size
    return [Linear(f"{prefix}.mlp.gate_up_proj", h, 2 * inter // tp, part),
            Linear(f"{prefix}.mlp.down_proj", inter // tp, h, part)]


def _gdn_linears(model: ModelConfig, tp: int, prefix: str) -> list[Linear]:
    h = model.hidden_size
    key_dim = model.linear_num_key_heads * model.linear_key_head_dim
    value_dim = model.linear_num_value_heads * model.linear_value_head_dim
    return [Linear(f"{prefix}.linear_attn.in_proj_qkvz", h, (2 * key_dim + 2 * value_dim) // tp, "layers"),
            Linear(f"{prefix}.linear_attn.in_proj_ba", h, 2 * model.linear_num_value_heads // tp, "layers"),
            Linear(f"{prefix}.linear_attn.out_proj", value_dim // tp, h, "layers")]


def _vision_linears(model: ModelConfig, tp: int) -> list[Linear]:
    vc = model.extra.get("raw", {}).get("vision_config") or {}
    if not vc:
        return []
    vh = int(vc.get("hidden_size", 0))
    vi = int(vc.get("intermediate_size", 0))
    depth = int(vc.get("depth", 0))
    merge = int(vc.get("spatial_merge_size", 2)) ** 2
    out = int(vc.get("out_hidden_size", model.hidden_size))
    lins = []
    for i in range(depth):   # Qwen3-VL vision blocks: TP-sharded like the LM (mm_encoder_tp_mode=weights)
        p = f"visual.blocks.{i}"
        lins += [Linear(f"{p}.attn.qkv", vh, 3 * vh // tp, "vision"),
                 Linear(f"{p}.attn.proj", vh // tp, vh, "vision"),
                 Linear(f"{p}.mlp.linear_fc1", vh, vi // tp, "vision"),
                 Linear(f"{p}.mlp.linear_fc2", vi // tp, vh, "vision")]
    lins += [Linear("visual.merger.linear_fc1", vh * merge, vh * merge // tp, "vision"),
             Linear("visual.merger.linear_fc2", vh * merge // tp, out, "vision")]
    return lins


def _vision_other_params(model: ModelConfig) -> int:
    vc = model.extra.get("raw", {}).get("vision_config") or {}
    if not vc:
        return 0
    vh = int(vc.get("hidden_size", 0))
    patch = int(vc.get("in_channels", 3)) * int(vc.get("temporal_patch_size", 2)) * int(vc.get("patch_size", 16)) ** 2
    return patch * vh + int(vc.get("num_position_embeddings", 0)) * vh + 4 * vh * int(vc.get("depth", 0))


def linears(model: ModelConfig, tp: int, include_vision: bool) -> list[Linear]:
    lins: list[Linear] = []
    for i, kind in enumerate(model.layer_types):
        p = f"model.language_model.layers.{i}"
        if kind == "linear_attention":
            lins += _gdn_linears(model, tp, p)
        else:
            lins += _attention_linears(model, tp, p, "layers")
        lins += _mlp_linears(model, tp, p, "layers")
    for j in range(model.mtp_num_hidden_layers):
        p = f"mtp.layers.{j}"
        lins += _attention_linears(model, tp, p, "mtp") + _mlp_linears(model, tp, p, "mtp")
    if model.mtp_num_hidden_layers:
        lins.append(Linear("mtp.fc", 2 * model.hidden_size, model.hidden_size // tp, "mtp"))
    if include_vision:
        lins += _vision_linears(model, tp)
    return lins


def is_quantized(model: ModelConfig, lin: Linear) -> bool:
    q = model.quantization
    if q is None or q.method not in ("awq", "awq_marlin", "gptq", "gptq_marlin") or q.bits >= 16:
        return False
    # vLLM's is_layer_skipped_awq: any listed name that occurs in the module prefix.
    return not any(skip in lin.name for skip in q.modules_to_not_convert)


def linear_bytes(model: ModelConfig, lin: Linear, act_bytes: int) -> int:
    n = lin.in_features * lin.out_features
    if not is_quantized(model, lin):
        return n * act_bytes
    q = model.quantization
    group = q.group_size if q.group_size > 0 else lin.in_features
    groups = cdiv(lin.in_features, group)
    packed = n * q.bits // 8                          # qweight (int32-packed)
    scales = groups * lin.out_features * 2            # fp16 scales
    zeros = groups * lin.out_features * q.bits // 8   # packed zero points
    return packed + scales + zeros


@dataclass(frozen=True)
class Weights:
    layers: int
    embeddings: int       # embed_tokens + lm_head (16-bit, vocab-parallel)
    mtp: int
    vision: int
    small: int            # norms, conv1d, A_log/dt_bias: never quantized, mostly replicated

    @property
    def total(self) -> int:
        return self.layers + self.embeddings + self.mtp + self.vision + self.small


def weight_bytes_per_rank(model: ModelConfig, tp: int, act_bytes: int, include_vision: bool) -> Weights:
    parts = {"layers": 0, "mtp": 0, "vision": 0}
    for lin in linears(model, tp, include_vision):
        parts[lin.part] += linear_bytes(model, lin, act_bytes)
    vocab_per_rank = cdiv(cdiv(model.vocab_size, 64) * 64, tp)     # pad_vocab_size(vocab, 64) / tp
    n_tables = 1 if model.tie_word_embeddings else 2                # MTP shares both with the target
    embeddings = n_tables * vocab_per_rank * model.hidden_size * act_bytes
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim + \
        model.linear_num_value_heads * model.linear_value_head_dim
    small = (model.num_linear_attention_layers * (conv_dim // tp * model.linear_conv_kernel_dim
                                                   + 2 * model.linear_num_value_heads // tp
                                                   + model.linear_value_head_dim)
             + (model.num_hidden_layers + model.mtp_num_hidden_layers) * 2 * model.hidden_size
             + model.num_full_attention_layers * 2 * model.head_dim) * act_bytes
    if include_vision:
        parts["vision"] += _vision_other_params(model) * act_bytes
    return Weights(layers=parts["layers"], embeddings=embeddings, mtp=parts["mtp"],
                   vision=parts["vision"], small=small)


def tp_quantization_problem(model: ModelConfig, tp: int) -> str | None:
    """Why quantized layers cannot be split tp ways (group or Marlin tile misalignment), or None."""
    q = model.quantization
    if q is None:
        return None
    for lin in linears(model, tp, include_vision=False):
        if not is_quantized(model, lin):
            continue
        if q.group_size > 0 and lin.in_features % q.group_size:
            return (f"{lin.name.split('.', 4)[-1]} would get {lin.in_features} input features per GPU, "
                    f"not a multiple of the {q.method.upper()} group size {q.group_size}")
        if lin.out_features % MARLIN_TILE_N:
            return (f"{lin.name.split('.', 4)[-1]} would get {lin.out_features} output features per GPU, "
                    f"not a multiple of {MARLIN_TILE_N} (Marlin)")
    return None


# ---- activations and CUDA graphs ------------------------------------------------------------------

def activation_bytes(model: ModelConfig, tp: int, max_num_batched_tokens: int, max_num_seqs: int,
                     num_spec: int, act_bytes: int) -> int:
    """Torch peak of vLLM's profile run (one forward of max_num_batched_tokens dummy tokens).

    Live at the MLP of one layer: residual + normed input (fp32 inside RMSNorm) + gate_up output +
    activation output + down output; GDN layers keep their qkvz projection and FLA's per-chunk
    (dk x dv) fp32 states; the sampler's dummy run holds fp32 logits for every decode query.
    """
    t = max_num_batched_tokens
    h, inter = model.hidden_size, model.intermediate_size
    per_token = act_bytes * (4 * h + 3 * inter // tp)
    if model.num_linear_attention_layers:
        key_dim = model.linear_num_key_heads * model.linear_key_head_dim
        value_dim = model.linear_num_value_heads * model.linear_value_head_dim
        per_token = max(per_token, act_bytes * (4 * h + 2 * (2 * key_dim + 2 * value_dim) // tp))
        gdn_chunks = cdiv(t, GDN_CHUNK) * (model.linear_num_value_heads // tp) * \
            model.linear_key_head_dim * model.linear_value_head_dim * 4
    else:
        gdn_chunks = 0
    logits = max_num_seqs * (1 + num_spec) * model.vocab_size * 4 * 2
    return t * per_token + gdn_chunks + logits + ACTIVATION_FIXED_MIB * MIB


def cudagraph_capture_sizes(max_num_seqs: int, num_spec: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM 0.21's default list (config/vllm.py _set_cudagraph_sizes)."""
    decode_query_len = 1 + num_spec
    max_size = min(max_num_seqs * decode_query_len * 2, 512, max_num_batched_tokens)
    sizes = [i for i in (1, 2, 4) if i <= max_size]
    if max_size >= 8:
        sizes += list(range(8, min(max_size + 1, 256), 8))
    if max_size >= 256:
        sizes += list(range(256, max_size + 1, 16))
    if max_num_batched_tokens <= max_size and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def full_decode_sizes(sizes: list[int], num_spec: int) -> list[int]:
    """FULL decode graphs with spec decode are rounded up to multiples of 1+K (compilation.py)."""
    m = 1 + num_spec
    if m <= 1 or not sizes:
        return list(sizes)
    top = sizes[-1]
    out = sorted({cdiv(s, m) * m for s in sizes if cdiv(s, m) * m <= top})
    return out or ([m] if m <= top else [])


def cudagraph_bytes(model: ModelConfig, graphs: dict[str, int], largest: int, act_bytes: int) -> int:
    """vLLM's estimate: first capture of the largest size + per-graph cost x the rest, per mode."""
    if not any(graphs.values()):
        return 0
    pieces = model.num_hidden_layers + model.mtp_num_hidden_layers + 1
    first = CUDAGRAPH_BASE_MIB * MIB + largest * pieces * model.hidden_size * act_bytes * 3
    rest = sum(CUDAGRAPH_PER_GRAPH_MIB[mode] * MIB * max(0, n - 1) for mode, n in graphs.items())
    return first + rest


# ---- the KV + GDN state pool -----------------------------------------------------------------------

@dataclass(frozen=True)
class KvLayout:
    block_size: int                # tokens per block (after hybrid alignment)
    page_bytes: int                # bytes per block per layer (attention page == padded state page)
    group_size: int                # layers sharing one pool tensor: pool block = page x group_size
    attention_groups: int
    state_groups: int              # GDN groups
    state_blocks_per_seq: int      # blocks each GDN group holds per running sequence
    attn_token_bytes: int          # per layer per token
    state_page_bytes: int          # unpadded GDN state per layer per sequence

    @property
    def pool_block_bytes(self) -> int:
        return self.page_bytes * self.group_size

    def blocks_per_request(self, max_model_len: int) -> int:
        return self.attention_groups * cdiv(max_model_len, self.block_size) + \
            self.state_groups * self.state_blocks_per_seq

    def bytes_for(self, max_model_len: int, num_seqs: int) -> int:
        return num_seqs * self.blocks_per_request(max_model_len) * self.pool_block_bytes

    def state_bytes_per_seq(self) -> int:
        return self.state_groups * self.state_blocks_per_seq * self.pool_block_bytes

    def kv_bytes_per_token(self) -> float:
        return self.attention_groups * self.pool_block_bytes / self.block_size

    def max_len_for(self, available: int, num_seqs: int) -> int:
        """Largest max_model_len whose num_seqs requests fit in `available` bytes (0 if none)."""
        per_seq_blocks = available // (self.pool_block_bytes * num_seqs)
        attn_blocks = per_seq_blocks - self.state_groups * self.state_blocks_per_seq
        if attn_blocks <= 0 or self.attention_groups == 0:
            return 0
        return attn_blocks // self.attention_groups * self.block_size

    def tokens_in(self, available: int, max_model_len: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" (max concurrency x max_model_len)."""
        num_blocks = available // self.pool_block_bytes
        return int(num_blocks / self.blocks_per_request(max_model_len) * max_model_len)

    def to_dict(self) -> dict:
        return asdict(self)


def state_shapes(model: ModelConfig, tp: int, num_spec: int) -> tuple[int, int]:
    """(conv elements, ssm elements) of one GDN layer's state for one sequence on one rank."""
    conv_dim = model.linear_num_key_heads * model.linear_key_head_dim * 2 + \
        model.linear_num_value_heads * model.linear_value_head_dim
    conv = conv_dim // tp * (model.linear_conv_kernel_dim - 1 + num_spec)
    ssm = model.linear_num_value_heads // tp * model.linear_value_head_dim * model.linear_key_head_dim
    return conv, ssm


def kv_layout(model: ModelConfig, tp: int, num_spec: int, kv_cache_dtype: str, model_dtype: str,
              prefix_caching: bool) -> KvLayout:
    attn_layers = model.num_full_attention_layers + model.mtp_num_hidden_layers
    kv_bytes = dtype_bytes(model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype)
    attn_token = 2 * kv_heads_per_rank(model, tp) * model.head_dim * kv_bytes
    gdn_layers = model.num_linear_attention_layers
    if gdn_layers == 0:
        return KvLayout(block_size=KERNEL_BLOCK_ALIGNMENT, page_bytes=KERNEL_BLOCK_ALIGNMENT * attn_token,
                        group_size=attn_layers, attention_groups=1 if attn_layers else 0, state_groups=0,
                        state_blocks_per_seq=0, attn_token_bytes=attn_token, state_page_bytes=0)
    conv, ssm = state_shapes(model, tp, num_spec)
    state_page = conv * dtype_bytes(model_dtype) + ssm * dtype_bytes(model.mamba_ssm_dtype)
    block = KERNEL_BLOCK_ALIGNMENT * cdiv(state_page, KERNEL_BLOCK_ALIGNMENT * attn_token)
    page = block * attn_token
    lo, hi = sorted((attn_layers, gdn_layers))
    group_size = hi if hi < lo * 1.5 else lo
    return KvLayout(block_size=block, page_bytes=page, group_size=group_size,
                    attention_groups=cdiv(attn_layers, group_size),
                    state_groups=cdiv(gdn_layers, group_size),
                    state_blocks_per_seq=(2 if prefix_caching else 1) + num_spec,
                    attn_token_bytes=attn_token, state_page_bytes=state_page)


# ---- the breakdown a plan carries (the plan JSON's "memory" object; to_dict() is that object) ------------

@dataclass(frozen=True)
class OutsideBudget:
    """What each rank uses outside gpu_memory_utilization's budget, MiB."""
    cuda_context_mib: int
    nccl_mib: int
    flashinfer_workspace_mib: int
    post_kv_slack_mib: int
    shared_gpu_headroom_mib: int

    @property
    def total_mib(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class WeightsGib:
    """Weights per rank by part, GiB."""
    layers: float
    embeddings: float
    mtp: float
    vision: float
    other: float


@dataclass(frozen=True)
class KvCacheGroups:
    """vLLM's KV cache groups: full attention (+MTP) and GDN state."""
    attention: int
    gdn: int


@dataclass(frozen=True)
class MemoryBreakdown:
    """One rank's memory under the plan (planner.size_memory). The field order is the JSON key order."""
    gpu_total_gib: float
    gpu_free_gib: float
    gpu_memory_utilization: float
    requested_gib: float
    outside_budget_gib: float
    outside_budget_mib: OutsideBudget
    weights_gib: float
    weights_breakdown_gib: WeightsGib
    activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    kv_cache_gib: float
    kv_cache_bytes: int
    kv_cache_tokens: int
    kv_safety_margin_gib: float
    kv_needed_gib: float                # vLLM's start condition: one max_model_len sequence (KV blocks + GDN state)
    kv_all_seqs_at_max_len_gib: float
    kv_bytes_per_token: float
    gdn_state_per_seq_gib: float
    num_gpu_blocks: int
    block_size: int
    page_size_bytes: int
    layers_per_pool_block: int
    kv_cache_groups: KvCacheGroups
    max_concurrency_at_max_len: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryBreakdown:
        """From the plan JSON's "memory" object; ValueError names the missing keys."""
        parts = {"outside_budget_mib": OutsideBudget, "weights_breakdown_gib": WeightsGib,
                 "kv_cache_groups": KvCacheGroups}
        kw = {name: _record(d[name], part, f"memory.{name}") for name, part in parts.items() if name in d}
        return _record({**d, **kw}, cls, "memory")


def _record(d: Any, cls: type, what: str) -> Any:
    if isinstance(d, cls):
        return d
    if not isinstance(d, Mapping):
        raise ValueError(f"the plan's {what} is a JSON {type(d).__name__}, not an object")
    missing = [f.name for f in fields(cls) if f.name not in d]
    if missing:
        raise ValueError(f"the plan's {what} lacks {', '.join(missing)}")
    return cls(**{f.name: d[f.name] for f in fields(cls)})


def gpu_memory_utilization(total_mib: int, free_mib: int, tp: int, flashinfer: bool) -> tuple[float, OutsideBudget]:
    """Fraction of the card vLLM may budget; what stays outside the budget, itemised (MiB)."""
    outside = OutsideBudget(cuda_context_mib=CUDA_CONTEXT_MIB,
                            nccl_mib=NCCL_MIB if tp > 1 else 0,
                            flashinfer_workspace_mib=FLASHINFER_WORKSPACE_MIB if flashinfer else 0,
                            post_kv_slack_mib=POST_KV_SLACK_MIB,
                            shared_gpu_headroom_mib=(SHARED_GPU_HEADROOM_MIB if total_mib - free_mib > SHARED_GPU_USED_MIB
                                                     else 0))
    budget_mib = free_mib - outside.total_mib
    util = math.floor(min(MAX_GPU_MEMORY_UTILIZATION, budget_mib / total_mib) * 1000) / 1000
    return util, outside
