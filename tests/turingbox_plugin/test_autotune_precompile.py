"""Point 4 of turingbox_plugin.autotune: a tuning's configs compiled at once before its benchmark.

Runs Triton's real Autotuner.run -> prune_configs -> _bench path and its real compiler (ptxas included) for
sm_90 on a stub driver (the one part a GPU machine supplies; as tests/turingbox_warmup/image/test_triton_aot.py).
The benchmark's timing is the only thing stood in for: `_bench` launches each config through the JIT function
exactly as Triton's does (its launch kwargs + the config's), with warmup=True instead of do_bench's GPU
timing, and returns a timing that makes one config the best. Each compile is observed where Triton enters the
CUDA backend's stages (CUDABackend.add_stages), with the thread that ran it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from turingbox_plugin.autotune import MAX_COMPILE_THREADS, compile_threads

PROBE = r"""
import json, os, sys, threading, torch, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime import autotuner
from triton.runtime.driver import driver

class StubCudaDriver:
    target = GPUTarget("cuda", 90, 32)
    def get_current_target(self): return self.target
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_active_torch_device(self): return torch.device("cpu")

driver.set_active(StubCudaDriver())
compiles = []          # (kernel BLOCK, thread name, inside the benchmark loop)
in_bench = [False]
add_stages = CUDABackend.add_stages
def observed(self, stages, options, language):
    compiles.append((threading.current_thread().name, in_bench[0]))
    return add_stages(self, stages, options, language)
CUDABackend.add_stages = observed

def fake_bench(self, *args, config, **meta):
    # Triton's _bench launches dict(meta, **config.all_kwargs()) through self.fn.run inside do_bench
    in_bench[0] = True
    try:
        self.fn.run(*args, **dict(meta, **config.all_kwargs(), warmup=True))
    finally:
        in_bench[0] = False
    return [abs(config.kwargs["BLOCK"] - 128) + config.num_warps]   # best: BLOCK 128, 2 warps
autotuner.Autotuner._bench = fake_bench

hook = (lambda nargs: None) if sys.argv[2] == "prehook" else None     # a config's pre_hook (TMA-style kernels)
configs = [triton.Config({"BLOCK": b}, num_warps=w, pre_hook=hook) for b in (64, 128, 256) for w in (2, 4)]
@triton.autotune(configs=configs, key=["n"])
@triton.jit
def scale(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)
    tl.store(y + offs, tl.exp(v) * 2.0 + tl.sin(v), mask=offs < n)

from turingbox_plugin import autotune
assert autotune.install(False, None, capability=lambda: (9, 0), threads=int(sys.argv[1]))
x, y = torch.empty(4096), torch.empty(4096)
scale.run(x, y, 4096, grid=(32,), warmup=True)      # tunes (prune, benchmark), then the best config's warmup
print(json.dumps({"best": [scale.best_config.kwargs["BLOCK"], scale.best_config.num_warps],
                  "compiles": len(compiles), "in_bench": sum(1 for _, b in compiles if b),
                  "threads": sorted({t for t, _ in compiles})}))
"""


def _tune(tmp_path, threads: int, variant: str = "plain") -> dict:
    script = tmp_path / f"probe_{threads}_{variant}.py"   # @triton.jit needs a real source file
    script.write_text(PROBE)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / f"cache{threads}{variant}")}
    env.pop("TRITON_CACHE_AUTOTUNING", None)
    out = subprocess.run([sys.executable, str(script), str(threads), variant], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_configs_compile_on_threads_before_the_benchmark_and_the_choice_is_the_serial_one(tmp_path):
    parallel = _tune(tmp_path, 4)
    serial = _tune(tmp_path, 1)
    # serial (Triton as shipped): every config compiles inside the benchmark loop, on the main thread
    assert serial == {"best": [128, 2], "compiles": 6, "in_bench": 6, "threads": ["MainThread"]}
    # precompiled: the same six kernels, compiled by the pool before the loop; the loop compiles nothing
    assert parallel["best"] == [128, 2] and parallel["compiles"] == 6 and parallel["in_bench"] == 0
    assert parallel["threads"] and all(t.startswith("turingbox-autotune-compile") for t in parallel["threads"])


def test_a_tuning_with_pre_hooks_is_left_to_the_serial_benchmark(tmp_path):
    # a pre-hook may change what the kernel specialises on (Triton's disk cache skips such tunings too): compiled
    # without it, the pool's kernels would not be the benchmark's, so every config compiles in the loop as shipped
    assert _tune(tmp_path, 4, "prehook") == {"best": [128, 2], "compiles": 6, "in_bench": 6, "threads": ["MainThread"]}


@pytest.mark.parametrize("cpu_max,expected", [
    ("max 100000\n", None),                # no quota: the affinity
    ("150000 100000\n", 2),                # --cpus=1.5: two threads
    ("100000 100000\n", 1),
    ("garbage", None),                     # unreadable: the affinity
])
def test_usable_cpus_honours_a_containers_cpu_quota(tmp_path, cpu_max, expected):
    from turingbox_plugin.autotune import usable_cpus
    f = tmp_path / "cpu.max"
    f.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(str(f)) == (affinity if expected is None else min(affinity, expected))
    assert usable_cpus(str(tmp_path / "absent")) == affinity


@pytest.mark.parametrize("configured,cpus,workers,expected", [
    (None, 16, 1, 16),                     # one H100/H200 worker: every CPU, at the cap
    (None, 64, 1, MAX_COMPILE_THREADS),    # capped
    (None, 16, 4, 4),                      # 4 x 2080 Ti in TP: the CPUs shared among the four workers
    (None, 2, 4, 1),                       # fewer CPUs than workers: serial
    (None, 1, 1, 1),
    (1, 16, 1, 1),                         # TURINGBOX_AUTOTUNE_COMPILE_THREADS=1 (TBPLUGIN_...): serial
    (8, 2, 4, 8),                          # a configured number is taken as given
    (0, 16, 1, 1),
])
def test_compile_threads(configured, cpus, workers, expected):
    assert compile_threads(configured, cpus, workers) == expected
