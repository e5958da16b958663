"""The one vLLM launcher that serve and warmup share: the process environment and command line, the engine's
own status directory, the health client and the wait until vLLM answers, and the check of the workers'
plugin reports. Nothing here knows about the sidecar (serve) or the caches (warmup): they pass in what
they resolved."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import httpx

from turingbox.config import envs
from turingbox_plugin.status import read_worker_status

VLLM_MODULE = ("-m", "vllm.entrypoints.cli.main")
# vLLM flags whose value is a secret (masked in logs and in /turingbox/plan).
SECRET_FLAGS = ("--api-key", "--hf-token", "--ssl-keyfile-password")
MASK = "***"
def parent_env() -> Mapping[str, str]:
    """The environment vLLM inherits: this process's own. The one place the appliance reads the ambient
    environment for the engine (serve and warmup build vLLM's environment from it with vllm_env)."""
    return envs.process_environment()


def vllm_argv(vllm_args: Sequence[str], upstream_port: int, passthrough: list[str], vllm_command: str | None,
              python: str = sys.executable) -> list[str]:
    """The full command line for vLLM: program, the plan's vllm_args, loopback host/port, then `--` args."""
    program = shlex.split(vllm_command) if vllm_command else [python, *VLLM_MODULE]
    return [*program, *vllm_args, "--host", "127.0.0.1", "--port", str(upstream_port), *passthrough]


PLUGIN_FLAGS = ("--worker-cls", "--additional-config")   # what turingbox adds to vLLM's argv for the plugin


def plain_vllm_args(vllm_args: list[str]) -> list[str]:
    """The plan's vLLM arguments as a plain `vllm serve` takes them: without turingbox's worker class and
    additional config (`--flag value` and `--flag=value`). The benches and GPU checks compare against it."""
    out, skip = [], False
    for arg in vllm_args:
        if skip:
            skip = False
        elif arg in PLUGIN_FLAGS:
            skip = True
        elif arg.split("=", 1)[0] not in PLUGIN_FLAGS:
            out.append(arg)
    return out


# Plan env values that are only defaults: the operator's own variable, when set, is kept (how vLLM starts its
# engine core is theirs to choose; the plan forks it for text-only plans).
OPERATOR_WINS = ("VLLM_WORKER_MULTIPROC_METHOD",)


def vllm_env(parent: Mapping[str, str], plan_env: Mapping[str, Any] | None,
             extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """vLLM's process environment: the parent's, then the plan's env (the resolved values, the plugin
    contract's ENGINE_ENV among them; None unsets a variable, e.g. VLLM_PLUGINS; OPERATOR_WINS only where the
    parent lacks them), then extra (the cache paths). The appliance's own TURINGBOX_* settings stay: the plugin
    reads only its contract (additional_config and ENGINE_ENV, which the plan overrides)."""
    env = dict(parent)
    for k, v in (plan_env or {}).items():
        if k in OPERATOR_WINS and parent.get(k):
            continue
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    env.update(extra or {})
    return env


def flag_values(argv: list[str], flag: str) -> list[str]:
    """Every value given to flag (`--flag v` or `--flag=v`) in argv, in order."""
    values = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


def flag_value(argv: list[str], flag: str) -> str | None:
    """The last value given to flag in argv, or None."""
    values = flag_values(argv, flag)
    return values[-1] if values else None


def mask_argv(argv: list[str]) -> list[str]:
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.split("=", 1)[0] in SECRET_FLAGS:
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(arg)
    return out


def worker_check(workers: list[dict], tensor_parallel_size: int, require_plugin: bool,
                 data_parallel_size: int = 1) -> str | None:
    """None when the workers are fit to serve; otherwise one sentence saying what is wrong. Every worker of every
    data-parallel engine reports (the plugin numbers them engine x TP + rank: contract.status_rank)."""
    by_rank = {}
    for w in workers:
        try:
            by_rank[int(w.get("rank"))] = w
        except (TypeError, ValueError):
            continue
    expected = tensor_parallel_size * max(1, data_parallel_size)
    missing = [r for r in range(expected) if r not in by_rank]
    failed = [(r, (by_rank[r].get("warmup") or {})) for r in sorted(by_rank)
              if not (by_rank[r].get("warmup") or {}).get("ok")]
    if not require_plugin:
        return None
    if missing:
        ranks = ", ".join(map(str, missing))
        return (f"The turingbox plugin did not report from worker(s) {ranks} of {expected} while "
                "require_plugin is on: is turingbox-plugin installed where vLLM runs and VLLM_PLUGINS not empty?")
    if failed:
        rank, warm = failed[0]
        why = warm.get("error") or "no error given"
        return f"The plugin's strict warmup failed on worker {rank} ({why}) while require_plugin is on."
    return None


def strict_warmup_problems(workers: list[dict], tensor_parallel_size: int,
                           data_parallel_size: int = 1) -> list[str]:
    """Why the workers' own warmup reports do not prove a warm engine (empty list = they do): every worker of every
    data-parallel engine must report a passing warmup, and none compiled after ready (a seed's check, whatever
    require_plugin says)."""
    problems = []
    expected = tensor_parallel_size * max(1, data_parallel_size)
    if len(workers) < expected:
        problems.append(f"{len(workers)} of {expected} workers reported their warmup")
    for w in workers:
        warm = w.get("warmup") or {}
        if not warm.get("ok"):
            problems.append(f"worker {w.get('rank')} warmup failed: {warm.get('error') or 'no result'}")
    return problems + jit_after_ready(list(workers))


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instance_runtime_dir(base: str, kind: str) -> str:
    """A fresh directory for one engine's worker status files and compile logs, under `base`
    (`<base>/turingbox-<kind>-<pid>-XXXX`); directories of earlier instances whose process is gone are removed."""
    os.makedirs(base, exist_ok=True)
    for name in os.listdir(base):
        m = re.fullmatch(r"turingbox-(?:serve|warmup)-(\d+)-\w+", name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"turingbox-{kind}-{os.getpid()}-", dir=base)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # someone else's process
        return True
    return True


def read_workers(runtime_dir: str) -> list[dict]:
    """The workers' status files, read by the plugin's own reader (the plugin is a dependency of the appliance)."""
    return read_worker_status(runtime_dir)


def health_client(timeout: float) -> httpx.AsyncClient:
    """A fresh connection for every health check: vLLM's uvicorn closes idle keep-alive connections after
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s), and a probe written into one it is closing fails with a ReadError
    that says nothing about vLLM's health (seen on the GPU with a 5 s probe period)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False,
                             limits=httpx.Limits(max_keepalive_connections=0))


class EngineNotAnswering(Exception):
    """vLLM exited, or did not answer /health and /v1/models before the deadline; the message says which."""


async def wait_until_answering(base: str, deadline: float, running: Callable[[], bool],
                               api_key: str | None = None, what_timed_out: Callable[[], str] | None = None,
                               exit_sentence: Callable[[], str] | None = None) -> list[str]:
    """Poll until vLLM answers /health and /v1/models (it binds its port before the engine is up; /health only
    answers once it is), with a fresh connection for every poll (health_client). Returns the served model ids."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with health_client(2.0) as client:
        while True:
            if not running():
                raise EngineNotAnswering(exit_sentence() if exit_sentence else "vLLM exited before it was ready.")
            if time.monotonic() > deadline:
                raise EngineNotAnswering(what_timed_out() if what_timed_out else "vLLM did not answer in time.")
            try:
                r = await client.get(base + "/health")
                if r.status_code == 200:
                    models = await client.get(base + "/v1/models", headers=headers, timeout=10.0)
                    if models.status_code == 200:
                        return [m.get("id") for m in models.json().get("data", [])]
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.25)


# ---- the KV cache size a start is given (issue 35) --------------------------------------------------
# Given --kv-cache-memory-bytes, vLLM skips its CUDA-graph memory profile (~2.5 s on an H200). The size is what
# an earlier start of the same plan profiled, recorded in its cache entry (CacheSession.record_kv_size).
KV_SIZE_FLAG = "--kv-cache-memory-bytes"
# the operator's own sizing after `--` wins over a recorded size
MEMORY_SIZING_FLAGS = (KV_SIZE_FLAG, "--num-gpu-blocks-override", "--gpu-memory-utilization")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# What in vLLM's environment changes what its memory profile measures: vLLM's own switches (the CUDA-graph estimate,
# the model runner, the worker start method), PyTorch's allocator, the GPUs it sees. Locations and secrets are left
# out (a private copy of the entry, another HOME, a rotated key measure the same).
SIGNATURE_ENV_PREFIXES = ("VLLM_", "PYTORCH_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_")
SIGNATURE_ENV_SKIPPED = ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH", "VLLM_RPC_BASE_PATH",
                         "VLLM_API_KEY", "VLLM_ASSETS_CACHE", "VLLM_LOGGING_CONFIG_PATH", "VLLM_HOST_IP", "VLLM_PORT")


