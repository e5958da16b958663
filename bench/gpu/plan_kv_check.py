#!/usr/bin/env python3
"""GPU machine: planned memory (turingbox plan) vs what vLLM 0.21 reports, for the same argv.

Plans for this machine's real GPUs (NVML) on the demo model, starts `vllm serve` with exactly the
plan's argv and env (DEBUG logging, so vLLM prints its memory profile), waits until the engine has
sized its KV cache (or the server is up), stops it, and compares:

  planned memory.kv_cache_gib     vs  "Available KV cache memory: X GiB"
  planned memory.kv_cache_tokens  vs  "GPU KV cache size: N tokens"
  planned weights/activation/non-torch/CUDA-graph  vs  vLLM's memory profile (DEBUG) and log lines

  source bench/gpu/bootstrap.sh && python3 bench/gpu/plan_kv_check.py --out $OUT [--eager] [--tp N]
  python3 bench/gpu/plan_kv_check.py --plan plan.json --log vllm.log     # only compare an existing log

Prints one JSON line (also $OUT/plan_kv_check.json; plan.json and vllm.log beside it). Goal: KV within 5%.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

from turingbox_plugin.contract import RUNTIME_DIR_ENV

PATTERNS = {
    "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "cudagraph_gib": r"Estimated CUDA graph memory: ([\d.]+) GiB",
    "activation_gib": r"torch peak memory increase: ([\d.]+)GiB",
    "non_torch_gib": r"non-torch forward increase memory: ([\d.]+)GiB",
    "block_size": r"Setting attention block size to (\d+) tokens",
}
DONE = ("GPU KV cache size", "Application startup complete")


def parse_log(text: str) -> dict:
    out = {}
    for key, pat in PATTERNS.items():
        found = re.findall(pat, text)
        if found:
            v = found[-1].replace(",", "")
            out[key] = float(v) if "." in v else int(v)
    return out


def compare(plan: dict, reported: dict) -> dict:
    m = plan["memory"]
    rows = {}
    for key in PATTERNS:
        if key in reported:
            planned = m.get(key)
            rows[key] = {"planned": planned, "vllm": reported[key],
                         "error_pct": round(100 * (planned - reported[key]) / reported[key], 2)
                         if planned is not None and reported[key] else None}
    kv = rows.get("kv_cache_gib", {}).get("error_pct")
    return {"tp": plan["tensor_parallel_size"], "mtp": plan["num_speculative_tokens"], "gpu": plan["gpu_name"],
            "kv_within_5pct": kv is not None and abs(kv) <= 5, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/plan_kv_check"))
    ap.add_argument("--eager", action="store_true", help="plan and run with --enforce-eager (fast, no compile)")
    ap.add_argument("--tp", type=int, help="TURINGBOX_TP for the plan")
    ap.add_argument("--plan", help="compare this plan JSON ...")
    ap.add_argument("--log", help="... with this vLLM log, without starting anything")
    ap.add_argument("--timeout", type=int, default=540)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.plan and a.log:
        plan = json.load(open(a.plan))
        result = compare(plan, parse_log(open(a.log, errors="replace").read()))
        print(json.dumps(result))
        return 0 if result["kv_within_5pct"] else 1

    env = dict(os.environ, TURINGBOX_MODELS_DIR=os.environ.get("TURINGBOX_MODELS_DIR", "/tmp/models"))
    if a.eager:
        env["TURINGBOX_ENFORCE_EAGER"] = "1"
    if a.tp:
        env["TURINGBOX_TP"] = str(a.tp)
    r = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--json"], env=env, capture_output=True, text=True)
    if r.returncode:
        print(json.dumps({"plan_error": r.stderr.strip()}))
        return 1
    plan = json.loads(r.stdout)
    with open(os.path.join(a.out, "plan.json"), "w") as f:
        json.dump(plan, f, indent=2)

    venv = dict(os.environ, VLLM_LOGGING_LEVEL="DEBUG")
    for k, v in plan["env"].items():
        if v is None:
            venv.pop(k, None)
        else:
            venv[k] = str(v)
    os.makedirs(venv[RUNTIME_DIR_ENV], exist_ok=True)     # the plan's env names the plugin's status directory
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *plan["vllm_args"], "--host", "127.0.0.1",
            "--port", "8765"]
    log_path = os.path.join(a.out, "vllm.log")
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=venv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        text = ""
        while time.time() - start < a.timeout and proc.poll() is None:
            time.sleep(2)
            text = open(log_path, errors="replace").read()
            if all(d in text for d in DONE[:1]):
                time.sleep(3)
                break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    text = open(log_path, errors="replace").read()
    result = compare(plan, parse_log(text))
    result["seconds"] = round(time.time() - start, 1)
    result["argv"] = " ".join(plan["vllm_args"])
    if "kv_cache_gib" not in result["rows"]:
        result["log_tail"] = text[-3000:]
    with open(os.path.join(a.out, "plan_kv_check.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0 if result["kv_within_5pct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
