"""The ctypes wrappers build exactly the argument lists the C entry points take, and the real
library (loaded without a GPU) validates them before touching CUDA."""

import ctypes

import pytest
import torch

from turingbox_plugin.gdn import library, ops


def _prefill_tensors(B=1, T=70, hk=2, hv=6, K=128, dtype=torch.float16):
    q = torch.randn(B, T, hk, K).to(dtype)
    k = torch.randn(B, T, hk, K).to(dtype)
    v = torch.randn(B, T, hv, 128).to(dtype)
    g = torch.randn(B, T, hv)
    beta = torch.rand(B, T, hv)
    o = torch.empty_like(v)
    return q, k, v, g, beta, o


def _ctypes_roundtrip(argtypes, args):
    """Call a Python callback through a C prototype with `argtypes`: ctypes converts every
    argument exactly as it will for the real entry point and raises on a mismatch."""
    seen = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)
    cb = proto(lambda *xs: seen.append(xs) or 0)
    assert cb(*args) == 0
    return seen[0]


def test_prefill_args_match_the_c_prototype_and_strides():
    q, k, v, g, beta, o = _prefill_tensors()
    ws = torch.empty(16, dtype=torch.uint8)
    cu = torch.tensor([0, 30, 70], dtype=torch.int64)
    h0 = torch.zeros(2, 6, 128, 128)
    args, keep, final = ops.prefill_launch_args(q, k, v, g, beta, None, h0, True, cu, o, ws, 1234)
    assert len(args) == len(library.CHUNK_FWD_ARGTYPES)
    got = _ctypes_roundtrip(library.CHUNK_FWD_ARGTYPES, args)
    # dtype fp16, token/head strides of contiguous [1, T, H, 128] tensors
    assert got[0] == 0
    assert got[6:12] == (2 * 128, 128, 2 * 128, 128, 6 * 128, 128)
    # cu_seqlens converted to int32, N = 2 sequences, T, Hk, Hv, K, V, default scale
    cu32 = keep[5]
    assert cu32.dtype == torch.int32 and got[12] == cu32.data_ptr()
    assert got[13:19] == (2, 70, 2, 6, 128, 128)
    assert got[19] == pytest.approx(128 ** -0.5)
    assert final.shape == (2, 6, 128, 128) and final.dtype == torch.float32
    assert got[21] == final.data_ptr() and got[22] == o.data_ptr()
    assert got[23:25] == (6 * 128, 128) and got[-1] == 1234


def test_prefill_batch_is_folded_into_one_varlen_sequence_set():
    q, k, v, g, beta, o = _prefill_tensors(B=3, T=10)
    args, keep, final = ops.prefill_launch_args(
        q, k, v, g, beta, 0.5, None, False, None, o, torch.empty(1, dtype=torch.uint8), 0
    )
    assert keep[5].tolist() == [0, 10, 20, 30]
    assert args[13] == 3 and args[14] == 30 and args[20] is None and final is None
    assert args[19] == 0.5


def test_prefill_accepts_strided_views_and_copies_only_when_needed():
    x = torch.randn(1, 9, 2 * 128 + 6 * 128 + 4).half()  # like a slice of the conv output
    q = x[..., :256].unflatten(-1, (2, 128))
    v = x[..., 256 : 256 + 768].unflatten(-1, (6, 128))
    g, beta = torch.randn(1, 9, 6), torch.rand(1, 9, 6)
    o = torch.empty(1, 9, 6, 128, dtype=torch.float16)
    args, keep, _ = ops.prefill_launch_args(
        q, q, v, g, beta, None, None, False, None, o, torch.empty(1, dtype=torch.uint8), 0
    )
    assert args[1] == q.data_ptr() and args[6] == x.stride(1)  # no copy, row stride kept
    qh = torch.randn(1, 2, 9, 128).half().transpose(1, 2)  # head-major: strides suffice
    args, keep, _ = ops.prefill_launch_args(
        qh, qh, v, g, beta, None, None, False, None, o, torch.empty(1, dtype=torch.uint8), 0
    )
    assert args[1] == qh.data_ptr() and args[6:8] == (128, 9 * 128)
    qt = torch.randn(1, 9, 128, 2).half().transpose(2, 3)  # feature dim not unit-stride: copy
    args, keep, _ = ops.prefill_launch_args(
        qt, qt, v, g, beta, None, None, False, None, o, torch.empty(1, dtype=torch.uint8), 0
    )
    assert args[1] != qt.data_ptr() and args[6:8] == (2 * 128, 128)
    torch.testing.assert_close(keep[0].reshape(1, 9, 2, 128), qt, rtol=0, atol=0)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(K=64), "K == V == 128"),
        (dict(hk=4, hv=6), "multiple of key heads"),
        (dict(dtype=torch.float32), "float16 or bfloat16"),
    ],
)
def test_prefill_rejects_bad_shapes_with_one_sentence(change, message):
    q, k, v, g, beta, o = _prefill_tensors(**change)
    with pytest.raises(ValueError, match=message):
        ops.prefill_launch_args(q, k, v, g, beta, None, None, False, None, o,
                                torch.empty(1, dtype=torch.uint8), 0)


