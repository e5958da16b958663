#!/usr/bin/env python3
"""GPU machine: kernels compiled ahead of time for this GPU's arch load without compiling.

    source bench/gpu/bootstrap.sh && python3 bench/gpu/cache_aot_check.py      # ~1-2 min, JSON to $OUT

Four fresh processes, the same kernel launches in each (the plugin's `scaled_copy_kernel`,
vLLM 0.21's `rejection_greedy_sample_kernel` -- the greedy variant DESIGN lists as first-request
JIT -- and xgrammar's `apply_token_bitmask_inplace_kernel` of grammar requests, in several specializations):
  1. capture: empty TRITON_CACHE_DIR, `turingbox_warmup.image.triton_aot.capture_hook` records every launch's
     specialization (Triton's own serialization) as JSON lines;
  2. bake:    `python -m turingbox_warmup.image.triton_aot --specs records --arch <this GPU> --cache-dir AOT`
     recompiles the records into a fresh directory, no GPU involved (what the image build does);
  3. load:    TRITON_CACHE_DIR=AOT, a post-compile hook counting kernel loads and a counter on the
     CUDA backend's compile stages (entered only when Triton really compiles); the AOT
     directory's file list before and after;
  4. control: the same launches on an empty cache, proving the compile counter sees compiles.
Prints one JSON object (also $OUT/cache_aot_check.json); "ok" is true when the load process
compiled nothing, loaded every kernel from the AOT directory and wrote nothing there (the bake also
builds the C launchers and cuda_utils that Triton would otherwise build with gcc at first launch).

It then diffs the captured records against the ones the image ships (turingbox_warmup/image/aot_specs/
*.jsonl, derived from vLLM's source, not captured): "shipped_diff" lists captured specializations
no shipped record covers ("missing_from_shipped": these would JIT at run time in the image).

    python3 bench/gpu/cache_aot_check.py --engine      # + ~6-10 min: the real first-request kernels

--engine also starts `vllm serve` with this machine's `turingbox plan` (its vllm_args, without the
plugin's worker/config so only vLLM's own launches are seen) on the demo model (dummy weights), with a
sitecustomize hook capturing every Triton kernel every process compiles or loads, sends greedy
and sampled requests at batch 1 and 3, stops it, and diffs the vLLM kernels' captures with the
shipped records ("engine": {..., "shipped_diff": ...}; records in $OUT/engine-records-sm90.jsonl).
An empty "missing_from_shipped" there is the evidence that the derived specs match real launches.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# ---- the launches (run in each child process) ---------------------------------------------------

def launches() -> list[str]:
    """Launch every kernel specialization once on the GPU; returns what was launched."""
    import torch
    from turingbox_plugin.kernels import scaled_copy
    done = []
    for dtype in (torch.float16, torch.float32):
        for n in (4096, 4095):             # n % 16 == 0 and not: two specializations each
            x = torch.randn(n, device="cuda", dtype=dtype)
            y = scaled_copy(x, 0.5)
            assert torch.allclose(y, x * 0.5)
            done.append(f"scaled_copy_kernel[{dtype},{n}]")
    from vllm.v1.sample.rejection_sampler import rejection_greedy_sample_kernel
    batch, k = 4, 3
    for with_is_greedy in (False, True):   # vLLM's FIXME: is_greedy=None recompiles at run time
        out = torch.full((batch, k + 1), -1, dtype=torch.int32, device="cuda")
        cu = torch.arange(1, batch + 1, dtype=torch.int32, device="cuda") * k
        draft = torch.randint(0, 1000, (batch * k,), dtype=torch.int32, device="cuda")
        target = draft.to(torch.int64)
        bonus = torch.randint(0, 1000, (batch,), dtype=torch.int32, device="cuda")
        # As vLLM's rejection_sample: a batch that is not all greedy has a bool is_greedy and float64
        # uniform probs; an all-greedy batch has neither.
        is_greedy = torch.ones(batch, dtype=torch.bool, device="cuda") if with_is_greedy else None
        uniform = torch.rand(batch * k, dtype=torch.float64, device="cuda") if with_is_greedy else None
        bonus = bonus.view(batch, 1)
        rejection_greedy_sample_kernel[(batch,)](out, cu, draft, target, bonus, is_greedy, k, uniform, None,
                                                 SYNTHETIC_MODE=False)
        torch.cuda.synchronize()
        # Every draft equals the target argmax: all accepted, then the bonus token.
        assert out[:, :k].tolist() == draft.view(batch, k).tolist() and out[:, k].tolist() == bonus.view(-1).tolist()
        done.append(f"rejection_greedy_sample_kernel[is_greedy={'tensor' if with_is_greedy else 'None'}]")
    try:
        import xgrammar as xgr
    except ImportError:
        return done
    # Grammar requests: xgrammar's bitmask kernel on bf16 logits of the demo vocab (the H200 plan's shipped
    # specs), rows of each class (1, other, %16), all rows structured (no indices) and a subset (int32 indices).
    vocab = 248320
    for rows in (1, 3, 16):
        for with_indices in (False, True):
            logits = torch.zeros((rows, vocab), dtype=torch.bfloat16, device="cuda")
            mask = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32, device="cuda")
            mask[:, 0] = -2                                  # token 0 disallowed
            idx = torch.arange(0, rows, dtype=torch.int32, device="cuda") if with_indices else None
            xgr.apply_token_bitmask_inplace(logits, mask, indices=idx)
            torch.cuda.synchronize()
            assert torch.isinf(logits[:, 0]).all() and not torch.isinf(logits[:, 1:]).any()
            done.append(f"apply_token_bitmask_inplace_kernel[rows={rows},indices={with_indices}]")
    return done


def all_files(d: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)


def child(mode: str, records: str) -> dict:
    import triton
    from triton import knobs
    from triton.backends.nvidia.compiler import CUDABackend
    from turingbox_warmup.image import triton_aot

    events: list[str] = []
    compiles = {"n": 0}
    add_stages = CUDABackend.add_stages

    def counting_add_stages(self, *a, **k):   # entered only when Triton compiles (not on a cache hit)
        compiles["n"] += 1
        return add_stages(self, *a, **k)
    CUDABackend.add_stages = counting_add_stages
    capture = triton_aot.capture_hook(records) if mode == "capture" else None

    def hook(**kw):
        events.append(f"{kw['fn'].module}:{kw['fn'].name}")
        if capture:
            capture(**kw)
        return False
    knobs.runtime.jit_post_compile_hook = hook
    cache_dir = os.environ["TRITON_CACHE_DIR"]
    before = all_files(cache_dir) if os.path.isdir(cache_dir) else []
    t0 = time.perf_counter()
    launched = launches()
    seconds = time.perf_counter() - t0
    after = all_files(cache_dir) if os.path.isdir(cache_dir) else []
    return {"mode": mode, "triton": triton.__version__, "launched": launched, "hook_events": len(events),
            "compiles": compiles["n"], "cache_loads": len(events) - compiles["n"], "kernels": sorted(set(events)),
            "files_written": len(set(after) - set(before)), "written": sorted(set(after) - set(before))[:20],
            "seconds": round(seconds, 3)}


def run_child(mode: str, cache_dir: str, records: str) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": cache_dir, "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), os.path.join(REPO, "plugin"), os.path.join(REPO, "entrypoint"),
                    os.path.join(REPO, "warmup")) if p)}
    r = subprocess.run([sys.executable, __file__, "--child", mode, records], env=env, capture_output=True,
                       text=True, timeout=300)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"mode": mode, "error": f"exit {r.returncode}", "stderr_tail": r.stderr[-2000:]}
    return json.loads(lines[-1])


# ---- captured vs shipped ------------------------------------------------------------------------

VLLM_KERNELS = {"_zero_kv_blocks_kernel", "_compute_slot_mapping_kernel", "eagle_prepare_next_token_padded_kernel",
                "eagle_step_slot_mapping_metadata_kernel", "eagle_prepare_inputs_padded_kernel",
                "rejection_greedy_sample_kernel", "_copy_page_indices_kernel"}


def shipped_diff(records_path: str, kernels: set[str]) -> dict:
    """Captured specializations vs the shipped aot_specs, for `kernels`; prints the mismatches."""
    from turingbox_warmup.image import triton_aot
    shipped = [rec for path in triton_aot.packaged_specs() for rec in triton_aot.load_specs(path)]
    diff = triton_aot.diff_records(triton_aot.load_specs(records_path), shipped, kernels)
    for ident in diff["missing_from_shipped"]:
        print("NOT SHIPPED (would JIT in the image):", json.dumps(ident), file=sys.stderr)
    diff["covered"] = len(diff["covered"])
    return diff


SITECUSTOMIZE = """
import os
try:
    from triton import knobs
    from turingbox_warmup.image import triton_aot
    knobs.runtime.jit_post_compile_hook = triton_aot.capture_hook(
        os.path.join(os.environ["TURINGBOX_CAPTURE_DIR"], "records-%d.jsonl" % os.getpid()))
