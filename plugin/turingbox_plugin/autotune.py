"""Triton autotune adjustments installed in workers (never in the API server or engine core).

1. sm_75 (any cc < 8.0): Triton's software pipeliner needs cp.async (sm_80+), so configs that
   differ only in `num_stages` compile to the same code; FLA's GDN lists benchmark 3-4 identical
   variants each. `dedupe_num_stages` keeps the first config of each group, which cuts autotune
   time without changing the chosen kernel.
2. `cache_results` is re-evaluated when tuning runs, not when the module was imported, so
   TRITON_CACHE_AUTOTUNING works regardless of import order.
3. Autotune disk lookups use one stable directory (the TRITON_CACHE_DIR the worker started with),
   because vLLM redirects TRITON_CACHE_DIR on cold compiles but not on AOT cache loads (see the
   package docstring), which otherwise makes every warm restart re-tune.
4. A tuning that benchmarks compiles every config first, all at once on `compile_threads` threads
   (Triton's own AsyncCompileMode; `precompile`), instead of one config at a time inside the
   benchmark loop. Triton releases the GIL in its MLIR/LLVM passes and runs ptxas as a subprocess, so
   the compiles overlap (2 threads on 2 cores: 1.8x). On a cold start FLA's six GDN tunings compile
   88 configs (~1 s each, ~90 s on the H200 in session 17); the benchmark then only times them. The
   kernels and the choice are the ones the serial loop would make: same specialisations, same
   in-memory cache keys, and a config that fails to compile fails again in the benchmark, which
   reports it as Triton does.

The decisions are pure functions; `install()` patches `triton.runtime.autotuner.Autotuner` once.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

from turingbox_plugin import contract

_installed = False
_lock = threading.Lock()


def config_identity_without_stages(config: Any) -> tuple:
    """Everything that distinguishes a triton.Config except num_stages."""
    kwargs = tuple(sorted((getattr(config, "kwargs", None) or {}).items()))
    return (kwargs, getattr(config, "num_warps", None), getattr(config, "num_ctas", None),
            getattr(config, "maxnreg", None), getattr(config, "pre_hook", None) is not None,
            repr(getattr(config, "ir_override", None)))


def dedupe_num_stages(configs: Sequence[Any]) -> list[Any]:
    """Keep the first config of each group that differs only in num_stages (order preserved)."""
    seen: set = set()
    out = []
    for c in configs:
        ident = config_identity_without_stages(c)
        if ident in seen:
            continue
        seen.add(ident)
        out.append(c)
    return out


def stages_matter(capability: tuple[int, int]) -> bool:
    """num_stages changes generated code only where Triton can pipeline loads (sm_80+)."""
    return tuple(capability) >= (8, 0)


MAX_COMPILE_THREADS = 16
_pending = threading.local()     # (tuner, configs) whose first benchmark in this thread compiles them at once


def usable_cpus(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (a container's --cpus), which
    the affinity does not show."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open(cgroup_cpu_max, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))     # ceil: 1.5 CPUs -> 2 threads
    except (OSError, ValueError):
        pass
    return cpus


def compile_threads(configured: int | None, cpus: int, gpu_workers: int) -> int:
    """Threads compiling one tuning's configs at once: the configured number, else this process's CPUs shared
    among the GPU workers of the host (they tune at the same moment), at most MAX_COMPILE_THREADS; 1 = serial."""
    if configured is not None:
        return max(1, configured)
    return max(1, min(MAX_COMPILE_THREADS, cpus // max(1, gpu_workers)))


def precompile(tuner: Any, configs: Sequence[Any], args: Sequence[Any], meta: dict, threads: int) -> int:
    """Compile every config of one tuning at once, as `tuner._bench` would launch it (the launch's own
    kwargs, each config's kwargs, `warmup=True`: compile, no launch), on up to `threads` threads through
    Triton's AsyncCompileMode. Each kernel lands in the JIT function's in-memory cache under the key the
    benchmark's launch computes, so the benchmark compiles nothing. Returns how many were submitted."""
    from triton.runtime._async_compile import AsyncCompileMode, active_mode
    n = min(threads, len(configs))
    if n < 2 or active_mode.get() is not None:   # inside another pool's compiles (the strict warmup's sweep)
        return 0
    # A pre-hook runs before each launch and may change what the kernel specialises on (a TMA descriptor's block
    # shape): compiled without it, the kernels would not be the benchmark's. Triton's disk cache skips such
    # tunings too (Autotuner.check_disk_cache); none of vLLM 0.21's kernels has one.
    if getattr(tuner, "user_defined_pre_hook", False) or any(getattr(c, "pre_hook", None) for c in configs):
        return 0
    submitted = 0
    pool = ThreadPoolExecutor(n, thread_name_prefix="turingbox-autotune-compile")
    try:
        with AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:
                kwargs = dict(meta, **config.all_kwargs())
                kwargs["warmup"] = True
                try:
                    tuner.fn.run(*args, **kwargs)
                except Exception:  # noqa: BLE001 - the benchmark launches it again and reports it as Triton does
                    continue
                submitted += 1
    finally:
        # Triton's __exit__ resets the mode only when every finalize returned: never leave the benchmark's
        # launches pointed at this (then shut down) pool (as specializations._compile_pool)
        active_mode.set(None)
        # normally every compile is finished here (__exit__ waited); on an error or a signal, drop the queued ones
        pool.shutdown(wait=True, cancel_futures=True)
    return submitted


def install(prune_num_stages: bool, stable_cache_dir: str | None,
            capability: Callable[[], tuple[int, int]] | None = None, threads: int = 1) -> bool:
    """Patch Triton's Autotuner in this (worker) process; idempotent. Returns True when installed.
    `threads` > 1: a tuning's configs are compiled at once before its benchmark (point 4)."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from triton import knobs
            from triton.runtime import autotuner
        except ImportError:
            return False
        cls = autotuner.Autotuner
        original_prune = cls.prune_configs
        original_check = cls.check_disk_cache
        original_bench = cls._bench
        cap_cache: list[tuple[int, int]] = []

        def current_capability() -> tuple[int, int]:
            if not cap_cache:
                if capability is not None:
                    cap_cache.append(tuple(capability()))
                else:
                    import torch  # the worker has CUDA initialised by the time kernels tune
                    cap_cache.append(tuple(torch.cuda.get_device_capability()))
            return cap_cache[0]

        def prune_configs(self, kwargs, *args, **kw):
            configs = original_prune(self, kwargs, *args, **kw)
            # Decide disk caching now (see module docstring, point 2).
            self.cache_results = bool(self.cache_results or knobs.autotuning.cache) and not knobs.runtime.interpret
            if prune_num_stages and not stages_matter(current_capability()):
                configs = dedupe_num_stages(configs)
            # Triton prunes only for a key it has not tuned; its benchmark (if the disk cache misses) follows, in
            # this thread (per thread: two threads tuning one kernel must not take each other's configs)
            _pending.item = (self, list(configs)) if threads > 1 and len(configs) > 1 else None
            return configs

        def _bench(self, *args, config, **meta):
            item = getattr(_pending, "item", None)
            if item is not None and item[0] is self:
                _pending.item = None
                try:
                    precompile(self, item[1], args, meta, threads)
                except Exception:  # noqa: BLE001 - an optimisation only: the serial benchmark below still compiles
                    pass
            return original_bench(self, *args, config=config, **meta)

        def check_disk_cache(self, tuning_key, configs, bench_fn):
            if not stable_cache_dir:
                return original_check(self, tuning_key, configs, bench_fn)
            with _lock_env:
                # Triton's autotune cache follows TRITON_CACHE_DIR in the process env
                with contract.override_variable("TRITON_CACHE_DIR", stable_cache_dir):
                    return original_check(self, tuning_key, configs, bench_fn)

        cls.prune_configs = prune_configs
        cls.check_disk_cache = check_disk_cache
        cls._bench = _bench
        _installed = True
        return True


_lock_env = threading.RLock()


def describe(configs: Iterable[Any]) -> list[str]:
    return [str(c) for c in configs]
