"""Kernel microbenchmarks: turingbox GDN kernels vs vLLM 0.21's FLA Triton kernels on the
Qwen3.6-27B GDN shapes (16 key / 48 value heads of 128, split by TP=1/2/4).

Run on the GPU machine from the repository root (about 2-3 minutes, FLA autotuning included):
    PYTHONPATH=/tmp/site python3 bench/gpu/gdn_bench.py
Writes $OUT/gdn_bench.json and $OUT/gdn_bench.png (if matplotlib is importable; otherwise run
`python3 bench/gpu/gdn_bench.py --plot $OUT/gdn_bench.json` anywhere with matplotlib).
Times are per call of ONE layer, eager launches on one stream (what runs when vLLM's decode is
PIECEWISE, as on sm_75 with MTP), median of CUDA-event timings after warmup.
Prefill: chunk_gated_delta_rule, one sequence of L tokens with an initial state, fp16.
Decode: fused_sigmoid_gating_delta_rule_update, batch B, k+1 tokens per sequence, in place.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from gdn_common import HEAD_SPLITS, ensure_library, out_dir, vllm_kernels

BUDGET_S = 200.0
PREFILL_LENS = (2048, 8192, 32768)
DECODE_BATCHES = (1, 2, 4, 8)
SPEC_K = (3, 4)


def timed(fn, warmup=3, iters=20):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)  # us
    return statistics.median(times)


def prefill_flops(L, hv):
    # per chunk of 64 and value head (K = V = 128): KK^T, QK^T, W, U (2*64*64*128 each),
    # W S, Q S (2*64*128*128 each), P Vn (2*64*64*128), K^T Vn (2*64*128*128)
    per_chunk = 5 * 2 * 64 * 64 * 128 + 3 * 2 * 64 * 128 * 128
    return per_chunk * (L / 64) * hv


def bench_prefill(rows, fla_chunk, t_start):
    import torch
    import torch.nn.functional as F

    from turingbox_plugin.gdn import ops
    from turingbox_plugin.gdn.reference import l2norm

    for tp, (hk, hv) in HEAD_SPLITS.items():
        for L in PREFILL_LENS:
            if time.time() - t_start > BUDGET_S:
                rows.append({"kind": "prefill", "tp": tp, "L": L, "skipped": "time budget"})
                continue
            q = l2norm(torch.randn(1, L, hk, 128, device="cuda")).half()
            k = l2norm(torch.randn(1, L, hk, 128, device="cuda")).half()
            v = torch.randn(1, L, hv, 128, device="cuda").half()
            g = F.logsigmoid(torch.randn(1, L, hv, device="cuda") + 2.0)
            beta = torch.rand(1, L, hv, device="cuda")
            h0 = torch.randn(1, hv, 128, 128, device="cuda") * 0.05
            cu = torch.tensor([0, L], dtype=torch.int32, device="cuda")
            row = {"kind": "prefill", "tp": tp, "hk": hk, "hv": hv, "L": L,
                   "gflop": prefill_flops(L, hv) / 1e9}
            row["turbo_us"] = timed(lambda: ops.chunk_gated_delta_rule(
                q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu))
            if fla_chunk is not None:
                row["vllm_us"] = timed(lambda: fla_chunk(
                    q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu))
                row["speedup"] = row["vllm_us"] / row["turbo_us"]
            row["turbo_tflops"] = row["gflop"] * 1e3 / row["turbo_us"]   # GFLOP / µs = PFLOP/s; ×1e3 → TFLOP/s
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, g, beta


def bench_decode(rows, fla_decode, t_start):
    import torch

    from turingbox_plugin.gdn import ops

    for tp, (hk, hv) in HEAD_SPLITS.items():
        for kspec in SPEC_K:
            ntok = kspec + 1
            for B in DECODE_BATCHES:
                if time.time() - t_start > BUDGET_S:
                    rows.append({"kind": "decode", "tp": tp, "B": B, "k": kspec, "skipped": "time budget"})
                    continue
                T = B * ntok
                dev = "cuda"
                q = torch.randn(1, T, hk, 128, device=dev).half()
                k = torch.randn(1, T, hk, 128, device=dev).half()
                v = torch.randn(1, T, hv, 128, device=dev).half()
                a = torch.randn(T, hv, device=dev).half()
                b = torch.randn(T, hv, device=dev).half()
                A_log = torch.randn(hv, device=dev) * 0.5
                dt_bias = torch.randn(hv, device=dev).half()
                pool = torch.randn(B * ntok + 1, hv, 128, 128, device=dev) * 0.05
                idx = torch.arange(1, B * ntok + 1, dtype=torch.int32, device=dev).view(B, ntok)
                acc = torch.full((B,), 2, dtype=torch.int32, device=dev)
                cu = torch.arange(0, T + 1, ntok, dtype=torch.int32, device=dev)
                kw = dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v,
                          initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
                          ssm_state_indices=idx, num_accepted_tokens=acc,
                          use_qk_l2norm_in_kernel=True)
                # bytes: read 1 state + write ntok states per (seq, head), 64 KiB each
                state_bytes = B * hv * (1 + ntok) * 128 * 128 * 4
                row = {"kind": "decode", "tp": tp, "hk": hk, "hv": hv, "B": B, "k": kspec,
                       "state_mbytes": state_bytes / 1e6}
                row["turbo_us"] = timed(lambda: ops.fused_sigmoid_gating_delta_rule_update(**kw),
                                        warmup=5, iters=50)
                row["turbo_gbps"] = state_bytes / row["turbo_us"] / 1e3
                if fla_decode is not None:
                    row["vllm_us"] = timed(lambda: fla_decode(**kw), warmup=5, iters=50)
                    row["speedup"] = row["vllm_us"] / row["turbo_us"]
                rows.append(row)
                print(json.dumps(row), flush=True)


def plot(report: dict, path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"no plot: {exc}"
    rows = [r for r in report["rows"] if "turbo_us" in r]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for tp in sorted({r["tp"] for r in rows}):
        pre = [r for r in rows if r["kind"] == "prefill" and r["tp"] == tp]
        if pre:
            axes[0].plot([r["L"] for r in pre], [r["turbo_us"] / 1e3 for r in pre], "o-",
                         label=f"turbo TP={tp}")
            if all("vllm_us" in r for r in pre):
                axes[0].plot([r["L"] for r in pre], [r["vllm_us"] / 1e3 for r in pre], "x--",
                             label=f"vLLM FLA TP={tp}")
        for kspec in SPEC_K:
            dec = [r for r in rows if r["kind"] == "decode" and r["tp"] == tp and r["k"] == kspec]
            if dec:
                axes[1].plot([r["B"] for r in dec], [r["turbo_us"] for r in dec], "o-",
                             label=f"turbo TP={tp} k={kspec}")
                if all("vllm_us" in r for r in dec):
                    axes[1].plot([r["B"] for r in dec], [r["vllm_us"] for r in dec], "x--",
                                 label=f"vLLM TP={tp} k={kspec}")
    axes[0].set(xscale="log", yscale="log", xlabel="prefill tokens", ylabel="ms / layer",
                title="chunk_gated_delta_rule")
    axes[1].set(xlabel="batch (sequences)", ylabel="us / layer",
                title="spec-decode GDN step (k+1 tokens)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"GDN kernels on {report.get('device', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def main(argv) -> int:
    if len(argv) == 2 and argv[0] == "--plot":
        from pathlib import Path

        p = Path(argv[1])
        print(plot(json.loads(p.read_text()), p.with_suffix(".png")))
        return 0
    import torch

    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "library": ensure_library()}
    kernels, why = vllm_kernels()
    report["vllm_kernels"] = "ok" if kernels else why
    fla_chunk, fla_decode = kernels if kernels else (None, None)
    rows: list[dict] = []
    bench_decode(rows, fla_decode, t0)
    bench_prefill(rows, fla_chunk, t0)
    report["rows"] = rows
    report["seconds"] = round(time.time() - t0, 1)
    path = out_dir() / "gdn_bench.json"
    path.write_text(json.dumps(report, indent=1))
    report["plot"] = plot(report, out_dir() / "gdn_bench.png")
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path} ({report['seconds']} s); plot: {report['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