except Exception as exc:  # never break the process being observed
    print("capture hook not installed:", exc)
"""


def engine_capture(work: str, out_dir: str, arch: str) -> dict:
    """`vllm serve` with this machine's plan; every Triton launch of every process is captured."""
    import glob
    import http.client
    import socket
    import threading
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.join(REPO, "entrypoint"), os.path.join(REPO, "warmup"), os.path.join(REPO, "plugin"),
                    os.environ.get("PYTHONPATH")) if p)}
    plan_run = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--json"], env=env, capture_output=True,
                              text=True, timeout=300)
    if plan_run.returncode != 0:
        return {"error": "turingbox plan failed", "stderr_tail": plan_run.stderr[-2000:]}
    plan = json.loads(plan_run.stdout)
    from turingbox.engine.launch import plain_vllm_args
    argv = plain_vllm_args(plan["vllm_args"])                  # vLLM's own launches only
    model = argv[1]
    if not os.path.isfile(os.path.join(model, "config.json")):
        demo = [sys.executable, "-m", "turingbox", "demo-model", model] + (["--awq"] if plan.get("quantization") else [])
        subprocess.run(demo, env=env, check=True, timeout=900)
    site = os.path.join(work, "site")
    capture_dir = os.path.join(work, "engine-records")
    os.makedirs(site, exist_ok=True)
    os.makedirs(capture_dir, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    eng_env = {**env, "PYTHONPATH": site + os.pathsep + env["PYTHONPATH"], "TURINGBOX_CAPTURE_DIR": capture_dir,
               "TRITON_CACHE_DIR": os.path.join(work, "engine-triton"), "VLLM_CACHE_ROOT": os.path.join(work, "vllm"),
               **{k: v for k, v in (plan.get("env") or {}).items() if v is not None and k != "CUDA_VISIBLE_DEVICES"}}
    log_path = os.path.join(out_dir, "engine-vllm.log")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    res: dict = {"vllm_args": argv, "requests": []}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", *argv, "--port", str(port)], env=eng_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready = False
            while time.perf_counter() - t0 < 1500 and proc.poll() is None:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    conn.request("GET", "/health")
                    ready = conn.getresponse().status == 200
                    conn.close()
                except OSError:
                    pass
                if ready:
                    break
                time.sleep(3)
            res["ready_s"] = round(time.perf_counter() - t0, 1) if ready else None
            if not ready:
                res["error"] = f"vllm not ready (exit {proc.poll()}), log {log_path}"
            else:
                def complete(temperature: float, i: int):
                    body = {"model": plan["served_model_name"], "prompt": f"Count to {20 + i}:", "max_tokens": 48,
                            "temperature": temperature, "ignore_eos": True}
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                    conn.request("POST", "/v1/completions", body=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
                    res["requests"].append({"temperature": temperature, "status": conn.getresponse().status})
                    conn.close()
                for temps in ([0.0], [0.7], [0.0, 0.0, 0.0], [0.0, 0.7, 0.7]):   # batch 1 and 3, greedy and mixed
                    threads = [threading.Thread(target=complete, args=(t, i)) for i, t in enumerate(temps)]
                    for th in threads:
                        th.start()
                    for th in threads:
                        th.join()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    merged = os.path.join(out_dir, f"engine-records-sm{arch.replace('.', '')}.jsonl")
    with open(merged, "w") as out:
        for path in sorted(glob.glob(os.path.join(capture_dir, "records-*.jsonl"))):
            with open(path) as f:
                out.write(f.read())
    res["records"] = sum(1 for _ in open(merged))
    res["shipped_diff"] = shipped_diff(merged, VLLM_KERNELS) if res["records"] else None
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def main() -> int:
    out_dir = os.environ.get("OUT") or tempfile.mkdtemp(prefix="cache-aot-check-")
    work = tempfile.mkdtemp(prefix="cache-aot-")
    records = os.path.join(work, "records.jsonl")
    import torch
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"{major}.{minor}"
    t0 = time.perf_counter()
    res: dict = {"gpu": torch.cuda.get_device_name(0), "arch": arch}
    res["capture"] = run_child("capture", os.path.join(work, "capture-cache"), records)
    n_records = sum(1 for _ in open(records)) if os.path.exists(records) else 0
    res["records"] = n_records
    aot_dir = os.path.join(work, "aot-cache")
    bake = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--specs", records, "--arch", arch,
                           "--cache-dir", aot_dir], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_CACHE_DIR": os.path.join(work, "unused")})
    rows = [json.loads(l) for l in bake.stdout.splitlines() if l.startswith("{")]
    res["aot_compile"] = {"exit": bake.returncode, "compiled": sum("hash" in r for r in rows),
                          "hash_matches": sum("hash" in r and r["hash"] == r.get("expected_hash") for r in rows),
                          "host_modules": next((r["host_modules"] for r in rows if "host_modules" in r), None),
                          "errors": [r for r in rows if "error" in r] or bake.stderr[-1000:] or None}
    res["load"] = run_child("load", aot_dir, records)
    res["control"] = run_child("control", os.path.join(work, "control-cache"), records)
    load, control = res["load"], res["control"]
    res["ok"] = bool(n_records and bake.returncode == 0 and "error" not in load and load["compiles"] == 0
                     and load["cache_loads"] == load["hook_events"] == n_records and load["files_written"] == 0
                     and "error" not in control and control["compiles"] >= n_records)
    res["shipped_diff"] = shipped_diff(records, {"rejection_greedy_sample_kernel", "scaled_copy_kernel",
                                                  "apply_token_bitmask_inplace_kernel"}) \
        if n_records else None
    if "--engine" in sys.argv:
        res["engine"] = engine_capture(work, out_dir, arch)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    os.makedirs(out_dir, exist_ok=True)
    if n_records:   # commit as warmup/turingbox_warmup/image/aot_specs/*.jsonl to bake these kernels into the image
        shutil.copy(records, os.path.join(out_dir, f"aot_specs-sm{arch.replace('.', '')}.jsonl"))
    with open(os.path.join(out_dir, "cache_aot_check.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
        raise SystemExit(0)
    raise SystemExit(main())
