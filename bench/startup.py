#!/usr/bin/env python3
"""Startup benchmark: plain `vllm serve` vs `turingbox serve`, on empty, seeded and warm caches.

One phase per invocation, so each fits a 10-minute GPU call; state (caches, results) stays in
--work (/tmp) between invocations:

  empty   both servers on empty caches (fresh HOME / cache root);
  seed    `turingbox warmup --seed-only` fills a fresh cache root in its own process (plain vLLM
          has no seeding step: its analogue is the caches its `empty` run left behind);
  seeded  those caches copied (turingbox's to a fresh path, a new volume; plain vLLM's back to the same
          HOME, a user's caches on a new machine), both servers started on the copy;
  warm    both servers started again on the caches they just used (all warm);
  report  only rewrite the JSON and the chart.

Per server and phase: time to ready (plain: vLLM's /health and /v1/models answer; turingbox:
/health/ready, which includes its warmup), a per-stage breakdown from the arrival time of vLLM's
own log lines, the first request's TTFT and the median of the next three, log evidence of work a
warm start should not do (graphs compiled vs loaded, Triton autotuning), and what it compiled on disk
(Triton kernels; FlashInfer modules built, which vLLM's log does not show).
With two GPUs (--gpus 0,1) the two servers start at the same time, one per GPU.

Writes <out>/startup.json and <out>/startup.png (matplotlib, Agg), logs under <work>/logs/.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

PHASES = ("empty", "seed", "seeded", "warm")
SERVERS = ("plain", "turingbox")
# Removed from the inherited environment so each run gets exactly the caches the phase says.
CACHE_ENV = ("TURINGBOX_CACHE_DIR", "TURINGBOX_BAKED_CACHE_DIR", "TURINGBOX_RUNTIME_DIR", "TURINGBOX_MODEL",
             "TURINGBOX_VLLM_COMMAND", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
             "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_AUTOTUNING", "VLLM_PLUGINS", "XDG_CACHE_HOME", "HOME")
PROMPT = "Write a short story about a lighthouse keeper who discovers a message in a bottle."

# (stage that ENDS at the first line containing the marker, marker), in startup order. The
# breakdown is the time between consecutive markers that were seen (vLLM 0.21.0 messages).
MARKERS = (
    ("process start + import", "vLLM server version"),
    ("engine process start", "Starting to load model"),
    ("weights", "Model loading took"),
    # the second: a start given --kv-cache-memory-bytes (the KV size its cache entry recorded) skips the profile
    ("compile + profile", ("Available KV cache memory", "as specified by kv_cache_memory_bytes config")),
    ("KV cache + CUDA graphs", "init engine (profile, create kv cache, warmup model) took"),
)
# Log evidence: name -> regex counted over the whole log.
SIGNALS = {
    "graphs_compiled": r"Compiling a graph for (compile range|dynamic shape)",
    "graphs_loaded_from_cache": r"Directly load (the compiled graph|AOT compilation)",
    "triton_autotuning": r"Triton autotuning for function",
    "jit_after_ready": r"Triton kernel JIT compilation during inference",     # vLLM's jit_monitor
    # Triton's own print (TRITON_PRINT_AUTOTUNING=1): one line per config benchmarked; 0 when results came from its
    # autotune cache (TRITON_CACHE_AUTOTUNING=1 and a hit) or from turingbox's entry
    "autotune_configs_benched": r"Autotuning kernel \w+ with config",
    # vLLM was given the KV size (--kv-cache-memory-bytes, issue 35) and skipped its CUDA-graph memory profile
    "kv_size_given": r"as specified by kv_cache_memory_bytes config",
}
# vLLM's monitor line for the profile run (Dynamo/Inductor, FLA's autotunes and every first Triton compile land in it)
PROFILE_RUN = re.compile(r"Initial profiling/warmup run took ([0-9.]+) s")
# How plain vLLM's caches are set (issue 35): "careful" is what vLLM's and Triton's documentation tell a user who
# restarts the server: every cache named and inside HOME, and Triton's autotune results persisted
# (TRITON_CACHE_AUTOTUNING=1, which FLA's GDN kernels need to skip their ~90 s autotune on a restart); "default" is
# vLLM as installed (Inductor's cache moved into HOME as well, so a copy of HOME carries it).
PLAIN_CACHES = ("careful", "default")
# FlashInfer's own way to start without nvcc is its `flashinfer-jit-cache` package: prebuilt modules that
# flashinfer/jit/env.py's `_get_aot_dir` finds at `flashinfer_jit_cache.get_jit_cache_dir()/<uri>/<uri>.so`. It is
# published on flashinfer.ai's index only, which the GPU machine cannot reach, so plain vLLM "at its best" on a fresh
# node gets a stand-in package of that name serving the modules the image bakes (--plain-flashinfer-prebuilt).
JIT_CACHE_STANDIN = '''"""Stand-in for FlashInfer's flashinfer-jit-cache package, written by turingbox's bench/startup.py: FlashInfer
finds it as it finds the published package (flashinfer/jit/env.py) and loads {n} prebuilt module(s) for {arch} from it."""
__version__ = {version!r}


def get_jit_cache_dir():
    return {cache_dir!r}
'''


def write_jit_cache_standin(aot_base: str, dest: str) -> dict:
    """A `flashinfer_jit_cache` package under `dest` (put on PYTHONPATH) whose jit-cache directory is the one arch's
    `cached_ops/` of a baked FlashInfer layout (turingbox_warmup.image.flashinfer_aot build). Returns what it serves."""
    from turingbox.cache.flashinfer_prebuilt import prebuilt_modules
    modules = prebuilt_modules(aot_base)
    dirs = sorted({os.path.dirname(m["path"]) for m in modules})
    if len(dirs) != 1:
        raise SystemExit(f"bench: --plain-flashinfer-prebuilt needs the modules of one GPU arch, found {len(dirs)} "
                         f"cached_ops folders under {aot_base}.")
    versions = sorted({m.get("flashinfer_version", "") for m in modules})
    # FlashInfer checks only that the package's version starts with its own: a module built from another release's
    # sources (0.6.8.post1 against 0.6.8) would load. The FlashInfer plain vLLM imports must be the modules' own.
    import importlib.metadata
    try:
        installed = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None and versions != [installed]:
        raise SystemExit(f"bench: --plain-flashinfer-prebuilt's modules are FlashInfer {', '.join(versions)}, but "
                         f"plain vLLM imports FlashInfer {installed}.")
    pkg = os.path.join(dest, "flashinfer_jit_cache")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(JIT_CACHE_STANDIN.format(n=len(modules), arch=modules[0].get("workspace_arch"),
                                         version=f"{versions[0]}+turingbox-standin", cache_dir=dirs[0]))
    return {"package": "flashinfer_jit_cache (stand-in)", "cache_dir": dirs[0],
            "modules": [m["uri"] for m in modules], "flashinfer_version": versions[0],
            "installed_flashinfer_checked": installed is not None}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 3.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def ttft(port: int, model: str, timeout: float) -> float:
    """Seconds from sending a streaming chat request to its first content chunk."""
    body = {"model": model, "stream": True, "max_tokens": 8, "temperature": 0.0,
            "messages": [{"role": "user", "content": PROMPT}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        while True:
            line = r.readline()
            if not line:
                raise RuntimeError("stream ended without content")
            if line.startswith(b"data: {"):
                delta = (json.loads(line[6:]).get("choices") or [{}])[0]
                content = (delta.get("delta") or {})
                if content.get("content") or content.get("reasoning_content") or content.get("reasoning") \
                        or delta.get("text"):
                    return time.perf_counter() - t0
    finally:
        conn.close()


# ---- one server run ------------------------------------------------------------------------------

class Run:
    """A server process whose output lines are timestamped on arrival (seconds since its start)."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: str, wrapped: bool = False) -> None:
        # wrapped: argv is a wrapper (a profiler) around the server, which is then stopped first, on its own
        self.name, self.argv, self.log_path, self.wrapped = name, argv, log_path, wrapped
        self.lines: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "w", encoding="utf-8") as f:
            for raw in iter(self.proc.stdout.readline, b""):
                t = time.monotonic() - self.t0
                text = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append((t, text))
                f.write(f"{t:9.3f} {text}\n")
                f.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def first(self, needle: str) -> float | None:
        for t, line in list(self.lines):
            if needle in line:
                return round(t, 3)
        return None

    def stop(self) -> None:
        if self.wrapped and self.proc.poll() is None:
            # py-spy SIGKILLs its child when it is interrupted: SIGTERM the server itself instead, let it drain and
            # stop vLLM, and the wrapper ends on its own when its child does (py-spy then writes its record).
            for child in children(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:     # leftovers of the group (engine core, workers)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._reader.join(5)


def children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def wait_until(run: Run, checks: list[tuple[int, str]], deadline: float) -> float | None:
    """Seconds since start when every (port, path) answered 200; None on exit or deadline."""
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            return None
        try:
            if all(http_get(port, path) == 200 for port, path in checks):
                return round(run.elapsed(), 3)
        except OSError:
            pass
        time.sleep(0.2)
    return None


def breakdown(run: Run, upstream_s: float | None, ready_s: float | None) -> dict[str, float]:
    out: dict[str, float] = {}
    last = 0.0
    for stage, needles in MARKERS:
        seen = [t for t in map(run.first, (needles,) if isinstance(needles, str) else needles) if t is not None]
        t = min(seen) if seen else None
        if t is not None and t >= last:
            out[stage] = round(t - last, 3)
            last = t
    if upstream_s is not None:
        out["API server start"] = round(max(0.0, upstream_s - last), 3)
        last = max(last, upstream_s)
    if ready_s is not None and ready_s > last:
        out["turingbox warmup + checks"] = round(ready_s - last, 3)
    return out


def signals(run: Run) -> dict:
    text = "\n".join(line for _, line in run.lines)
    out: dict = {name: len(re.findall(rx, text)) for name, rx in SIGNALS.items()}
    out["autotuned_kernels"] = sorted(set(re.findall(r"Autotuning kernel (\w+) with config", text)))
    profile = PROFILE_RUN.findall(text)
    if profile:
        out["profile_run_s"] = float(profile[-1])
    return out


def on_disk(root: str) -> dict[str, int]:
    """What a cache root holds compiled, in one walk. "kernels": Triton's .cubin files (one per compiled kernel variant,
    written whether the compile happened in the profile run, the warmup or a request) plus FlashInfer's modules.
    "flashinfer_built": FlashInfer modules JIT-built (nvcc), a `cached_ops/<uri>/<uri>.so` without turingbox's prebuilt
    marker (a module with it was copied into the entry). Counted on disk because FlashInfer's JIT logs through its own
    logger, which vLLM's log does not carry: session 30's plain start as installed built its sampling module (its
    sampler stage 132.7 s, 3.3 s with the prebuilt module) with no line about it."""
    from turingbox.cache.flashinfer_prebuilt import MARKER
    kernels = built = 0
    for dirpath, _subdirs, files in os.walk(root):
        kernels += sum(1 for f in files
                       if f.endswith((".cubin", ".hsaco")) or (f.endswith(".so") and "flashinfer" in dirpath))
        uri = os.path.basename(dirpath)
        if os.path.basename(os.path.dirname(dirpath)) == "cached_ops" and f"{uri}.so" in files and MARKER not in files:
            built += 1
    return {"kernels": kernels, "flashinfer_built": built}


def measure(run: Run, served: str, deadline: float, upstream_port: int, ready_checks: list[tuple[int, str]],
            request_port: int, cache_root: str | None = None, before: dict[str, int] | None = None) -> dict:
    upstream = wait_until(run, [(upstream_port, "/health"), (upstream_port, "/v1/models")], deadline)
    ready = upstream if upstream is None or ready_checks == [] else wait_until(run, ready_checks, deadline)
    res: dict = {"ready_s": ready, "upstream_ready_s": upstream, "exit": run.proc.poll()}
    at_ready = on_disk(cache_root) if cache_root else None
    if ready is None:
        res["error"] = ("exited with " + str(run.proc.returncode)) if run.proc.poll() is not None else \
            f"not ready within {deadline - run.t0:.0f} s"
        res["last_lines"] = [line for _, line in run.lines[-15:]]
    else:
        try:
            res["first_ttft_s"] = round(ttft(request_port, served, max(30.0, deadline - time.monotonic())), 4)
            later = [ttft(request_port, served, 60.0) for _ in range(3)]
            res["later_ttft_median_s"] = round(statistics.median(later), 4)
        except (OSError, RuntimeError) as exc:
            res["ttft_error"] = f"{type(exc).__name__}: {exc}"
    if cache_root and before is not None and at_ready is not None:
        # kernels compiled and FlashInfer modules built (new on disk) while starting, and by the four requests after ready
        after = on_disk(cache_root)
        for out_key, key in (("compiled", "kernels"), ("flashinfer_built", "flashinfer_built")):
            res[out_key] = {"before_start": before[key], "during_start": at_ready[key] - before[key],
                            "after_ready": after[key] - at_ready[key]}
    res["stages_s"] = breakdown(run, upstream, ready)
    res["log_signals"] = signals(run)
    return res


# ---- the benchmark -------------------------------------------------------------------------------

class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.work = os.path.abspath(a.work)
        self.out = os.path.abspath(a.out)
        self.gpus = [g.strip() for g in a.gpus.split(",") if g.strip()] or ["0"]
        self.deadline = time.monotonic() + a.budget_s
        self.results_path = os.path.join(self.work, "startup.json")
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        os.makedirs(self.out, exist_ok=True)
        self.vllm_program = shlex.split(a.vllm_command) if a.vllm_command else \
            [sys.executable, "-m", "vllm.entrypoints.cli.main"]
        self.tb_args = shlex.split(a.turingbox_args)
        # A variant (issue 18's A/B): vLLM flags for both servers (turingbox passes them after `--`) and environment
        # for both servers' vLLM.
        self.vllm_args = shlex.split(a.vllm_args)
        self.tb_passthrough = ["--", *self.vllm_args] if self.vllm_args else []
        for opt, values in (("--env", a.env), ("--tb-env", a.tb_env)):
            bad = [kv for kv in values if "=" not in kv or not kv.split("=", 1)[0]]
            if bad:
                raise SystemExit(f"bench: {opt} takes KEY=VALUE, got {bad[0]!r}.")
        self.extra_env = dict(kv.split("=", 1) for kv in a.env)
        # turingbox's own start only (e.g. VLLM_WORKER_MULTIPROC_METHOD=fork, which plain vLLM cannot use: its API
        # server initialises CUDA when it imports the model class, and vLLM then forces spawn)
        self.tb_extra_env = dict(kv.split("=", 1) for kv in a.tb_env)
        self.jit_cache = write_jit_cache_standin(a.plain_flashinfer_prebuilt, self.path("flashinfer-jit-cache")) \
            if a.plain_flashinfer_prebuilt else None

    def variant(self) -> dict:
        v = {"vllm_args": self.vllm_args, "env": self.extra_env}
        if self.tb_extra_env:
            v["turingbox_env"] = self.tb_extra_env
        if self.a.tb_wrap:
            v["turingbox_wrap"] = self.a.tb_wrap
        if self.jit_cache and "plain" in self.servers():
            v["plain_flashinfer_prebuilt"] = self.jit_cache
        return v

    def servers(self) -> tuple[str, ...]:
        """The servers this run starts (--only picks one); the other's caches and results stay as its run left them."""
        return (self.a.only,) if self.a.only else SERVERS

    def path(self, *parts: str) -> str:
        return os.path.join(self.work, *parts)

    def base_env(self, gpu: str, home: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
        os.makedirs(home, exist_ok=True)
        env.update(HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"), CUDA_VISIBLE_DEVICES=gpu,
                   PYTHONUNBUFFERED="1", TRITON_PRINT_AUTOTUNING="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        env.update(self.extra_env)
        return env

    def tb_env(self, gpu: str, root: str, tag: str) -> dict:
        env = self.base_env(gpu, self.path("home", f"turingbox-{tag}"))
        env.update(TURINGBOX_CACHE_DIR=root, TURINGBOX_RUNTIME_DIR=self.path("runtime", tag),
                   TURINGBOX_MODEL=self.a.model)
        env.update(self.tb_extra_env)
        if self.a.vllm_command:
            env["TURINGBOX_VLLM_COMMAND"] = self.a.vllm_command
        return env

    def plain_env(self, gpu: str, home: str) -> dict:
        """A user's plain `vllm serve`: default cache locations, all under a HOME of its own."""
        env = self.base_env(gpu, home)
        # Inductor's default is /tmp/torchinductor_<user>, outside HOME: keep it with the rest.
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(home, "torchinductor"), VLLM_PLUGINS="")
        if self.a.plain_caches == "careful":
            # vLLM's and Triton's documented cache settings, named where their defaults already are, and Triton's
            # autotune cache on (off by default; without it FLA re-autotunes for ~90 s at every start)
            env.update(VLLM_CACHE_ROOT=os.path.join(home, ".cache", "vllm"),
                       TRITON_CACHE_DIR=os.path.join(home, ".triton", "cache"), TRITON_CACHE_AUTOTUNING="1")
        if self.jit_cache:
            # outside HOME: an installed package, not a cache the start fills
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.path("flashinfer-jit-cache"),
                                                            env.get("PYTHONPATH")) if p)
        return env

    def plan(self) -> dict:
        cached = self.path("plan.json")
        if os.path.exists(cached):
            return json.load(open(cached))
        env = self.tb_env(self.gpus[0], self.path("plan-root"), "plan")
        out = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--json", *self.tb_args], env=env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"bench: `turingbox plan` failed: {out.stderr.strip()[-500:]}")
        plan = json.loads(out.stdout)
        json.dump(plan, open(cached, "w"), indent=1)
        return plan

    def plain_argv(self, plan: dict, port: int) -> list[str]:
        """The plan's vLLM argv without turingbox's worker class and additional config (the one launcher's)."""
        from turingbox.engine.launch import plain_vllm_args
        return [*self.vllm_program, *plain_vllm_args(plan["vllm_args"]), "--host", "127.0.0.1", "--port", str(port),
                *self.vllm_args]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # -- runs

    # -- which start of which server: issue 35 names every record by it

    CACHE_STATE = {"empty": "empty", "seeded": "copied", "warm": "unchanged", "seed": "empty"}

    def _ledger(self) -> dict:
        try:
            return json.load(open(self.path("starts.json")))
        except (OSError, ValueError):
            return {}

    def forget_starts(self, root: str) -> None:
        """A cache root that was just emptied or replaced by a copy: its next start is its first."""
        ledger = self._ledger()
        ledger.pop(os.path.relpath(root, self.work), None)
        json.dump(ledger, open(self.path("starts.json"), "w"), indent=1)

    def begin_start(self, server: str, root: str, phase: str) -> dict:
        ledger = self._ledger()
        key = os.path.relpath(root, self.work)
        ledger[key] = ledger.get(key, 0) + 1
        json.dump(ledger, open(self.path("starts.json"), "w"), indent=1)
        start = {"server": server, "n": ledger[key], "caches_at": key, "caches": self.CACHE_STATE.get(phase, phase)}
        if server == "plain":
            start["cache_settings"] = self.a.plain_caches
            if self.jit_cache:
                start["flashinfer_prebuilt"] = True
        elif {**os.environ, **self.tb_extra_env}.get("TURINGBOX_AOT_FLASHINFER_DIR"):
            start["flashinfer_prebuilt"] = True           # the image's modules, copied into a new entry
        return start

    def start_plain(self, plan: dict, gpu: str, home: str, phase: str) -> tuple[Run, dict]:
        port = free_port()
        start = self.begin_start("plain", home, phase)
        before = on_disk(home)
        run = Run("plain", self.plain_argv(plan, port), self.plain_env(gpu, home),
                  self.path("logs", f"{phase}{self.log_suffix()}-plain.log"))
        return run, {"upstream_port": port, "ready_checks": [], "request_port": port, "cache_root": home,
                     "before": before, "start": start}

    def start_turingbox(self, gpu: str, root: str, phase: str) -> tuple[Run, dict]:
        port, upstream = free_port(), free_port()
        start = self.begin_start("turingbox", root, phase)
        before = on_disk(root)
        wrap = shlex.split(self.a.tb_wrap)
        argv = [*wrap, sys.executable, "-m", "turingbox", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--upstream-port", str(upstream), *self.tb_args, *self.tb_passthrough]
        run = Run("turingbox", argv, self.tb_env(gpu, root, phase),
                  self.path("logs", f"{phase}{self.log_suffix()}-turingbox.log"), wrapped=bool(wrap))
        return run, {"upstream_port": upstream, "ready_checks": [(port, "/health/ready")], "request_port": port,
                     "cache_root": root, "before": before, "start": start}

    def log_suffix(self) -> str:
        """A labelled run keeps its own log beside the baseline's (warm+start3-plain.log)."""
        return f"+{self.a.label}" if self.a.label else ""

    def serve_pair(self, plan: dict, phase: str, plain_home: str, tb_root: str) -> dict:
        served = plan.get("served_model_name") or plan["model"]
        parallel = len(self.gpus) > 1
        starters = [("turingbox", lambda gpu: self.start_turingbox(gpu, tb_root, phase)),
                    ("plain", lambda gpu: self.start_plain(plan, gpu, plain_home, phase))]
        starters = [s for s in starters if s[0] in self.servers()]
        results: dict = {}
        if parallel:
            runs = [(name, *start(self.gpus[i])) for i, (name, start) in enumerate(starters)]
            threads, out = [], {}
            deadline = time.monotonic() + self.remaining() - 20
            for name, run, ports in runs:
                t = threading.Thread(target=lambda n=name, r=run, p=ports: out.__setitem__(
                    n, {"start": p["start"], **measure(r, served, deadline, p["upstream_port"], p["ready_checks"],
                                                       p["request_port"], p["cache_root"], p["before"])}))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            for name, run, _ in runs:
                run.stop()
                results[name] = out[name]
        else:
            for i, (name, start) in enumerate(starters):
                # Sequential on one GPU: give each server its share of what is left.
                share = (self.remaining() - 20) / (len(starters) - i)
                run, ports = start(self.gpus[0])
                try:
                    results[name] = {"start": ports["start"], **measure(
                        run, served, time.monotonic() + share, ports["upstream_port"], ports["ready_checks"],
                        ports["request_port"], ports["cache_root"], ports["before"])}
                finally:
                    run.stop()
        for name, r in results.items():
            log(f"{phase}/{name}: ready {r.get('ready_s')} s, first TTFT {r.get('first_ttft_s')} s, "
                f"signals {r.get('log_signals')}")
        return {"parallel": parallel, "variant": self.variant(), **results}

    def phase_empty(self, plan: dict) -> dict:
        mine = {"plain": ("plain-home", "plain-empty-home"), "turingbox": ("tb-empty-root",)}
        for server in self.servers():
            for d in mine[server]:
                shutil.rmtree(self.path(d), ignore_errors=True)
                self.forget_starts(self.path(d))
        return self.serve_pair(plan, "empty", self.path("plain-home"), self.path("tb-empty-root"))

    def phase_seed(self, plan: dict) -> dict:
        root = self.path("seed-root")
        shutil.rmtree(root, ignore_errors=True)
        env = self.tb_env(self.gpus[0], root, "seed")
        argv = [sys.executable, "-m", "turingbox", "warmup", "--seed-only",
                "--warmup-timeout", str(max(60, int(self.remaining() - 30))), *self.tb_args, *self.tb_passthrough]
        run = Run("seed", argv, env, self.path("logs", "seed-turingbox.log"))
        try:
            run.proc.wait(timeout=max(10.0, self.remaining() - 10))
        except subprocess.TimeoutExpired:
            pass
        finally:
            run.stop()
        result_lines = [l for _, l in run.lines if l.startswith("turingbox-seed-result: ")]
        res = {"exit": run.proc.returncode, "seconds": round(run.elapsed(), 3), "log_signals": signals(run),
               "stages_s": breakdown(run, None, None)}
        second = run.first("turingbox-stage: loading-start")   # the seed started vLLM again, loading its graphs
        if second is not None:
            res["loading_start_s"] = round(run.elapsed() - second, 3)
        if result_lines:
            res["result"] = json.loads(result_lines[-1].split(": ", 1)[1])
        else:
            res["last_lines"] = [l for _, l in run.lines[-15:]]
        log(f"seed: exit {res['exit']} after {res['seconds']} s")
        return {"variant": self.variant(), "turingbox": res}

    def phase_seeded(self, plan: dict) -> dict:
        if not os.path.isdir(self.path("seed-root")):
            raise SystemExit("bench: run the seed phase first (no seed-root in the work directory).")
        plain_home, plain_caches = self.path("plain-home"), self.path("plain-empty-home")
        if "plain" in self.servers() and not os.path.isdir(plain_caches) and os.path.isdir(plain_home):
            # what the empty phase left behind, kept for every seeded run; a turingbox-only run leaves plain's HOME
            # where it is (issue 35's restarts run in it unchanged)
            os.rename(plain_home, plain_caches)
        if not os.path.isdir(plain_caches) and "plain" in self.servers():
            raise SystemExit("bench: run the empty phase first (plain vLLM's caches come from it).")
        # Copies, never the originals. turingbox's on a fresh path, as a new volume would be. Plain vLLM's at the same
        # HOME, as a user's caches copied to a new machine: vLLM 0.21's compile key hashes two folders under HOME
        # (VLLM_CONFIG_ROOT, VLLM_XLA_CACHE_PATH), so another HOME would recompile everything (session 11), which is
        # not a seeded start. turingbox's HOME is new every phase: its plugin keeps those two out of the key.
        copies = {"turingbox": (self.path("seed-root"), self.path("tb-seeded-root")), "plain": (plain_caches, plain_home)}
        for server in self.servers():
            src, dst = copies[server]
            shutil.rmtree(dst, ignore_errors=True)
            self.forget_starts(dst)
            if os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)
        return self.serve_pair(plan, "seeded", plain_home, self.path("tb-seeded-root"))

    def phase_warm(self, plan: dict) -> dict:
        """Both servers again on the caches they used last, unchanged: plain vLLM in the HOME of its empty start (its
        second, third, ... start there: issue 35's steady restart), turingbox on the seeded copy."""
        if "turingbox" in self.servers() and not os.path.isdir(self.path("tb-seeded-root")):
            raise SystemExit("bench: run the seeded phase first (turingbox's warm start reuses its caches).")
        if "plain" in self.servers() and not os.path.isdir(self.path("plain-home")):
            raise SystemExit("bench: run the empty phase first (plain vLLM's warm start reuses its HOME).")
        return self.serve_pair(plan, "warm", self.path("plain-home"), self.path("tb-seeded-root"))

    # -- results

    def load(self) -> dict:
        try:
            return json.load(open(self.results_path))
        except (OSError, ValueError):
            return {"phases": {}}

    def save(self, results: dict) -> None:
        results["criteria"] = criteria(results["phases"])
        results["fair_ab"] = fair_ab(results["phases"])
        results["starts"] = starts_table(results["phases"])
        tmp = self.results_path + ".tmp"
        json.dump(results, open(tmp, "w"), indent=1, default=str)
        os.replace(tmp, self.results_path)
        shutil.copy(self.results_path, os.path.join(self.out, "startup.json"))
        logs_out = os.path.join(self.out, "startup-logs")
        if self.a.copy_logs:
            shutil.copytree(self.path("logs"), logs_out, dirs_exist_ok=True)
        try:
            chart(results["phases"], os.path.join(self.out, "startup.png"))
        except Exception as exc:       # the JSON is the result; a chart problem must not lose it
            log(f"chart not drawn: {type(exc).__name__}: {exc}")


