"""The fp32 references agree with each other: chunked (WY/UT) form == recurrent form."""

import pytest
import torch

from turingbox_plugin.gdn import reference as ref


def _inputs(T, hk, hv, K=128, V=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, hk, K, generator=gen)
    k = ref.l2norm(torch.randn(1, T, hk, K, generator=gen))
    v = torch.randn(1, T, hv, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, hv, generator=gen)) * 0.3
    beta = torch.rand(1, T, hv, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("hk,hv", [(2, 6), (1, 3), (4, 4)])
def test_chunked_equals_recurrent_varlen_with_states(hk, hv):
    lens = [70, 1, 64, 129]  # partial chunk, single token, exact chunk, >2 chunks
    T = sum(lens)
    q, k, v, g, beta = _inputs(T, hk, hv)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    h0 = torch.randn(len(lens), hv, 128, 128, generator=torch.Generator().manual_seed(1)) * 0.1
    o_r, s_r = ref.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    o_c, s_c = ref.chunked_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert o_r.shape == (1, T, hv, 128) and s_r.shape == (len(lens), hv, 128, 128)
    torch.testing.assert_close(o_c, o_r, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_c, s_r, rtol=1e-4, atol=1e-4)


def test_chunk_size_does_not_change_the_result():
    q, k, v, g, beta = _inputs(100, 1, 2, seed=3)
    a, sa = ref.chunked_gated_delta_rule(q, k, v, g, beta, chunk_size=64)
    b, sb = ref.chunked_gated_delta_rule(q, k, v, g, beta, chunk_size=16)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sa, sb, rtol=1e-4, atol=1e-4)


def test_gqa_mapping_uses_consecutive_value_heads_per_key_head():
    # Value heads 0..2 read key head 0; changing key head 1 must leave them untouched.
    q, k, v, g, beta = _inputs(20, 2, 6, seed=4)
    o1, _ = ref.recurrent_gated_delta_rule(q, k, v, g, beta)
    k2 = k.clone()
    k2[:, :, 1] = ref.l2norm(torch.randn_like(k2[:, :, 1]))
    o2, _ = ref.recurrent_gated_delta_rule(q, k2, v, g, beta)
    assert torch.equal(o1[:, :, :3], o2[:, :, :3])
    assert not torch.allclose(o1[:, :, 3:], o2[:, :, 3:])


def test_l2norm_flag_matches_prenormalised_inputs():
    q, k, v, g, beta = _inputs(30, 1, 1, seed=5)
    k_raw = k * 3.0
    a, _ = ref.recurrent_gated_delta_rule(q, k_raw, v, g, beta, use_qk_l2norm=True)
    b, _ = ref.recurrent_gated_delta_rule(ref.l2norm(q), k, v, g, beta)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_spec_decode_reference_matches_recurrent_and_stores_per_token_states():
    hk, hv, n_tok = 1, 3, 4
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2 * n_tok, hk, 128, generator=gen)
    k = torch.randn(1, 2 * n_tok, hk, 128, generator=gen)
    v = torch.randn(1, 2 * n_tok, hv, 128, generator=gen)
    a = torch.randn(2 * n_tok, hv, generator=gen)
    b = torch.randn(2 * n_tok, hv, generator=gen)
    A_log = torch.randn(hv, generator=gen) * 0.5
    dt_bias = torch.randn(hv, generator=gen)
    pool = torch.randn(20, hv, 128, 128, generator=gen) * 0.1
    idx = torch.tensor([[3, 4, 5, 6], [10, 11, 12, 0]], dtype=torch.int32)
    accepted = torch.tensor([2, 1], dtype=torch.int32)  # seq 0 starts from idx[0, 1] = 4
    cu = torch.tensor([0, n_tok, 2 * n_tok], dtype=torch.int32)
    o, new_pool = ref.spec_decode_gated_delta_rule(
        A_log, a, b, dt_bias, q, k, v, pool, cu, idx, accepted, use_qk_l2norm=True
    )
    g, beta = ref.gdn_gating(A_log, a, dt_bias, b)
    for n, (s, first) in enumerate([(0, 4), (n_tok, 10)]):
        o_r, _ = ref.recurrent_gated_delta_rule(
            q[:, s : s + n_tok], k[:, s : s + n_tok], v[:, s : s + n_tok],
            g[None, s : s + n_tok], beta[None, s : s + n_tok],
            initial_state=pool[first][None], use_qk_l2norm=True,
        )
        torch.testing.assert_close(o[:, s : s + n_tok], o_r, rtol=1e-5, atol=1e-5)
    # State after token i of seq 0 lands in idx[0, i]; the NULL slot 0 is never written.
    _, s1 = ref.recurrent_gated_delta_rule(
        q[:, :2], k[:, :2], v[:, :2], g[None, :2], beta[None, :2],
        initial_state=pool[4][None], use_qk_l2norm=True,
    )
    torch.testing.assert_close(new_pool[4], s1[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(new_pool[0], pool[0])
    assert torch.equal(new_pool[19], pool[19])
