"""GPU correctness of the turingbox GDN kernels AND vLLM 0.21's FLA kernels against the fp32
PyTorch reference (plugin/turingbox_plugin/gdn/reference.py).

Run on the GPU machine from the repository root (a few minutes on a cold Triton cache):
    PYTHONPATH=/tmp/site python3 bench/gpu/gdn_correctness.py
Builds the library first if needed (plugin/build_gdn.sh). Writes $OUT/gdn_correctness.json and
prints one line per case; exits 1 if any turingbox case is outside tolerance.

Tolerances (relative L2 error ||x - ref|| / ||ref|| against fp32 math on the same rounded
inputs): output 1e-2 (fp16) / 2e-2 (bf16); final state 1e-2 / 2e-2. The kernels use f16
operands with f32 accumulation like FLA, so FLA's own error is printed alongside.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from gdn_common import HEAD_SPLITS, ensure_library, out_dir, vllm_kernels

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("inf")
    return float((x - ref).norm() / ref.norm().clamp_min(1e-12))


def prefill_inputs(lens, hk, hv, dtype, seed, l2norm_in_kernel=False):
    from turingbox_plugin.gdn.reference import l2norm

    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, hk, 128, device="cuda", generator=gen)
    k = torch.randn(1, T, hk, 128, device="cuda", generator=gen)
    if not l2norm_in_kernel:  # vLLM normalises before the call (fused_post_conv_prep)
        q, k = l2norm(q), l2norm(k)
    v = torch.randn(1, T, hv, 128, device="cuda", generator=gen)
    g = F.logsigmoid(torch.randn(1, T, hv, device="cuda", generator=gen) + 2.0)
    beta = torch.sigmoid(torch.randn(1, T, hv, device="cuda", generator=gen))
    h0 = torch.randn(len(lens), hv, 128, 128, device="cuda", generator=gen) * 0.05
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta, h0, cu


def check_prefill(results, fla_chunk):
    from turingbox_plugin.gdn import ops, reference

    lens = [1, 63, 64, 65, 200, 700]
    for tp, (hk, hv) in HEAD_SPLITS.items():
        for dtype in (torch.float16, torch.bfloat16):
            for l2 in (False, True):
                if l2 and tp != 4:
                    continue
                case = {"kind": "prefill", "tp": tp, "hk": hk, "hv": hv, "dtype": str(dtype),
                        "lens": lens, "l2norm_in_kernel": l2}
                try:
                    q, k, v, g, beta, h0, cu = prefill_inputs(lens, hk, hv, dtype, 10 * tp, l2)
                    o_ref, s_ref = reference.recurrent_gated_delta_rule(
                        q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, use_qk_l2norm=l2)
                    o, s = ops.chunk_gated_delta_rule(
                        q, k, v, g, beta, initial_state=h0.clone(), output_final_state=True,
                        cu_seqlens=cu, use_qk_l2norm_in_kernel=l2)
                    torch.cuda.synchronize()
                    case.update(turbo_o=rel_l2(o, o_ref), turbo_state=rel_l2(s, s_ref),
                                turbo_o_maxabs=float((o.float() - o_ref).abs().max()))
                    if fla_chunk is not None and tp == 1:
                        fo, fs = fla_chunk(q, k, v, g, beta, initial_state=h0.clone(),
                                           output_final_state=True, cu_seqlens=cu,
                                           use_qk_l2norm_in_kernel=l2)
                        torch.cuda.synchronize()
                        case.update(fla_o=rel_l2(fo, o_ref), fla_state=rel_l2(fs, s_ref))
                    tol = TOL[dtype]
                    case["tol"] = tol
                    case["ok"] = case["turbo_o"] <= tol and case["turbo_state"] <= tol
                except Exception:  # noqa: BLE001
                    case.update(ok=False, error=traceback.format_exc()[-1500:])
                results.append(case)
                print(json.dumps(case), flush=True)


def decode_inputs(batch, ntok, hk, hv, dtype, seed, slots=64):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = batch * ntok
    dev = "cuda"
    q = torch.randn(1, T, hk, 128, device=dev, generator=gen).to(dtype)
    k = torch.randn(1, T, hk, 128, device=dev, generator=gen).to(dtype)
    v = torch.randn(1, T, hv, 128, device=dev, generator=gen).to(dtype)
    a = torch.randn(T, hv, device=dev, generator=gen).to(dtype)
    b = torch.randn(T, hv, device=dev, generator=gen).to(dtype)
    A_log = torch.randn(hv, device=dev, generator=gen) * 0.5
    dt_bias = torch.randn(hv, device=dev, generator=gen).to(dtype)
    pool = torch.randn(slots, hv, 128, 128, device=dev, generator=gen) * 0.05
    perm = torch.randperm(slots - 1, generator=torch.Generator().manual_seed(seed))[: batch * ntok] + 1
    idx = perm.view(batch, ntok).to(torch.int32).to(dev)
    if batch > 1:
        idx[-1] = 0  # a padded (CUDA-graph) slot: NULL block, must be skipped
    accepted = torch.randint(1, ntok + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    accepted = accepted.to(torch.int32).to(dev)
    cu = torch.arange(0, T + 1, ntok, dtype=torch.int32, device=dev)
    return dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v), pool, idx, accepted, cu


def check_decode(results, fla_decode):
    from turingbox_plugin.gdn import ops, reference

    for tp, (hk, hv) in HEAD_SPLITS.items():
        for dtype in (torch.float16, torch.bfloat16):
            for batch, ntok in ((1, 4), (3, 4), (8, 5), (4, 1)):
                case = {"kind": "spec_decode", "tp": tp, "hk": hk, "hv": hv, "dtype": str(dtype),
                        "batch": batch, "tokens_per_seq": ntok}
                try:
                    t, pool, idx, acc, cu = decode_inputs(batch, ntok, hk, hv, dtype, 100 * tp + batch)
                    acc_arg = acc if ntok > 1 else None
                    idx_arg = idx if ntok > 1 else idx[:, 0].contiguous()
                    o_ref, pool_ref = reference.spec_decode_gated_delta_rule(
                        **t, state_pool=pool, cu_seqlens=cu, ssm_state_indices=idx_arg,
                        num_accepted_tokens=acc_arg, use_qk_l2norm=True)
                    valid = (idx[:, 0] > 0).repeat_interleave(ntok)
                    mine = pool.clone()
                    o, _ = ops.fused_sigmoid_gating_delta_rule_update(
                        **t, initial_state=mine, inplace_final_state=True, cu_seqlens=cu,
                        ssm_state_indices=idx_arg, num_accepted_tokens=acc_arg,
                        use_qk_l2norm_in_kernel=True)
                    torch.cuda.synchronize()
                    case.update(turbo_o=rel_l2(o[0][valid], o_ref[0][valid]),
                                turbo_state=rel_l2(mine, pool_ref),
                                untouched_slot0=bool(torch.equal(mine[0], pool[0])))
                    if fla_decode is not None and tp == 1:
                        theirs = pool.clone()
                        fo, _ = fla_decode(**t, initial_state=theirs, inplace_final_state=True,
                                           cu_seqlens=cu, ssm_state_indices=idx_arg,
                                           num_accepted_tokens=acc_arg,
                                           use_qk_l2norm_in_kernel=True)
                        torch.cuda.synchronize()
                        case.update(fla_o=rel_l2(fo[0][valid], o_ref[0][valid]),
                                    fla_state=rel_l2(theirs, pool_ref),
                                    turbo_vs_fla_o=rel_l2(o[0][valid], fo[0][valid]))
                    tol = TOL[dtype]
                    case["tol"] = tol
                    case["ok"] = (case["turbo_o"] <= tol and case["turbo_state"] <= tol
                                  and case["untouched_slot0"])
                except Exception:  # noqa: BLE001
                    case.update(ok=False, error=traceback.format_exc()[-1500:])
                results.append(case)
                print(json.dumps(case), flush=True)


def check_graph_capture(results):
    """Both entry points run inside a captured CUDA graph and replay to the eager result."""
    from turingbox_plugin.gdn import ops

    case = {"kind": "cuda_graph"}
    try:
        hk, hv = HEAD_SPLITS[4]
        t, pool, idx, acc, cu = decode_inputs(2, 4, hk, hv, torch.float16, 7)
        eager_pool = pool.clone()
        # Both outputs start equal: the kernels (ours and FLA's) leave a padded sequence's rows untouched, so
        # torch.empty outputs would differ there by whatever the allocator handed out.
        eager_o = torch.zeros(1, t["q"].shape[1], hv, 128, dtype=torch.float16, device="cuda")
        ops.fused_sigmoid_gating_delta_rule_update(
            **t, initial_state=eager_pool, cu_seqlens=cu, ssm_state_indices=idx,
            num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, out=eager_o)
        graph_pool = pool.clone()
        out = torch.zeros_like(eager_o)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm once outside the graph
            ops.fused_sigmoid_gating_delta_rule_update(
                **t, initial_state=pool.clone(), cu_seqlens=cu, ssm_state_indices=idx,
                num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, out=out)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ops.fused_sigmoid_gating_delta_rule_update(
                **t, initial_state=graph_pool, cu_seqlens=cu, ssm_state_indices=idx,
                num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, out=out)
        graph_pool.copy_(pool)
        g.replay()
        torch.cuda.synchronize()
        case["decode_equal"] = bool(torch.equal(out, eager_o) and torch.equal(graph_pool, eager_pool))
        q, k, v, gg, beta, h0, cu2 = prefill_inputs([100, 30], hk, hv, torch.float16, 3)
        eo, es = ops.chunk_gated_delta_rule(q, k, v, gg, beta, initial_state=h0,
                                            output_final_state=True, cu_seqlens=cu2)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            go, gs = ops.chunk_gated_delta_rule(q, k, v, gg, beta, initial_state=h0,
                                                output_final_state=True, cu_seqlens=cu2)
        g2.replay()
        torch.cuda.synchronize()
        case["prefill_equal"] = bool(torch.equal(go, eo) and torch.equal(gs, es))
        case["ok"] = case["decode_equal"] and case["prefill_equal"]
    except Exception:  # noqa: BLE001
        case.update(ok=False, error=traceback.format_exc()[-1500:])
    results.append(case)
    print(json.dumps(case), flush=True)


def main() -> int:
    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "library": ensure_library()}
    kernels, why = vllm_kernels()
    report["vllm_kernels"] = "ok" if kernels else why
    fla_chunk, fla_decode = kernels if kernels else (None, None)
    results: list[dict] = []
    # Graph capture and decode first: a cold Triton cache makes FLA's autotuned kernels take minutes
    # per new head geometry, so FLA is only compared at TP=1 and the cheap turingbox cases run first.
    for name, check in (("cuda_graph", lambda: check_graph_capture(results)),
                        ("spec_decode", lambda: check_decode(results, fla_decode)),
                        ("prefill", lambda: check_prefill(results, fla_chunk))):
        t_check = time.time()
        check()
        report.setdefault("check_seconds", {})[name] = round(time.time() - t_check, 1)
        print(f"# {name}: {report['check_seconds'][name]} s", flush=True)
    report["cases"] = results
    report["failed"] = sum(1 for r in results if not r.get("ok"))
    report["seconds"] = round(time.time() - t0, 1)
    path = out_dir() / "gdn_correctness.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{len(results) - report['failed']}/{len(results)} turingbox cases within tolerance; "
          f"vLLM kernels: {report['vllm_kernels']}; {report['seconds']} s; wrote {path}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