def test_prefill_rejects_state_of_wrong_shape():
    q, k, v, g, beta, o = _prefill_tensors()
    with pytest.raises(ValueError, match=r"initial_state must be \[N, Hv, V, K\]"):
        ops.prefill_launch_args(q, k, v, g, beta, None, torch.zeros(1, 6, 128, 128), True,
                                torch.tensor([0, 30, 70]), o, torch.empty(1, dtype=torch.uint8), 0)


def _decode_tensors(n=2, ntok=4, hk=2, hv=6):
    T = n * ntok
    q = torch.randn(1, T, hk, 128).half()
    k = torch.randn(1, T, hk, 128).half()
    v = torch.randn(1, T, hv, 128).half()
    a = torch.randn(T, hv).half()
    b = torch.randn(T, hv).half()
    A_log = torch.randn(hv)
    dt_bias = torch.randn(hv).half()
    # A state pool whose cache lines are padded (stride(0) > Hv*V*K), as vLLM's hybrid cache.
    pool = torch.zeros(5, hv * 128 * 128 + 64)[:, : hv * 128 * 128].view(5, hv, 128, 128)
    idx = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=torch.int32)
    acc = torch.tensor([1, 1], dtype=torch.int64)
    cu = torch.tensor([0, ntok, T], dtype=torch.int32)
    o = torch.empty(1, T, hv, 128, dtype=torch.float16)
    return dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, o=o, initial_state=pool,
                final_state=None, inplace=True, cu_seqlens=cu, ssm_state_indices=idx,
                num_accepted_tokens=acc, scale=None, softplus_beta=1.0, threshold=20.0,
                l2norm_flag=True, stream=99)


def test_spec_decode_args_match_the_c_prototype():
    t = _decode_tensors()
    args, keep = ops.spec_decode_launch_args(**t)
    assert len(args) == len(library.SPEC_DECODE_ARGTYPES)
    got = _ctypes_roundtrip(library.SPEC_DECODE_ARGTYPES, args)
    assert got[2] == 0 and got[4] == 1 and got[7] == 1 and got[10] == 1  # f32 A_log, f16 a/b/dt
    pool = t["initial_state"]
    assert got[21] == pool.data_ptr() and got[22] == pool.stride(0) == 6 * 128 * 128 + 64
    assert got[23] == pool.data_ptr()  # in place
    assert got[26:28] == (2, 8)
    assert got[29] == 0 and got[30:32] == (4, 1)  # int32 indices, [N, k+1] strides
    assert keep[7].dtype == torch.int32 and got[32] == keep[7].data_ptr()
    assert got[33:37] == (2, 6, 128, 128) and got[-3:-1] == (1, 1) and got[-1] == 99


def test_spec_decode_rejects_in_place_without_indices_and_non_f32_state():
    t = _decode_tensors()
    t["ssm_state_indices"] = None
    with pytest.raises(ValueError, match="needs ssm_state_indices"):
        ops.spec_decode_launch_args(**t)
    t = _decode_tensors()
    t["initial_state"] = t["initial_state"].half()
    with pytest.raises(ValueError, match="must be float32"):
        ops.spec_decode_launch_args(**t)


def test_real_library_loads_without_gpu_and_validates_before_cuda(gdn_library):
    lib = library.load_library(gdn_library)
    assert lib.tb_gdn_abi_version() == library.ABI_VERSION
    ws = lib.tb_gdn_chunk_workspace_bytes(1000, 48)
    assert ws >= 1000 * 48 * (128 * 2 * 2 + 64 * 2 + 4)
    q, k, v, g, beta, o = _prefill_tensors()
    small = torch.empty(16, dtype=torch.uint8)
    args, keep, _ = ops.prefill_launch_args(q, k, v, g, beta, None, None, False, None, o, small, 0)
    # The wrapper's arguments reach the C code: a too-small workspace is refused (-3) and
    # the message comes from the library.
    code = lib.tb_gdn_chunk_fwd(*args)
    assert code == -3
    with pytest.raises(RuntimeError, match="workspace too small"):
        library.check(lib, code, "prefill")
    bad = list(args)
    bad[17] = 64  # K
    assert lib.tb_gdn_chunk_fwd(*bad) == -1
    bad = list(args)
    bad[0] = 7
    bad[26] = lib.tb_gdn_chunk_workspace_bytes(70, 6)
    assert lib.tb_gdn_chunk_fwd(*bad) == -4
    t = _decode_tensors()
    dargs, dkeep = ops.spec_decode_launch_args(**t)
    bad = list(dargs)
    bad[28] = None  # in place without indices
    assert lib.tb_gdn_spec_decode(*bad) == -5


def test_missing_library_is_reported_with_its_path(tmp_path):
    missing = tmp_path / "nope.so"
    with pytest.raises(library.GdnLibraryError, match=str(missing)):
        library.load_library(missing)
    assert library.library_path({library.ENV_LIB: str(missing)}) == missing