def engine_signature(vllm_args: Sequence[str], passthrough: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """sha256 of what sizes vLLM's memory: the plan's vllm_args, the `--` args and the part of vLLM's environment
    that changes its memory profile (SIGNATURE_ENV_PREFIXES). A recorded KV size holds only for the same signature
    (another --gpu-memory-utilization, max model len or VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS sizes it
    differently). Secret values are masked first: the hash is stored in the entry's manifest."""
    argv = mask_argv([*map(str, vllm_args), "--", *map(str, passthrough)])
    environment = sorted((k, str(v)) for k, v in (env or {}).items()
                         if k.startswith(SIGNATURE_ENV_PREFIXES) and k not in SIGNATURE_ENV_SKIPPED)
    return hashlib.sha256(json.dumps([argv, environment]).encode()).hexdigest()


def memory_sizing_flags(passthrough: Sequence[str]) -> list[str]:
    """The flags after `--` that size vLLM's memory themselves."""
    return [f for f in MEMORY_SIZING_FLAGS if flag_values(list(passthrough), f)]


def kv_size_args(recorded: int | None, passthrough: Sequence[str]) -> list[str]:
    """[--kv-cache-memory-bytes, N] for a recorded size N, unless the `--` args size memory themselves."""
    if not _positive_int(recorded) or memory_sizing_flags(passthrough):
        return []
    return [KV_SIZE_FLAG, str(recorded)]


def kv_size_sentence(enabled: bool, recorded: int | None, passthrough: Sequence[str]) -> str:
    """The log line saying whether this start is given a recorded KV size, and why not."""
    sizing = memory_sizing_flags(passthrough)
    if enabled and _positive_int(recorded) and not sizing:
        return (f"KV cache size from the cache entry: {recorded / 2**30:.2f} GiB ({KV_SIZE_FLAG} {recorded}): "
                "vLLM skips its CUDA-graph memory profile")
    if not enabled:
        why = "kv_size_from_cache is off"
    elif sizing:
        why = "the arguments after -- size memory: " + ", ".join(sizing)
    else:
        why = "no size recorded in the cache entry for this plan and these arguments yet"
    return f"KV cache size: vLLM profiles memory at this start ({why})"


@dataclass(frozen=True)
class StartKvSize:
    """One start's KV size, as serve and the seed decide it alike (kv_size_for_start): the signature its
    measurement is recorded under, the args that give it a recorded size ([] : vLLM profiles), the log line, and
    how many workers must report a measured size (TP x DP)."""
    signature: str
    args: list[str]
    sentence: str
    workers: int

    @property
    def given(self) -> bool:
        return bool(self.args)

    def measured(self, workers: Sequence[Mapping[str, Any]], graphs_compiled: int, graphs_loaded: int) -> int | None:
        """What to record from this start's workers (measured_kv_size), or None."""
        return measured_kv_size(workers, graphs_compiled, graphs_loaded, self.workers)


def kv_size_for_start(plan: Any, passthrough: Sequence[str], env: Mapping[str, str], enabled: bool,
                      recorded_of: Callable[[str], int | None] | None) -> StartKvSize:
    """Decide a start's KV size: recorded_of(signature) reads the cache entry's record (None: no entry)."""
    signature = engine_signature(plan.vllm_args, passthrough, env)
    recorded = recorded_of(signature) if enabled and recorded_of is not None else None
    return StartKvSize(signature, kv_size_args(recorded, passthrough), kv_size_sentence(enabled, recorded, passthrough),
                       plan.tensor_parallel_size * max(1, plan.data_parallel_size))


# The plugin's fix that keeps --kv-cache-memory-bytes out of vLLM's compile key (turingbox_plugin.vllm_fixes), as
# each worker reports it: without it a start given the size would recompile every graph (vllm#47356).
KV_KEY_FIX = "kv_size_out_of_compile_key"


def _kv_key_fix_holds(worker: Mapping[str, Any]) -> bool:
    fixes = (worker.get("active") or {}).get("vllm_fixes")
    verdict = fixes.get(KV_KEY_FIX, "") if isinstance(fixes, Mapping) else ""
    return verdict == "applied" or verdict.startswith("skipped: vLLM already leaves")


def measured_kv_size(workers: Sequence[Mapping[str, Any]], graphs_compiled: int, graphs_loaded: int,
                     expected: int = 1) -> int | None:
    """The KV size to record from a start: the smallest any worker profiled (vLLM sizes every worker alike), or
    None. Only a start that loaded its graphs and compiled none counts: one that compiled them peaks higher and sizes
    less KV (H200: 79.84 against 81.19 GiB), and the starts given the size load (an eager plan has no graphs and no
    CUDA-graph profile to skip). Every worker (at least `expected`) must have profiled it (kv_cache.given False),
    else the minimum might miss the worker with the least, and must run the plugin's compile-key fix, else a start
    given the size recompiles."""
    sizes = []
    for w in workers:
        kv = w.get("kv_cache")
        if not isinstance(kv, Mapping) or kv.get("given") is not False or not _positive_int(kv.get("bytes")) \
                or not _kv_key_fix_holds(w):
            return None
        sizes.append(kv["bytes"])
    if graphs_compiled or not graphs_loaded or not sizes or len(sizes) < expected:
        return None
    return min(sizes)


def jit_after_ready(workers: list[dict]) -> list[str]:
    """One phrase per worker that compiled a kernel after ready (empty: none did)."""
    out = []
    for w in workers:
        jit = {k: v for k, v in (w.get("jit_after_ready") or {}).items() if v}
        if jit:
            out.append(f"worker {w.get('rank')} compiled after ready: " + ", ".join(sorted(jit)))
    return out
