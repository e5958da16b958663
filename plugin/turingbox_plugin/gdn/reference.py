"""PyTorch fp32 references for the Gated DeltaNet kernels (the ground truth of the tests).

Conventions follow vLLM 0.21 / FLA: q, k [1, T, Hk, K]; v [1, T, Hv, V]; g (log gate) and beta
[1, T, Hv]; states [N, Hv, V, K] (FLA keeps the state transposed, h[v][k]); value head hv reads
key head hv // (Hv // Hk); varlen batches through cu_seqlens [N + 1].

Per token (the recurrent form):   h = e^g h;  h += beta (v - h k) k^T;  o = h (scale q)
The chunked form (what the CUDA prefill computes, chunk C = 64) is in `chunked_gated_delta_rule`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """FLA's l2norm_fwd: x * rsqrt(sum(x^2) + eps), computed in fp32."""
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    hk = x.shape[-2]
    if hv % hk:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk})")
    return x.repeat_interleave(hv // hk, dim=-2)


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def recurrent_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False
):
    """Naive token-by-token recurrence in fp32. Returns (o fp32 [1,T,Hv,V], final [N,Hv,V,K])."""
    assert q.shape[0] == 1, "flatten batches into one varlen sequence (B == 1)"
    hv = v.shape[-2]
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    qf, kf = _expand_heads(qf, hv), _expand_heads(kf, hv)
    vf, gf, bf = v[0].float(), g[0].float(), beta[0].float()
    bounds = _bounds(cu_seqlens, q.shape[1])
    o = torch.zeros_like(vf)
    finals = []
    for n, (s, e) in enumerate(bounds):
        if initial_state is not None:
            h = initial_state[n].float().clone()
        else:
            h = torch.zeros(hv, v.shape[-1], K, dtype=torch.float32, device=q.device)
        for t in range(s, e):
            h = h * torch.exp(gf[t])[:, None, None]
            kv = torch.einsum("hvk,hk->hv", h, kf[t])
            delta = (vf[t] - kv) * bf[t][:, None]
            h = h + delta[:, :, None] * kf[t][:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", h, qf[t] * scale)
        finals.append(h)
    return o.unsqueeze(0), torch.stack(finals)


def chunked_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_size=64,
    use_qk_l2norm=False,
):
    """The chunked (WY / UT transform) form in fp32, step for step as the CUDA prefill."""
    assert q.shape[0] == 1
    hv = v.shape[-2]
    K, V = q.shape[-1], v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    qf, kf = _expand_heads(qf, hv), _expand_heads(kf, hv)
    vf, gf, bf = v[0].float(), g[0].float(), beta[0].float()
    o = torch.zeros_like(vf)
    finals = []
    C = chunk_size
    for n, (s, e) in enumerate(_bounds(cu_seqlens, q.shape[1])):
        if initial_state is not None:
            S = initial_state[n].float().clone()  # [Hv, V, K]
        else:
            S = torch.zeros(hv, V, K, dtype=torch.float32, device=q.device)
        for c0 in range(s, e, C):
            c1 = min(c0 + C, e)
            L = c1 - c0
            Kc = kf[c0:c1].transpose(0, 1)  # [Hv, L, K]
            Qc = qf[c0:c1].transpose(0, 1)
            Vc = vf[c0:c1].transpose(0, 1)  # [Hv, L, V]
            G = gf[c0:c1].transpose(0, 1).cumsum(-1)  # [Hv, L]
            B = bf[c0:c1].transpose(0, 1)
            decay = torch.exp(G[:, :, None] - G[:, None, :])
            strict = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(-1)
            incl = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
            A = (B[:, :, None] * (Kc @ Kc.transpose(1, 2)) * decay).masked_fill(~strict, 0)
            eye = torch.eye(L, device=q.device).expand(hv, L, L)
            T = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
            W = T @ (Kc * (B * torch.exp(G))[:, :, None])
            U = T @ (Vc * B[:, :, None])
            Vn = U - W @ S.transpose(1, 2)  # [Hv, L, V]
            P = ((Qc @ Kc.transpose(1, 2)) * decay).masked_fill(~incl, 0)
            Oc = scale * (torch.exp(G)[:, :, None] * (Qc @ S.transpose(1, 2)) + P @ Vn)
            o[c0:c1] = Oc.transpose(0, 1)
            glast = G[:, -1]
            Vd = Vn * torch.exp(glast[:, None] - G)[:, :, None]
            S = S * torch.exp(glast)[:, None, None] + Vd.transpose(1, 2) @ Kc
        finals.append(S)
    return o.unsqueeze(0), torch.stack(finals)


def gdn_gating(A_log, a, dt_bias, b, softplus_beta=1.0, threshold=20.0):
    """(g, beta) as the fused sigmoid-gating kernels compute them, in fp32."""
    x = a.float() + dt_bias.float()
    sp = torch.where(softplus_beta * x <= threshold, F.softplus(x, beta=softplus_beta), x)
    g = -torch.exp(A_log.float()) * sp
    return g, torch.sigmoid(b.float())


def spec_decode_gated_delta_rule(
    A_log, a, b, dt_bias, q, k, v, state_pool, cu_seqlens, ssm_state_indices,
    num_accepted_tokens=None, scale=None, use_qk_l2norm=True,
):
    """Reference of `fused_sigmoid_gating_delta_rule_update` with in-place per-token states.

    Returns (o fp32 [1, T, Hv, V], new_pool) where new_pool is a copy of state_pool with the
    state after token i of sequence n stored at ssm_state_indices[n, i] (when that index > 0).
    Sequences whose initial index is <= 0 are skipped (their outputs stay 0).
    """
    hv = v.shape[-2]
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    qf, kf = _expand_heads(qf, hv), _expand_heads(kf, hv)
    vf = v[0].float()
    g, beta = gdn_gating(A_log, a.reshape(-1, hv), dt_bias, b.reshape(-1, hv))
    pool = state_pool.clone()
    idx = ssm_state_indices if ssm_state_indices.dim() == 2 else ssm_state_indices[:, None]
    o = torch.zeros_like(vf)
    for n, (s, e) in enumerate(_bounds(cu_seqlens, q.shape[1])):
        if e == s:
            continue
        first = int(num_accepted_tokens[n]) - 1 if num_accepted_tokens is not None else 0
        src = int(idx[n, first])
        if src <= 0:
            continue
        h = state_pool[src].float().clone()
        for i, t in enumerate(range(s, e)):
            h = h * torch.exp(g[t])[:, None, None]
            kv = torch.einsum("hvk,hk->hv", h, kf[t])
            h = h + ((vf[t] - kv) * beta[t][:, None])[:, :, None] * kf[t][:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", h, qf[t] * scale)
            dst = int(idx[n, i])
            if dst > 0:
                pool[dst] = h.to(pool.dtype)
    return o.unsqueeze(0), pool
