#!/usr/bin/env python3
"""GPU machine: `turingbox serve` vs plain `vllm serve` with the same argv, side by side in one run.

Measures, for each server: time to ready, first-request TTFT vs the median of the next ten, decode tok/s
(through the sidecar and directly against turingbox's upstream, and against plain vLLM), and the KV cache
vLLM reports vs the plan's. With two GPUs the two servers start at the same time on separate GPUs; with one
they run one after the other. Writes JSON and logs to $OUT.

  python3 bench/gpu/side_by_side.py --model /tmp/demo --phase cold --out $OUT
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "Write a short story about a lighthouse keeper who discovers a message in a bottle."


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def post_json(port: int, path: str, body: dict, timeout: float = 300.0) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"POST {path} on :{port} -> {r.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def ttft(port: int, model: str, max_tokens: int = 8, temperature: float = 0.0) -> float:
    """Seconds from sending a streaming chat request to the first content chunk."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": temperature,
            "messages": [{"role": "user", "content": PROMPT}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"stream on :{port} -> {r.status}: {r.read()[:300]!r}")
    first = None
    while True:
        line = r.readline()
        if not line:
            break
        if first is None and line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                first = time.perf_counter() - t0
    conn.close()
    if first is None:
        raise RuntimeError(f"no content chunk from :{port}")
    return first


def decode_tps(port: int, model: str, repeats: int = 5, max_tokens: int = 256) -> dict:
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = post_json(port, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                   "temperature": 0.0, "ignore_eos": True})
        dt = time.perf_counter() - t0
        rates.append(out["usage"]["completion_tokens"] / dt)
    return {"tok_s": rates, "median_tok_s": statistics.median(rates)}


def wait_ready(port: int, path: str, proc: subprocess.Popen, limit: float, t0: float) -> float | None:
    """Seconds from the process's launch (t0) until `path` answers 200, or None."""
    while time.perf_counter() - t0 < limit:
        if proc.poll() is not None:
            return None
        try:
            status, _ = get(port, path, timeout=2)
            if status == 200:
                return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.5)
    return None


def kv_reported(log_path: str) -> dict:
    text = open(log_path, errors="replace").read()
    out = {}
    m = re.findall(r"Available KV cache memory: ([\d.]+) GiB", text)
    if m:
        out["available_kv_gib"] = float(m[-1])
    m = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
    if m:
        out["kv_tokens"] = int(m[-1].replace(",", ""))
    # vLLM's jit_monitor: one warning per kernel compiled after its warmup ("... during inference: NAME.")
    out["jit_monitor_kernels"] = sorted(set(re.findall(r"Triton kernel JIT compilation during inference: (\S+?)\.", text)))
    return out


