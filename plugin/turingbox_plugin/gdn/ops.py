"""torch wrappers around libturingbox_gdn.so with vLLM 0.21's GDN kernel contracts.

Each call launches on torch.cuda.current_stream() (so it can be captured in a CUDA graph),
allocates only through torch's caching allocator and never synchronises with the host.
The argument marshalling is split into pure functions (`prefill_launch_args`,
`spec_decode_launch_args`) that the CPU tests exercise with CPU tensors.
"""

from __future__ import annotations

import torch

from . import library
from .reference import l2norm

HEAD_DIM = 128
_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1}
_SCALAR_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _head_geometry(q, v) -> tuple[int, int, int, int]:
    """(B, T, key heads, value heads) of [B, T, H, 128] q and v; both kernels share these limits."""
    B, T, Hk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    if K != HEAD_DIM or V != HEAD_DIM:
        raise ValueError(f"turingbox GDN kernels need K == V == 128, got K={K}, V={V}.")
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk}).")
    return B, T, Hk, Hv


def _act_code(t: torch.Tensor, name: str) -> int:
    if t.dtype not in _DTYPE_CODE:
        raise ValueError(f"{name} must be float16 or bfloat16, not {t.dtype}.")
    return _DTYPE_CODE[t.dtype]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Make a [B, T, H, D] activation usable by the kernels: unit stride on D, even strides,
    4-byte aligned, and B folded into T (returned as [T_total, H, D] view)."""
    B, T, H, D = t.shape
    ok = (
        t.stride(3) == 1
        and t.stride(1) % 2 == 0
        and t.stride(2) % 2 == 0
        and t.data_ptr() % 4 == 0
        and (B == 1 or t.stride(0) == T * t.stride(1))
    )
    if not ok:
        t = t.contiguous()
    return t.as_strided((B * T, H, D), (t.stride(1), t.stride(2), 1))


def _flat_f32(t: torch.Tensor, rows: int, heads: int) -> torch.Tensor:
    return t.reshape(rows, heads).to(torch.float32).contiguous()


def prefill_launch_args(
    q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, o, workspace,
    stream: int,
):
    """Validate and build (args tuple, keepalive tensors, final_state) for tb_gdn_chunk_fwd.

    q, k: [B, T, Hk, 128]; v: [B, T, Hv, 128]; g, beta: [B, T, Hv]; cu_seqlens int [N + 1]
    (B must be 1) or None (B sequences of T tokens); initial_state [N, Hv, 128, 128] or None;
    o: the output tensor [B, T, Hv, 128] (contiguous, q's dtype).
    """
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q and k must be [B, T, Hk, K] and v [B, T, Hv, V]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    B, T, Hk, Hv = _head_geometry(q, v)
    K = V = HEAD_DIM
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    code = _act_code(q, "q")
    if g.shape != (B, T, Hv) or beta.shape != (B, T, Hv):
        raise ValueError(
            f"g and beta must be [B, T, Hv] = {(B, T, Hv)}; got {tuple(g.shape)}, {tuple(beta.shape)}."
        )
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1, not {B}.")
        cu = cu_seqlens.to(torch.int32).contiguous()
    else:
        cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)
    N = cu.numel() - 1
    if initial_state is not None:
        if tuple(initial_state.shape) != (N, Hv, V, K):
            raise ValueError(
                f"initial_state must be [N, Hv, V, K] = {(N, Hv, V, K)}, got {tuple(initial_state.shape)}."
            )
        h0 = initial_state.to(torch.float32).contiguous()
    else:
        h0 = None
    final = (
        torch.empty(N, Hv, V, K, dtype=torch.float32, device=q.device) if output_final_state else None
    )
    if o.shape != v.shape or o.dtype != q.dtype or not o.is_contiguous():
        raise ValueError("the output must be contiguous with v's shape and q's dtype.")
    qr, kr, vr = _rows(q), _rows(k), _rows(v)
    gr, br = _flat_f32(g, B * T, Hv), _flat_f32(beta, B * T, Hv)
    if scale is None:
        scale = K ** -0.5
    args = (
        code, qr.data_ptr(), kr.data_ptr(), vr.data_ptr(), gr.data_ptr(), br.data_ptr(),
        qr.stride(0), qr.stride(1), kr.stride(0), kr.stride(1), vr.stride(0), vr.stride(1),
        cu.data_ptr(), N, B * T, Hk, Hv, K, V, float(scale),
        h0.data_ptr() if h0 is not None else None,
        final.data_ptr() if final is not None else None,
        o.data_ptr(), Hv * V, V,
        workspace.data_ptr(), workspace.numel() * workspace.element_size(), stream,
    )
    keep = (qr, kr, vr, gr, br, cu, h0, final, o, workspace)
    return args, keep, final


def chunk_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    cu_seqlens=None, chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False,
    core_attn_out=None,
):
    """Drop-in for vllm...fla.ops.chunk_gated_delta_rule (chunk_indices/offsets are not needed:
    the kernel maps chunks to sequences itself). Returns (o, final_state or None)."""
    lib = library.load_library()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q).to(q.dtype), l2norm(k).to(k.dtype)
    if core_attn_out is not None:
        o = core_attn_out.reshape(-1)[: v.numel()].view(v.shape)
    else:
        o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    T_total = q.shape[0] * q.shape[1]
    ws = torch.empty(
        lib.tb_gdn_chunk_workspace_bytes(T_total, v.shape[2]), dtype=torch.uint8, device=q.device
    )
    stream = torch.cuda.current_stream(q.device).cuda_stream
    args, keep, final = prefill_launch_args(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, o, ws, stream
    )
    library.check(lib, lib.tb_gdn_chunk_fwd(*args), "chunk_gated_delta_rule")
    del keep
    return o, final


def spec_decode_launch_args(
    A_log, a, b, dt_bias, q, k, v, o, initial_state, final_state, inplace, cu_seqlens,
    ssm_state_indices, num_accepted_tokens, scale, softplus_beta, threshold, l2norm_flag,
    stream: int,
):
    """Validate and build (args tuple, keepalive) for tb_gdn_spec_decode."""
    B, T, Hk, Hv = _head_geometry(q, v)
    K = V = HEAD_DIM
    code = _act_code(q, "q")
    if initial_state is None:
        raise ValueError("the spec-decode kernel needs the state pool (initial_state).")
    for name, st in (("initial_state", initial_state), ("final_state", final_state)):
        if st is None:
            continue
        if st.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, not {st.dtype}.")
        if st.stride(-1) != 1 or st.stride(-2) != K or st.stride(-3) != V * K:
            raise ValueError(f"{name} must be contiguous inside each [Hv, V, K] slot.")
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1, not {B}.")
        cu = cu_seqlens.to(torch.int32).contiguous()
        N = cu.numel() - 1
    else:
        cu, N = None, B
    if inplace and ssm_state_indices is None:
        raise ValueError("an in-place state update needs ssm_state_indices.")
    idx = ssm_state_indices
    if idx is not None:
        if idx.dtype not in (torch.int32, torch.int64):
            idx = idx.to(torch.int32)
        idx_s_seq = idx.stride(0)
        idx_s_tok = idx.stride(1) if idx.dim() == 2 else 1
    else:
        idx_s_seq = idx_s_tok = 0
    acc = None
    if num_accepted_tokens is not None:
        acc = num_accepted_tokens.to(torch.int32).contiguous()
    a2 = a.reshape(-1, Hv)
    b2 = b.reshape(-1, Hv)
    if a2.stride(-1) != 1:
        a2 = a2.contiguous()
    if b2.stride(-1) != 1:
        b2 = b2.contiguous()
    qr, kr, vr = _rows(q), _rows(k), _rows(v)
    if scale is None:
        scale = K ** -0.5
    h0_stride = initial_state.stride(0)
    ht = final_state if final_state is not None else initial_state
    ht_stride = ht.stride(0)
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias), ("a", a2), ("b", b2)):
        if t.dtype not in _SCALAR_CODE:
            raise ValueError(f"{name} must be float32, float16 or bfloat16, not {t.dtype}.")
    args = (
        code, A_log.data_ptr(), _SCALAR_CODE[A_log.dtype], a2.data_ptr(), _SCALAR_CODE[a2.dtype],
        a2.stride(0), b2.data_ptr(), _SCALAR_CODE[b2.dtype], b2.stride(0),
        dt_bias.data_ptr(), _SCALAR_CODE[dt_bias.dtype],
        qr.data_ptr(), kr.data_ptr(), vr.data_ptr(),
        qr.stride(0), qr.stride(1), kr.stride(0), kr.stride(1), vr.stride(0), vr.stride(1),
        o.data_ptr(), initial_state.data_ptr(), h0_stride, ht.data_ptr(), ht_stride,
        cu.data_ptr() if cu is not None else None, N, T,
        idx.data_ptr() if idx is not None else None, 1 if (idx is not None and idx.dtype == torch.int64) else 0,
        idx_s_seq, idx_s_tok, acc.data_ptr() if acc is not None else None,
        Hk, Hv, K, V, float(scale), float(softplus_beta), float(threshold),
        1 if l2norm_flag else 0, 1 if inplace else 0, stream,
    )
    keep = (a2, b2, qr, kr, vr, cu, idx, acc, o, initial_state, ht)
    return args, keep


def fused_sigmoid_gating_delta_rule_update(
    A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None, initial_state=None,
    inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None,
    num_accepted_tokens=None, use_qk_l2norm_in_kernel=False, is_kda=False, out=None,
):
    """Drop-in for vllm...fla.ops.fused_sigmoid_gating_delta_rule_update (GDN, not KDA).
    Returns (o [B, T, Hv, V], final_state); `out` (contiguous [B, T, Hv, V]) avoids a copy."""
    if is_kda:
        raise NotImplementedError("the turingbox spec-decode kernel does not implement KDA gating.")
    lib = library.load_library()
    B, T = q.shape[:2]
    Hv, V, K = v.shape[2], v.shape[3], q.shape[3]
    if out is not None:
        if tuple(out.shape) != (B, T, Hv, V) or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {(B, T, Hv, V)} tensor of {q.dtype}.")
        o = out
    else:
        o = torch.empty(B, T, Hv, V, dtype=q.dtype, device=q.device)
    if inplace_final_state:
        final_state = initial_state
    else:
        final_state = torch.empty(B * T, Hv, V, K, dtype=initial_state.dtype, device=q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    args, keep = spec_decode_launch_args(
        A_log, a, b, dt_bias, q, k, v, o, initial_state,
        None if inplace_final_state else final_state, inplace_final_state, cu_seqlens,
        ssm_state_indices, num_accepted_tokens, scale, beta, threshold,
        use_qk_l2norm_in_kernel, stream,
    )
    library.check(lib, lib.tb_gdn_spec_decode(*args), "fused_sigmoid_gating_delta_rule_update")
    del keep
    return o, final_state
