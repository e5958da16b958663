"""The KV cache size a start is given (issue 35): the engine signature a recorded size holds for, whether a start
gets --kv-cache-memory-bytes, which size a start's workers measured (turingbox.engine.launch), and the flag
reaching the stand-in vLLM through Engine's extra_args."""
from __future__ import annotations

import asyncio
import io
import os
import sys

import pytest

from tests.support import plan_factory
from tests.support.sidecar_harness import FAKE_VLLM
from turingbox.engine.engine import Engine
from turingbox.engine.launch import (engine_signature, kv_size_args, kv_size_sentence, measured_kv_size,
                                     vllm_env)

GIB = 2**30
PLAN_ARGS = ["serve", "/m", "--max-model-len", "262144", "--gpu-memory-utilization", "0.96"]


@pytest.mark.parametrize("args, passthrough, same", [
    (PLAN_ARGS, [], True),
    (PLAN_ARGS, ["--enable-log-requests"], False),                          # the `--` args count
    (["serve", "/m", "--max-model-len", "131072", "--gpu-memory-utilization", "0.96"], [], False),
    (["serve", "/m", "--max-model-len", "262144", "--gpu-memory-utilization", "0.9"], [], False),
    (PLAN_ARGS[:-2], ["--gpu-memory-utilization", "0.96"], False),          # moved across `--`: another start
])
def test_the_signature_is_the_argv_that_sizes_memory(args, passthrough, same):
    base = engine_signature(PLAN_ARGS, [])
    assert (engine_signature(args, passthrough) == base) is same
    assert len(base) == 64 and engine_signature(tuple(PLAN_ARGS), ()) == base