def metric_lines(port: int, prefix: str) -> list[str] | str:
    """The sidecar's /metrics lines starting with `prefix`, or why they could not be read (a server that never
    became ready or died must not cost the phase its JSON)."""
    try:
        status, body = get(port, "/metrics")
    except OSError as exc:
        return f"unreadable: {exc}"
    if status != 200:
        return f"unreadable: HTTP {status}"
    return [l for l in body.decode(errors="replace").splitlines() if l.startswith(prefix)]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_hook(cmd: str, port_tb: int, port_up: int, port_plain: int, served: str, args) -> dict:
    """A shell command in its own process group (killed whole on timeout), with the servers' ports set."""
    env = dict(os.environ, PROXY_PORT=str(port_tb), DIRECT_PORT=str(port_up), PLAIN_PORT=str(port_plain),
               MODEL=served, OUT=args.out, TOKENIZER=args.model)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", cmd], env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=args.after_timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        rc = 124
    return {"cmd": cmd, "rc": rc, "s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--phase", default="cold")
    ap.add_argument("--cache", default="/tmp/tbcache")
    ap.add_argument("--ready-limit", type=float, default=520)
    ap.add_argument("--gpus", default="0,1", help="GPU for turingbox, GPU for plain vLLM (same = sequential)")
    ap.add_argument("--skip-plain", action="store_true")
    ap.add_argument("--skip-turingbox", action="store_true",
                    help="plain vLLM only (the plan is still made, for its argv): e.g. a committed soak's 4xx replayed "
                         "against plain vLLM in a later session (session.sh replaysoak)")
    ap.add_argument("--extra", default="", help="extra turingbox serve flags")
    ap.add_argument("--bench", action="store_true", help="also run `turingbox bench decode|prefill` on each server")
    ap.add_argument("--prefill-lengths", default="2048,4096,8192,16384,32768")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for turingbox serve (repeatable)")
    ap.add_argument("--plain-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for plain vLLM (repeatable)")
    ap.add_argument("--after", default="",
                    help="shell command run while the servers are still up (PROXY_PORT, DIRECT_PORT, PLAIN_PORT, MODEL set)")
    ap.add_argument("--tb-after", default="",
                    help="shell command run while turingbox serves, before plain vLLM starts (with one GPU plain "
                         "starts only after turingbox stops); same variables as --after")
    ap.add_argument("--after-timeout", type=float, default=900, help="seconds --after / --tb-after may run")
    ap.add_argument("--plain-cache", default="",
                    help="plain vLLM's cache root (vllm/, triton/, inductor/ under it; default CACHE-plain)")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode tok/s measurement (start-time phases)")
    ap.add_argument("--port-offset", type=int, default=0,
                    help="added to the ports 8000/8100/8200, so that two lanes can serve at once")
    args = ap.parse_args()
    port_tb, port_up, port_plain = (8000 + args.port_offset, 8100 + args.port_offset, 8200 + args.port_offset)
    os.makedirs(args.out, exist_ok=True)
    gpu_tb, gpu_plain = args.gpus.split(",")
    parallel = gpu_tb != gpu_plain
    res: dict = {"phase": args.phase, "parallel": parallel, "date": time.strftime("%Y-%m-%d %H:%M:%S")}

    env_tb = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_tb, TURINGBOX_CACHE_DIR=args.cache,
                  PYTHONUNBUFFERED="1")
    env_tb.update(kv.split("=", 1) for kv in args.env)
    plan = json.loads(subprocess.check_output(
        [sys.executable, "-m", "turingbox", "plan", "--model", args.model, "--json", *args.extra.split()],
        env=env_tb))
    json.dump(plan, open(os.path.join(args.out, f"plan-{args.phase}.json"), "w"), indent=1)
    res["plan"] = {k: plan.get(k) for k in ("tensor_parallel_size", "num_speculative_tokens", "max_model_len",
                                           "max_num_seqs", "kv_cache_dtype", "attention_backend", "dtype",
                                           "gpu_memory_utilization", "cache_key", "memory")}
    served = plan.get("served_model_name") or plan["model"]

    # Plain vLLM: the plan's argv without turingbox's worker class, plugin loading off.
    from turingbox.engine.launch import plain_vllm_args
    plain_args = plain_vllm_args(plan["vllm_args"])
    plain_cache = args.plain_cache or args.cache + "-plain"
    env_plain = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_plain, VLLM_PLUGINS="", PYTHONUNBUFFERED="1",
                     VLLM_CACHE_ROOT=os.path.join(plain_cache, "vllm"),
                     TRITON_CACHE_DIR=os.path.join(plain_cache, "triton"),
                     TORCHINDUCTOR_CACHE_DIR=os.path.join(plain_cache, "inductor"),
                     FLASHINFER_WORKSPACE_BASE=os.path.join(plain_cache, "flashinfer"))
    for k, v in plan.get("env", {}).items():
        if v is not None and k != "CUDA_VISIBLE_DEVICES" and not k.startswith("TURINGBOX_"):
            env_plain.setdefault(k, v)
    env_plain.update(kv.split("=", 1) for kv in args.plain_env)
    res["plain_argv"] = plain_args

    def start_tb():
        lf = open(os.path.join(args.out, f"turingbox-{args.phase}.log"), "w")
        cmd = [sys.executable, "-m", "turingbox", "serve", "--model", args.model, "--port", str(port_tb),
               "--upstream-port", str(port_up), *args.extra.split()]
        return subprocess.Popen(cmd, env=env_tb, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True), lf

    def start_plain():
        lf = open(os.path.join(args.out, f"plain-{args.phase}.log"), "w")
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *plain_args, "--host", "127.0.0.1",
               "--port", str(port_plain)]
        return subprocess.Popen(cmd, env=env_plain, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True), lf

    launched: dict[str, float] = {}

    def measure(name: str, port: int, proc, ready_path: str, extra_ports=()):
        # Ready time counts from this server's own launch, even when it is measured after the other's.
        t = wait_ready(port, ready_path, proc, args.ready_limit, launched[name])
        r = {"ready_s": t}
        log(f"{name} ready after {t}")
        if t is None:
            return r
        r["first_ttft_s"] = ttft(port, served)
        later = [ttft(port, served) for _ in range(10)]
        r["later_ttft_s"] = later
        r["later_ttft_median_s"] = statistics.median(later)
        r["first_over_later"] = r["first_ttft_s"] / r["later_ttft_median_s"]
        if not args.no_decode:
            r["decode"] = decode_tps(port, served)
        if args.bench:
            for kind in ("decode", "prefill"):
                out_json = os.path.join(args.out, f"bench-{kind}-{name}-{args.phase}.json")
                cmd = [sys.executable, "-m", "turingbox", "bench", kind, "--url", f"http://127.0.0.1:{port}",
                       "--json", "--output", out_json]
                if kind == "prefill":
                    cmd += ["--lengths", args.prefill_lengths, "--plot",
                            os.path.join(args.out, f"prefill-{name}-{args.phase}.png")]
                rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=400).returncode
                r[f"bench_{kind}"] = json.load(open(out_json)) if rc == 0 and os.path.exists(out_json) else {"rc": rc}
        for label, p in extra_ports:
            if not args.no_decode:
                r[f"decode_{label}"] = decode_tps(p, served)
            r[f"ttft_{label}_median_s"] = statistics.median([ttft(p, served) for _ in range(10)])
        return r

    t_start = time.perf_counter()
    if args.skip_turingbox:
        return plain_only(args, res, launched, start_plain, measure, port_plain, served, t_start)
    launched["turingbox"] = time.perf_counter()
    tb, tb_log = start_tb()
    plain = None
    if not args.skip_plain and parallel:
        launched["plain"] = time.perf_counter()
        plain, plain_log = start_plain()
    try:
        res["turingbox"] = measure("turingbox", port_tb, tb, "/health/ready", extra_ports=[("direct_upstream", port_up)])
        tb_ready = res["turingbox"]["ready_s"] is not None
        res["turingbox"]["jit_after_ready"] = metric_lines(port_tb, "turingbox_jit_after_ready")
        stages = metric_lines(port_tb, "turingbox_startup_stage_seconds")
        res["turingbox"]["startup_stage_seconds"] = stages if isinstance(stages, str) else {
            m.group(1): float(m.group(2)) for m in re.finditer(
                r'^turingbox_startup_stage_seconds\{stage="(\w+)"\} (\S+)$', "\n".join(stages), re.M)}
        if args.tb_after and tb_ready:
            res["tb_after"] = run_hook(args.tb_after, port_tb, port_up, port_plain, served, args)
            res["tb_after"]["jit_after_ready"] = metric_lines(port_tb, "turingbox_jit_after_ready")
            log(f"tb-after command rc={res['tb_after']['rc']}")
        elif args.tb_after:
            res["tb_after"] = {"cmd": args.tb_after, "skipped": "turingbox never became ready"}
        if plain is None and not args.skip_plain:
            stop(tb)
            launched["plain"] = time.perf_counter()
            plain, plain_log = start_plain()
        if plain is not None:
            res["plain"] = measure("plain", port_plain, plain, "/health", ())
        if args.after and not tb_ready:
            res["after"] = {"cmd": args.after, "skipped": "turingbox never became ready"}
            log("after-command skipped: turingbox never became ready")
        elif args.after:
            after_env = dict(os.environ, PROXY_PORT=str(port_tb), DIRECT_PORT=str(port_up), PLAIN_PORT=str(port_plain), MODEL=served,
                             OUT=args.out, TOKENIZER=args.model)
            t_after = time.perf_counter()
            # Own process group, killed whole on timeout: its clients must not outlive the servers.
            after = subprocess.Popen(["bash", "-c", args.after], env=after_env, start_new_session=True)
            try:
                rc = after.wait(timeout=args.after_timeout)
            except subprocess.TimeoutExpired:
                stop(after)
                rc = 124
            res["after"] = {"cmd": args.after, "rc": rc, "s": time.perf_counter() - t_after}
            # The after-command's requests (tool calls, structured output, ...) count against "no JIT after ready" too.
            res["after"]["jit_after_ready"] = metric_lines(port_tb, "turingbox_jit_after_ready")
            log(f"after-command rc={rc}")
    finally:
        stop(tb)
        if plain is not None:
            stop(plain)
    res["turingbox"]["kv"] = kv_reported(os.path.join(args.out, f"turingbox-{args.phase}.log"))
    if plain is not None:
        res["plain"]["kv"] = kv_reported(os.path.join(args.out, f"plain-{args.phase}.log"))
    res["wall_s"] = time.perf_counter() - t_start
    json.dump(res, open(os.path.join(args.out, f"side_by_side-{args.phase}.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "plain_argv"}, indent=1, default=str)[:6000])
    return 0


def plain_only(args, res: dict, launched: dict, start_plain, measure, port_plain: int, served: str,
               t_start: float) -> int:
    """--skip-turingbox: plain vLLM alone, measured like the side-by-side's plain half, --after run while it serves."""
    launched["plain"] = time.perf_counter()
    plain, _ = start_plain()
    try:
        res["plain"] = measure("plain", port_plain, plain, "/health", ())
        if args.after and res["plain"]["ready_s"] is None:
            res["after"] = {"cmd": args.after, "skipped": "plain vLLM never became ready"}
        elif args.after:
            res["after"] = run_hook(args.after, 0, 0, port_plain, served, args)
            log(f"after-command rc={res['after']['rc']}")
    finally:
        stop(plain)
    res["plain"]["kv"] = kv_reported(os.path.join(args.out, f"plain-{args.phase}.log"))
    res["wall_s"] = time.perf_counter() - t_start
    json.dump(res, open(os.path.join(args.out, f"side_by_side-{args.phase}.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "plain_argv"}, indent=1, default=str)[:6000])
    return 0 if res["plain"]["ready_s"] is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