def criteria(phases: dict) -> dict:
    """Issue 5's bar (seeded ready <= 1.1x warm and <= 0.3x empty, no compile/autotune/JIT in its log) and issue 18's
    (seeded ready <= 45 s and <= 1.0x plain vLLM, first TTFT <= 1.2x the later ones)."""
    def ready(phase: str) -> float | None:
        return ((phases.get(phase) or {}).get("turingbox") or {}).get("ready_s")
    seeded, warm, empty = ready("seeded"), ready("warm"), ready("empty")
    out: dict = {"seeded_ready_s": seeded, "warm_ready_s": warm, "empty_ready_s": empty}
    if seeded and warm:
        out["seeded_over_warm"] = round(seeded / warm, 3)
        out["seeded_le_1.1x_warm"] = seeded <= 1.1 * warm
    if seeded and empty:
        out["seeded_over_empty"] = round(seeded / empty, 3)
        out["seeded_le_0.3x_empty"] = seeded <= 0.3 * empty
    # issue 18: seeded ready <= 45 s and no slower than plain vLLM on its own caches, first TTFT <= 1.2x later
    if seeded:
        out["seeded_le_45s"] = seeded <= 45.0
    for phase in ("seeded", "warm"):
        tb, plain = ready(phase), ((phases.get(phase) or {}).get("plain") or {}).get("ready_s")
        if tb and plain:
            out[f"{phase}_turingbox_over_plain"] = round(tb / plain, 3)
            out[f"{phase}_le_1.0x_plain"] = tb <= plain
    tb_seeded = (phases.get("seeded") or {}).get("turingbox") or {}
    if tb_seeded.get("first_ttft_s") and tb_seeded.get("later_ttft_median_s"):
        ratio = tb_seeded["first_ttft_s"] / tb_seeded["later_ttft_median_s"]
        out["seeded_first_over_later"] = round(ratio, 3)
        out["seeded_first_le_1.2x_later"] = ratio <= 1.2
    sig = tb_seeded.get("log_signals")
    if sig:
        out["seeded_no_compile_autotune_jit"] = not (sig.get("graphs_compiled") or sig.get("triton_autotuning")
                                                     or sig.get("jit_after_ready")
                                                     or sum((tb_seeded.get("flashinfer_built") or {}).get(k, 0)
                                                            for k in ("during_start", "after_ready")))
    return out


