#!/usr/bin/env python3
"""GPU evidence for the plugin (issue 4): turingbox worker vs plain `vllm serve`, same model and flags.

For each mode: start vLLM, time readiness, first-request TTFT vs the median of the next ten, run
`bench decode` and `bench prefill`, then read the worker status files (warmup seconds, kernels,
JIT after ready) and scan the log for vLLM's jit_monitor warnings. Writes $OUT/plugin-evidence.json,
one log per mode, bench JSONs and the prefill PNG; prints a short summary.

Run on the GPU machine (see bench/gpu/plugin_evidence.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import httpx

JIT_MONITOR_LINE = "Triton kernel JIT compilation during inference"


def serve_argv(args, mode: str, runtime_dir: str) -> list[str]:
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.model,
            "--host", "127.0.0.1", "--port", str(args.port), "--served-model-name", "demo",
            "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
            "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--limit-mm-per-prompt", '{"image":0,"video":0}', "--gdn-prefill-backend", "triton"]
    if args.load_format:
        argv += ["--load-format", args.load_format]
    if args.mtp > 0:
        spec = {"method": "mtp", "num_speculative_tokens": args.mtp}
        if args.synthetic_acceptance:
            spec.update(rejection_sample_method="synthetic", synthetic_acceptance_length=args.synthetic_acceptance)
        argv += ["--speculative-config", json.dumps(spec)]
    if mode == "plugin":
        cfg = {"turingbox": {"strict_warmup": True, "require_plugin": True, "benchmark_mode": True,
                             "runtime_dir": runtime_dir, "num_speculative_tokens": args.mtp}}
        argv += ["--worker-cls", "turingbox_plugin.worker.TuringboxWorker", "--additional-config", json.dumps(cfg)]
    return argv + args.extra


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200 and \
                    httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM not ready after {timeout:.0f} s")


def ttft(url: str, i: int, max_tokens: int) -> float:
    body = {"model": "demo", "messages": [{"role": "user", "content": f"Request {i}: tell me a short story."}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and '"choices":[{' in line.replace(" ", ""):
                first = time.perf_counter() - t0
    return first if first is not None else float("nan")


def run_mode(args, mode: str) -> dict:
    runtime_dir = os.path.join(args.out, f"runtime-{mode}")
    os.makedirs(runtime_dir, exist_ok=True)
    log_path = os.path.join(args.out, f"vllm-{mode}.log")
    env = dict(os.environ)
    if mode == "plain":
        env["VLLM_PLUGINS"] = ""          # the plugin installed but not loaded at all
    url = f"http://127.0.0.1:{args.port}"
    result: dict = {"mode": mode, "log": log_path}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_argv(args, mode, runtime_dir), stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            result["ready_seconds"] = round(wait_ready(url, proc, args.ready_timeout), 2)
            ttfts = [ttft(url, i, 8) for i in range(11)]
            result["first_ttft_s"] = round(ttfts[0], 4)
            result["next10_median_ttft_s"] = round(statistics.median(ttfts[1:]), 4)
            result["first_over_median"] = round(ttfts[0] / result["next10_median_ttft_s"], 3)
            for bench, extra in (("decode", ["--repeats", str(args.decode_repeats), "--max-tokens",
                                             str(args.decode_tokens)]),
                                 ("prefill", ["--lengths", args.prefill_lengths, "--requests", "8",
                                              "--plot", os.path.join(args.out, f"prefill-{mode}.png")])):
                out = os.path.join(args.out, f"bench-{bench}-{mode}.json")
                r = subprocess.run([sys.executable, "-m", "turingbox_plugin.cli", "bench", bench, "--url", url,
                                    "--output", out, *extra], capture_output=True, text=True, timeout=900)
                result[f"bench_{bench}"] = json.load(open(out)) if r.returncode == 0 else {"error": r.stderr[-500:]}
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = open(log_path, errors="replace").read()
    result["jit_monitor_warnings"] = [l for l in text.splitlines() if JIT_MONITOR_LINE in l]
    result["turingbox_log_lines"] = [l for l in text.splitlines() if "turingbox" in l][-12:]
    if mode == "plugin":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "plugin"))
        from turingbox_plugin.status import read_worker_status

        result["worker_status"] = read_worker_status(runtime_dir)
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/demo")
    p.add_argument("--mtp", type=int, default=3)
    p.add_argument("--synthetic-acceptance", type=float, default=3.0, help="0 = real rejection sampling")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--prefill-lengths", default="2048,4096,8192")
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--modes", default="plugin,plain")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--ready-timeout", type=float, default=420)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("extra", nargs="*", help="extra vllm serve flags (after --)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {"args": vars(args), "modes": []}
    for mode in args.modes.split(","):
        results["modes"].append(run_mode(args, mode))
        with open(os.path.join(args.out, "plugin-evidence.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
    print("mode    ready_s  first_ttft  next10_med  ratio  jit_monitor  decode_tok/s  prefill_tok/s  warmup_s  jit_after_ready")
    for m in results["modes"]:
        st = (m.get("worker_status") or [{}])
        wu = [s.get("warmup", {}) for s in st]
        dec = (m.get("bench_decode") or {}).get("summary", {})
        fit = (m.get("bench_prefill") or {}).get("fit", {})
        print(f"{m['mode']:7} {m.get('ready_seconds', '-'):>7}  {m.get('first_ttft_s', '-'):>10}  "
              f"{m.get('next10_median_ttft_s', '-'):>10}  {m.get('first_over_median', '-'):>5}  "
              f"{len(m['jit_monitor_warnings']):>11}  {dec.get('tok_per_s_median', '-'):>12}  "
              f"{fit.get('prefill_tokens_per_s', '-'):>13}  {[w.get('seconds') for w in wu]}  "
              f"{[s.get('jit_after_ready') for s in st]}")
        if m.get("error"):
            print(f"  error: {m['error']}")
        for line in m["turingbox_log_lines"][-4:]:
            print("  " + line[-200:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
