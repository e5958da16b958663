"""The specialization sweep and the JIT report, against Triton's own binder and hook (no GPU needed).

The kernel below has the parameter kinds of vLLM 0.21's `_causal_conv1d_fwd_kernel` (pointers, a
`tl.int32`-annotated token count, a plain int, a constexpr, a fixed stride): the kernel issue 15
caught compiling after ready. Triton's binder for an sm_75 target tells which binaries the sweep's
variants select, exactly as a GPU launch would.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from turingbox_plugin import jit_report
from turingbox_plugin.jit_accounting import JitAccountant, compile_record
from turingbox_plugin.specializations import KernelRecord, LaunchRecorder, variants


@triton.jit
def conv_like_kernel(x_ptr, w_ptr, bias_ptr, o_ptr, n_seqs, seqlen: tl.int32, stride_x_token,
                     dim: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < seqlen * n_seqs
    x = tl.load(x_ptr + offs * stride_x_token, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs % dim, mask=mask, other=0.0)
    tl.store(o_ptr + offs, x * w, mask=mask)


ARGS = {name: i for i, name in enumerate(conv_like_kernel.arg_names)}


def binder():
    backend = make_backend(GPUTarget("cuda", 75, 32))
    return backend, create_function_from_signature(conv_like_kernel.signature, conv_like_kernel.params, backend)


def launch_args(seqlen: int, n_seqs: int, x: torch.Tensor) -> tuple[tuple, dict]:
    w = torch.empty(64, dtype=torch.float16)
    o = torch.empty(1024, dtype=torch.float16)
    return (x, w, None, o, n_seqs, seqlen, 4096), {"dim": 64, "BLOCK": 128, "num_warps": 4}


def spec_of(args, kwargs, name: str):
    _, bind = binder()
    _, specialization, _ = bind(*args, **kwargs)
    return specialization[ARGS[name]]


def test_batch_dependent_ints_are_the_ones_that_moved():
    rec = KernelRecord(conv_like_kernel, "conv_like_kernel")
    x = torch.empty(1024, dtype=torch.float16)
    for seqlen, n in ((37, 2), (41, 3), (45, 3)):      # only "other" token counts seen by warmup
        rec.add(*launch_args(seqlen, n, x))
    names = [rec.param_name(p) for p in rec.batch_dependent()]
    assert names == ["n_seqs", "seqlen"]               # stride and the constexprs stayed put
    assert len(rec.shapes) == 1                        # one stand-in launch; no tensor kept
    stub_args, _ = next(iter(rec.shapes.values()))
    assert not any(isinstance(a, torch.Tensor) for a in stub_args)


def test_variants_select_every_binary_a_batch_can_reach():
    rec = KernelRecord(conv_like_kernel, "conv_like_kernel")
    x = torch.empty(1024, dtype=torch.float16)
    rec.add(*launch_args(37, 2, x))
    rec.add(*launch_args(45, 3, x))
    rec.add(*launch_args(41, 2, x[1:]))                # an unaligned x: a second stand-in launch
    out = list(variants(rec, rec.batch_dependent()))
    assert len(out) == 2 * 9                           # 2 shapes x 3 classes ^ 2 ints
    seqlen_specs = {spec_of(a, k, "seqlen") for a, k, _ in out}
    n_specs = {spec_of(a, k, "n_seqs") for a, k, _ in out}
    # Triton 3.6: an annotated int keeps its type, value 1 still changes the key; a plain one becomes constexpr.
    assert seqlen_specs == {("i32", 1), ("i32", "D"), ("i32", "")}
    assert n_specs == {("constexpr", 1), ("i32", "D"), ("i32", "")}
    assert {spec_of(a, k, "stride_x_token") for a, k, _ in out} == {("i32", "D")}
    assert {spec_of(a, k, "x_ptr") for a, k, _ in out} == {("*fp16", "D"), ("*fp16", "")}
    # The real warmup launches selected only 2 of these 18 binaries.
    real = {(spec_of(*launch_args(s, n, t), "seqlen"), spec_of(*launch_args(s, n, t), "x_ptr"))
            for s, n, t in ((37, 2, x), (45, 3, x), (41, 2, x[1:]))}
    assert real == {(("i32", ""), ("*fp16", "D")), (("i32", ""), ("*fp16", ""))}


def test_recorder_patches_and_restores_jit_run():
    from triton.runtime.jit import JITFunction

    original = JITFunction.run
    rec = LaunchRecorder()
    x = torch.empty(1024, dtype=torch.float16)
    with rec.recording():
        assert JITFunction.run is not original
        for s in (37, 32):
            args, kwargs = launch_args(s, 2, x)
            with pytest.raises(Exception):             # no GPU driver here: the launch itself fails
                conv_like_kernel.run(*args, grid=(1,), warmup=False, **kwargs)
    assert JITFunction.run is original
    (record,) = rec.kernels.values()
    assert record.launches == 2 and [record.param_name(p) for p in record.batch_dependent()] == ["seqlen"]


def hook_kwargs(args, kwargs) -> dict:
    """What Triton passes its post-compile hook for this launch (JITFunction._call_hook, real code)."""
    backend, bind = binder()
    bound, specialization, options = bind(*args, **kwargs)
    from triton.runtime.jit import compute_cache_key

    key = compute_cache_key({}, specialization, options)
    options, signature, constexprs, attrs = conv_like_kernel._pack_args(backend, kwargs, bound, specialization,
                                                                        options)
    seen = {}
    conv_like_kernel._call_hook(lambda **kw: seen.update(kw), key, signature, 0, constexprs, options, [attrs], False)
    return seen


def test_compile_log_and_report_name_the_missed_argument(tmp_path):
    x = torch.empty(1024, dtype=torch.float16)
    log_path = tmp_path / "jit-keys-rank0.jsonl"
    acc = JitAccountant(key_log=str(log_path))
    for s in (37, 32):                                 # warmup saw "other" and "div16" token counts
        acc.record("conv_like_kernel", hook_kwargs(*launch_args(s, 2, x)))
    acc.mark_ready()
    acc.record("conv_like_kernel", hook_kwargs(*launch_args(1, 2, x)))     # a 1-token prefill after ready
    rows = [r for rows in jit_report.load(str(tmp_path)).values() for r in rows]
    assert [r["phase"] for r in rows] == ["warmup", "warmup", "after_ready"]
    assert rows[0]["params"]["seqlen"] == "i32" and rows[1]["params"]["seqlen"] == "i32:D"
    assert rows[0]["params"]["dim"] == "constexpr=64" and rows[0]["params"]["x_ptr"] == "*fp16:D"
    rep = jit_report.report(str(tmp_path))
    (miss,) = rep["ranks"]["0"]["misses"]
    assert list(miss["differs"]) == ["seqlen"]
    assert miss["differs"]["seqlen"]["warmup_had"] == ["i32", "i32:D"]
    text = jit_report.format_text(rep)
    assert "conv_like_kernel rank 0: seqlen=" in text and "warmup had: i32, i32:D" in text
    # The record of the same variant as a warmup one finds nothing missing.
    assert compile_record("k", "warmup", hook_kwargs(*launch_args(37, 2, x)))["params"] == rows[0]["params"]


def test_jit_report_cli(tmp_path):
    from turingbox_plugin.cli import main

    assert main(["jit-report", "--runtime-dir", str(tmp_path)]) == 0          # no logs, nothing after ready
    (tmp_path / "jit-keys-rank1.jsonl").write_text(
        '{"kernel": "k", "phase": "warmup", "params": {"n": "i32"}}\n'
        '{"kernel": "k", "phase": "after_ready", "params": {"n": "i32:D"}}\n')
    assert main(["jit-report", "--runtime-dir", str(tmp_path), "--json"]) == 1
    assert main(["jit-report", "--runtime-dir", str(tmp_path / "missing")]) == 2