def starts_table(phases: dict) -> list[dict]:
    """One row per server start on record, named by which start of which server it was (issue 35)."""
    rows = []
    for key, phase in phases.items():
        for server in SERVERS:
            r = (phase or {}).get(server)
            if not isinstance(r, dict) or "ready_s" not in r:
                continue
            sig = r.get("log_signals") or {}
            built = r.get("flashinfer_built")     # on disk; records before session 30 have only a log count, which
            # never saw a build (FlashInfer's JIT does not log into vLLM's log), so they say None
            fi_builds = built["during_start"] + built["after_ready"] if built else None
            rows.append({"record": key, "server": server, "start": r.get("start"), "ready_s": r.get("ready_s"),
                         "first_ttft_s": r.get("first_ttft_s"), "later_ttft_median_s": r.get("later_ttft_median_s"),
                         "compiled": r.get("compiled"), "graphs_compiled": sig.get("graphs_compiled"),
                         "autotune_configs_benched": sig.get("autotune_configs_benched"),
                         "profile_run_s": sig.get("profile_run_s"), "jit_after_ready": sig.get("jit_after_ready"),
                         "flashinfer_builds": fi_builds})
    return rows


def fair_ab(phases: dict) -> dict:
    """Issue 35's bar. Fresh node: turingbox from a seeded entry vs plain vLLM's empty start (<= 0.25x). Restart:
    turingbox warm vs plain vLLM's steady restart, its latest start (the third or later) in an unchanged HOME with the
    careful cache settings (<= 0.8x); plain's default restart on record beside it. Seeded ready <= 40 s, first TTFT
    <= 1.2x later."""
    rows = starts_table(phases)

    def pick(server: str, record: str | None = None, **start) -> dict | None:
        found = [r for r in rows if r["server"] == server and (record is None or r["record"] == record)
                 and r.get("ready_s") and all((r.get("start") or {}).get(k) == v for k, v in start.items())]
        return max(found, key=lambda r: (r.get("start") or {}).get("n", 0)) if found else None

    out: dict = {}
    tb_fresh, plain_empty = pick("turingbox", "seeded"), pick("plain", "empty")
    tb_restart = pick("turingbox", "warm")
    steady = pick("plain", caches="unchanged", cache_settings="careful")
    default = pick("plain", caches="unchanged", cache_settings="default")
    for name, tb, plain, bar in (("fresh_node", tb_fresh, plain_empty, 0.25), ("restart", tb_restart, steady, 0.8)):
        if tb and plain:
            ratio = tb["ready_s"] / plain["ready_s"]
            out[name] = {"turingbox": f"{tb['record']} (start {tb['start']['n']})", "turingbox_ready_s": tb["ready_s"],
                         "plain": f"{plain['record']} (start {plain['start']['n']}, {plain['start']['caches']} "
                                  f"caches, {plain['start'].get('cache_settings')} settings)",
                         "plain_ready_s": plain["ready_s"], "ratio": round(ratio, 3), f"le_{bar}x": ratio <= bar}
    if steady and steady["start"]["n"] < 3:
        out["restart_note"] = f"plain's latest careful restart on record is its start {steady['start']['n']}, not a third"
    if default:
        out["plain_default_restart"] = {"record": default["record"], "start": default["start"]["n"],
                                        "ready_s": default["ready_s"]}
        if tb_restart:
            out["plain_default_restart"]["turingbox_over_it"] = round(tb_restart["ready_s"] / default["ready_s"], 3)
    # plain vLLM at its best: its fastest restart on record in an unchanged HOME, whatever its settings (session 17:
    # its default 4th start was 24 s faster than its careful 3rd, machine variation); the bar is checked against it too
    restarts = [r for r in rows if r["server"] == "plain" and r.get("ready_s")
                and (r.get("start") or {}).get("caches") == "unchanged"]
    if restarts and tb_restart:
        best = min(restarts, key=lambda r: r["ready_s"])
        ratio = tb_restart["ready_s"] / best["ready_s"]
        out["restart_vs_plain_best"] = {"plain": f"{best['record']} (start {best['start']['n']}, "
                                                 f"{best['start'].get('cache_settings')} settings)",
                                        "plain_ready_s": best["ready_s"], "turingbox_ready_s": tb_restart["ready_s"],
                                        "ratio": round(ratio, 3), "le_0.8x": ratio <= 0.8,
                                        "plain_restarts_s": sorted(r["ready_s"] for r in restarts)}
    # Cold (issue 35 item 4): each turingbox start on empty caches vs plain vLLM's fastest empty start on record of the
    # same variant (vLLM flags and environment for both), e.g. the one given FlashInfer's prebuilt modules
    # (--plain-flashinfer-prebuilt): each start says whether it had them, and how many FlashInfer modules it built (on disk).
    def common(record: str) -> tuple:
        v = (phases.get(record) or {}).get("variant") or {}
        return json.dumps([v.get("vllm_args") or [], v.get("env") or {}], sort_keys=True)

    def cold_start(r: dict) -> dict:
        return {"ready_s": r["ready_s"], "flashinfer_prebuilt": bool((r.get("start") or {}).get("flashinfer_prebuilt")),
                "flashinfer_builds": r.get("flashinfer_builds")}

    empties = [r for r in rows if r["record"].split("+")[0] == "empty" and r.get("ready_s")]
    cold: dict = {}
    for tb in (r for r in empties if r["server"] == "turingbox"):
        plains = [r for r in empties if r["server"] == "plain" and common(r["record"]) == common(tb["record"])]
        if not plains:
            continue
        best = min(plains, key=lambda r: r["ready_s"])
        ratio = tb["ready_s"] / best["ready_s"]
        cold[tb["record"]] = {"turingbox": cold_start(tb), "plain": best["record"], "plain_start": cold_start(best),
                              "plain_empty_starts": {r["record"]: cold_start(r) for r in plains},
                              "ratio": round(ratio, 3), "le_0.8x": ratio <= 0.8}
    if cold:
        out["cold"] = cold
    for name, r in (("fresh_node_turingbox", tb_fresh), ("restart_turingbox", tb_restart)):
        if r:
            out[f"{name}_le_40s"] = r["ready_s"] <= 40.0
            if r.get("first_ttft_s") and r.get("later_ttft_median_s"):
                out[f"{name}_first_over_later"] = round(r["first_ttft_s"] / r["later_ttft_median_s"], 3)
            out[f"{name}_jit_after_ready"] = r.get("jit_after_ready")
    return out