@pytest.mark.parametrize("env, same", [
    ({"HOME": "/other", "VLLM_CACHE_ROOT": "/tmp/copy/vllm", "TRITON_CACHE_DIR": "/x", "VLLM_API_KEY": "k"}, True),
    ({"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}, False),      # vLLM then does not subtract graph memory
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
    ({"CUDA_VISIBLE_DEVICES": "1"}, False),
    ({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, False),
])
def test_the_signature_holds_vllms_environment_that_changes_its_profile(env, same):
    base = {"CUDA_VISIBLE_DEVICES": "0", "VLLM_WORKER_MULTIPROC_METHOD": "fork", "HOME": "/root"}
    assert (engine_signature(PLAN_ARGS, [], {**base, **env}) == engine_signature(PLAN_ARGS, [], base)) is same


def test_the_signature_holds_no_secret_and_ignores_its_value():
    """It is stored in the entry's manifest: a key vLLM was given after `--` is masked before hashing."""
    a = engine_signature(PLAN_ARGS, ["--api-key", "sk-one"])
    assert a == engine_signature(PLAN_ARGS, ["--api-key", "sk-two"])
    assert a == engine_signature(PLAN_ARGS, ["--api-key", "***"])
    assert a != engine_signature(PLAN_ARGS, [])


@pytest.mark.parametrize("recorded, passthrough, args", [
    (87_177_098_690, [], ["--kv-cache-memory-bytes", "87177098690"]),
    (87_177_098_690, ["--enable-log-requests"], ["--kv-cache-memory-bytes", "87177098690"]),
    (None, [], []),                                                        # nothing recorded yet
    (0, [], []), (-5, [], []), (True, [], []), ("123", [], []), (1.5, [], []),
    # the operator sizes memory after `--`, in either form: theirs wins
    (87_177_098_690, ["--gpu-memory-utilization", "0.8"], []),
    (87_177_098_690, ["--gpu-memory-utilization=0.8"], []),
    (87_177_098_690, ["--kv-cache-memory-bytes", "1000"], []),
    (87_177_098_690, ["--num-gpu-blocks-override=64"], []),
])
def test_a_start_gets_the_recorded_size_unless_the_passthrough_sizes_memory(recorded, passthrough, args):
    assert kv_size_args(recorded, passthrough) == args


@pytest.mark.parametrize("enabled, recorded, passthrough, sentence", [
    (True, int(81.19 * GIB), [], "KV cache size from the cache entry: 81.19 GiB (--kv-cache-memory-bytes "
                                 "87177098690): vLLM skips its CUDA-graph memory profile"),
    (False, int(81.19 * GIB), [], "KV cache size: vLLM profiles memory at this start (kv_size_from_cache is off)"),
    (True, None, [], "KV cache size: vLLM profiles memory at this start (no size recorded in the cache entry for "
                     "this plan and these arguments yet)"),
    (True, 5 * GIB, ["--gpu-memory-utilization=0.8"],
     "KV cache size: vLLM profiles memory at this start (the arguments after -- size memory: "
     "--gpu-memory-utilization)"),
])
def test_the_log_line_says_which_it_was(enabled, recorded, passthrough, sentence):
    assert kv_size_sentence(enabled, recorded, passthrough) == sentence


def worker(rank, nbytes=80 * GIB, given=False, fix="applied"):
    return {"rank": rank, "kv_cache": {"bytes": nbytes, "given": given},
            "active": {"vllm_fixes": {"kv_size_out_of_compile_key": fix}}}


@pytest.mark.parametrize("workers, compiled, expected, measured", [
    ([worker(0)], 0, 1, 80 * GIB),
    ([worker(0, 81 * GIB), worker(1, 80 * GIB)], 0, 2, 80 * GIB),           # vLLM sizes every worker alike
    ([worker(0)], 2, 1, None),                 # compiled its graphs: peaked higher, sized less KV
    # without the plugin's compile-key fix a start given the size would recompile every graph (vllm#47356)
    ([worker(0, fix="skipped: vllm.config.cache.CacheConfig.compute_hash is not vLLM 0.21.0's")], 0, 1, None),
    ([worker(0, fix="failed: ImportError: x")], 0, 1, None),
    ([{"rank": 0, "kv_cache": {"bytes": 80 * GIB, "given": False}}], 0, 1, None),
    ([worker(0, fix="skipped: vLLM already leaves kv_cache_memory_bytes out of its compile key")], 0, 1, 80 * GIB),
    ([worker(0, given=True)], 0, 1, None),     # given the size: nothing measured
    ([worker(0), worker(1, given=True)], 0, 2, None),
    ([worker(0), {"rank": 1}], 0, 2, None),    # a worker without the plugin's report (an older plugin)
    ([worker(0), {"rank": 1, "kv_cache": None}], 0, 2, None),
    ([worker(0, 0)], 0, 1, None), ([worker(0, -1)], 0, 1, None), ([worker(0, "80")], 0, 1, None),
    ([worker(0, True)], 0, 1, None), ([worker(0, 1.5e10)], 0, 1, None),
    ([{"rank": 0, "kv_cache": {"bytes": 80 * GIB}}], 0, 1, None),           # "given" missing: not known profiled
    ([], 0, 1, None),
    ([worker(0)], 0, 2, None),                 # a worker of TP 2 did not report: its size may be the least
])
def test_the_size_recorded_from_a_start(workers, compiled, expected, measured):
    assert measured_kv_size(workers, compiled, 2, expected) == measured


def test_a_start_that_loaded_no_graph_records_nothing():
    """An eager plan compiles and loads nothing: its first start may have profiled during its JIT, and it has no
    CUDA-graph profile to skip."""
    assert measured_kv_size([worker(0)], 0, 0) is None


def test_extra_args_reach_vllm_between_the_plans_args_and_its_address(tmp_path):
    """Engine puts the recorded size after the plan's args, before host/port and the operator's `--` args; the
    stand-in, as the plugin does, reports the size it was given."""
    plan = plan_factory.planned()
    parent = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "FAKE_VLLM_"))}
    engine = Engine(plan, env=vllm_env(parent, plan.env), runtime_base=str(tmp_path / "runtime"), kind="warmup",
                    vllm_command=f"{sys.executable} {FAKE_VLLM}", passthrough=["--fake-chunks", "2"],
                    extra_args=kv_size_args(12 * GIB, []), answer_timeout_s=30.0, stop_grace_s=5.0,
                    output=io.BytesIO())
    n = len(plan.vllm_args)
    assert engine.argv[2:2 + n + 2] == [*plan.vllm_args, "--kv-cache-memory-bytes", str(12 * GIB)]
    assert engine.argv[2 + n + 2:] == ["--host", "127.0.0.1", "--port", str(engine.port), "--fake-chunks", "2"]

    async def sequence():
        await engine.start()
        try:
            await engine.wait_until_answering(lambda: "late")
            return engine.check(strict=True)
        finally:
            await engine.stop()
    workers = asyncio.run(sequence())
    engine.remove_runtime_dir()
    assert [w["kv_cache"] for w in workers] == [{"bytes": 12 * GIB, "given": True}]
    assert measured_kv_size(workers, 0, 2) is None