def phase_key(phase: str, label: str) -> str:
    """Where a phase's result is kept: a labelled variant beside the baseline, never over it."""
    return f"{phase}+{label}" if label else phase


def chart(phases: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = []          # (label, stages dict, total, first ttft)
    order = ("empty", "seeded", "warm")
    shown = [k for k in phases if k.split("+")[0] in order]          # labelled variants after their phase
    for phase in sorted(shown, key=lambda k: (order.index(k.split("+")[0]), k)):
        for server in SERVERS:
            r = (phases.get(phase) or {}).get(server)
            if r:
                bars.append((f"{phase}\n{'vllm serve' if server == 'plain' else 'turingbox'}",
                             r.get("stages_s") or {}, r.get("ready_s"), r.get("first_ttft_s")))
    if not bars:
        return
    stage_names = [s for s, _ in MARKERS] + ["API server start", "turingbox warmup + checks"]
    colors = plt.cm.tab10.colors
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    labelled: set[str] = set()
    for i, (label, stages, total, _t) in enumerate(bars):
        left = 0.0
        for j, name in enumerate(stage_names):
            w = stages.get(name, 0.0)
            if w:
                ax.barh(i, w, left=left, color=colors[j % 10], label=None if name in labelled else name)
                labelled.add(name)
                left += w
        ax.text(left, i, (f" {total:.1f} s" if total < 100 else f" {total:.0f} s") if total else " not ready",
                va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from process start to ready")
    ax.set_title("Time to ready by stage (from log line arrival times)")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=7, loc="lower right")
    ttfts = [b[3] or 0 for b in bars]
    ax2.barh(range(len(bars)), ttfts, color="gray")
    ax2.set_yticks(range(len(bars)), ["" for _ in bars])
    ax2.invert_yaxis()
    ax2.set_xlabel("first request TTFT (s)")
    for i, v in enumerate(ttfts):
        ax2.text(v, i, f" {v:.3g} s", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", required=True, choices=(*PHASES, "report"))
    p.add_argument("--model", default="/tmp/demo", help="model directory (the demo model by default)")
    p.add_argument("--gpus", default="0", help="one GPU (servers one after the other) or two (side by side)")
    p.add_argument("--work", default="/tmp/turingbox-bench", help="caches, logs and results kept between phases")
    p.add_argument("--out", default=os.environ.get("OUT") or "docs/img", help="where startup.json/.png go")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget of this invocation")
    p.add_argument("--vllm-command", default=None, help="program for vLLM (tests: a stand-in)")
    p.add_argument("--turingbox-args", default="", help="extra flags for turingbox plan/serve/warmup")
    p.add_argument("--vllm-args", default="",
                   help="extra vLLM flags for both servers (turingbox passes them after --), e.g. --vllm-args=--language-model-only")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for both servers (repeatable), e.g. VLLM_WORKER_MULTIPROC_METHOD=fork")
    p.add_argument("--tb-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for turingbox only (repeatable), e.g. VLLM_WORKER_MULTIPROC_METHOD=fork")
    p.add_argument("--tb-wrap", default="",
                   help="a command that runs turingbox serve as its child (its argv follows), e.g. a profiler: "
                        "--tb-wrap='py-spy record --subprocesses --nonblocking -f raw -o /tmp/p.txt --'; the run is "
                        "stopped by a SIGTERM to turingbox itself, and the wrapper ends when turingbox has")
    p.add_argument("--label", default="",
                   help="keep this run's result as PHASE+LABEL (a variant beside the baseline); the caches in --work "
                        "are shared, so run the baseline's phases first (bench/gpu/README.md)")
    p.add_argument("--only", choices=SERVERS, help="run only one of the two servers")
    p.add_argument("--plain-caches", choices=PLAIN_CACHES, default="careful",
                   help="plain vLLM's cache settings: careful (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, "
                        "TRITON_CACHE_AUTOTUNING=1, Inductor's cache in HOME) or default (as installed)")
    p.add_argument("--plain-flashinfer-prebuilt", default="", metavar="DIR",
                   help="plain vLLM gets FlashInfer's prebuilt modules of this baked layout (TURINGBOX_AOT_FLASHINFER_DIR's"
                        " form) through a flashinfer-jit-cache stand-in, as a user who installs that package")
    p.add_argument("--copy-logs", action="store_true", help="also copy the logs to <out>/startup-logs")
    a = p.parse_args(argv)
    bench = Bench(a)
    results = bench.load()
    if a.phase != "report":
        log(f"phase {a.phase}: budget {a.budget_s:.0f} s, GPUs {bench.gpus}, work {bench.work}")
        plan = bench.plan()
        results.setdefault("plan", {k: plan.get(k) for k in (
            "cache_key", "gpu_name", "tensor_parallel_size", "num_speculative_tokens", "max_model_len",
            "attention_backend", "dtype", "kv_cache_dtype", "model")})
        t0 = time.monotonic()
        phase_result = getattr(bench, f"phase_{a.phase}")(plan)
        phase_result["wall_s"] = round(time.monotonic() - t0, 1)
        phase_result["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
        key = phase_key(a.phase, a.label)
        kept = results["phases"].get(key) or {}
        # One server at a time (--only; bench/gpu/README.md splits the A/B into calls that each fit a machine's
        # 10-minute window): the other server's result of the same phase stays beside this one.
        other = {s: kept[s] for s in SERVERS if s not in bench.servers() and s in kept}
        results["phases"][key] = {**phase_result, **other}
    bench.save(results)
    key = phase_key(a.phase, a.label)
    print(json.dumps({"phase": key, "result": results["phases"].get(key), "criteria": results["criteria"],
                      "fair_ab": results.get("fair_ab")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
