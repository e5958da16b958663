"""The pure parts of serve: stage detection, estimates, worker check, argv, redaction."""
from __future__ import annotations

import os
import sys

import pytest

from turingbox.errors import UsageError
from turingbox.serve import stages
from turingbox.engine.launch import (flag_value, mask_argv, strict_warmup_problems, vllm_argv, vllm_env,
                                     worker_check)
from turingbox.serve.controller import cache_is_warm, check_passthrough, make_redactor, public_plan
from turingbox import config
from turingbox.serve.options import api_key_state
from turingbox.serve.metrics import route_label
from turingbox.engine.supervisor import describe_exit

# Real vLLM 0.21.0 log lines (messages as formatted by its loggers) -> the stage they announce.
VLLM_LINES = [
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:03 [gpu_model_runner.py:4858] Starting to load model /models/demo...", "loading"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:09 [default_loader.py:398] Loading weights took 5.12 seconds", "loading"),
    ("Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:03<00:03,  1.52s/it]", "loading"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:10 [gpu_model_runner.py:4960] Model loading took 15.2 GiB memory and 6.2 seconds", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:11 [backends.py:1090] Using cache directory: /c/torch_compile_cache/ab/rank_0_0/backbone for vLLM's torch.compile", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:19 [backends.py:1149] Dynamo bytecode transform time: 7.91 s", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:25 [backends.py:394] Compiling a graph for compile range (1, 8192) takes 5.10 s", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:25 [monitor.py:53] torch.compile took 13.01 s in total", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:30 [gpu_worker.py:463] Available KV cache memory: 98.1 GiB", "compiling"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:30 [kv_cache_utils.py:1710] GPU KV cache size: 1,234,567 tokens", "compiling"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 35/35 [00:04<00:00,  8.1it/s]", "capturing"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:40 [gpu_model_runner.py:6244] Graph capturing finished in 5 secs, took 0.52 GiB", "capturing"),
    ("(EngineCore_DP0 pid=812) INFO 05-01 10:00:41 [core.py:307] init engine (profile, create kv cache, warmup model) took 30.1 s", "capturing"),
    ("(APIServer pid=700) INFO 05-01 10:00:42 [api_server.py:617] Starting vLLM server on http://127.0.0.1:8100", None),
    ("(APIServer pid=700) INFO 05-01 10:00:01 [utils.py:240] non-default args: {'model': '/models/demo'}", None),
]


@pytest.mark.parametrize("line,stage", VLLM_LINES)
def test_stage_from_vllm_log_line(line, stage):
    assert stages.stage_from_log_line(line) == stage


def _vllm_source() -> str | None:
    """vLLM's source where the AOT derivation finds it (installed vllm, TURINGBOX_VLLM_SRC, make test-setup's copy)."""
    from turingbox_warmup.image.aot_specs.derive import default_vllm_src
    src = default_vllm_src()
    return src if os.path.isdir(src) else None


def test_every_stage_pattern_is_still_in_vllm_source():
    """Guards the substrings against a vLLM upgrade rewording its messages."""
    root = _vllm_source()
    if root is None:
        pytest.skip("no vLLM source here (set TURINGBOX_VLLM_SRC, or run make test-setup)")
    text = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    text.append(f.read())
    source = "\n".join(text)
    # Messages built from %-format strings: compare the fixed text before the first placeholder.
    needles = [needle for needle, _ in stages.LOG_STAGE_PATTERNS] + [stages.GRAPH_COMPILED, stages.GRAPH_LOADED]
    missing = [needle for needle in needles if needle.split("%")[0] not in source]
    assert not missing, f"not found in {root}: {missing}"


def test_tracker_moves_forward_only_and_keeps_durations():
    now = [100.0]
    t = stages.StartupTracker(clock=lambda: now[0])
    now[0] = 102.0
    assert t.advance(stages.STARTING)
    t.observe_log_line("Starting to load model x...")
    assert t.stage == stages.LOADING
    now[0] = 110.0
    t.observe_log_line("Capturing CUDA graphs (decode, FULL)")
    t.observe_log_line("Loading weights took 1 s")          # late line from another rank: no step back
    assert t.stage == stages.CAPTURING
    assert t.durations == {stages.PLANNING: 2.0, stages.STARTING: 0.0, stages.LOADING: 8.0}
    now[0] = 115.0
    t.advance(stages.WARMING)
    t.observe_log_line("Starting to load model x...")       # log lines no longer move it after startup
    assert t.stage == stages.WARMING
    t.advance(stages.READY)
    assert t.ready_after_s == 15.0 and t.estimate() == 0.0
    t.advance(stages.DRAINING)
    assert not t.advance(stages.READY) and t.stage == stages.DRAINING and t.estimate() is None


# vLLM 0.21.0's lines from session 11's seeded start (a cache hit that compiled anyway), and plain vLLM's warm start.
COMPILED = "(EngineCore pid=3449) INFO 12-02 13:17:46 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 20.74 s"
LOADED = ("(EngineCore pid=4761) INFO 12-02 13:26:00 [backends.py:292] Directly load the compiled graph(s) for compile "
          "range (1, 8192) from the cache, took 3.932 s")


def test_a_cache_hit_that_compiles_anyway_is_named_at_ready():
    t = stages.StartupTracker()
    t.advance(stages.STARTING)
    for line in ("Starting to load model x...", COMPILED, COMPILED):
        t.observe_log_line(line)
    assert (t.graphs_compiled, t.graphs_loaded) == (2, 0) and t.stage == stages.COMPILING
    assert not t.compile_cache_missed                       # a cold start compiles: no mismatch
    t.profile = "warm"
    assert t.compile_cache_missed
    warning = stages.compile_cache_warning("warm", t.graphs_compiled, t.graphs_loaded, "/cache/entries/88e3")
    assert warning.startswith("the compile cache was a hit, but vLLM compiled 2 torch.compile graph(s) and loaded 0")
    assert "cache_key_factors.json files under vllm/torch_compile_cache in /cache/entries/88e3" in warning
    assert stages.compile_cache_warning("cold", 2, 0, None) is None      # a miss compiles: nothing to say
    assert stages.compile_cache_warning("warm", 2, 0, None, cache_disabled=True).startswith(
        "VLLM_DISABLE_COMPILE_CACHE is set, so vLLM compiled 2 torch.compile graph(s) instead of loading them")
    t2 = stages.StartupTracker()
    t2.advance(stages.STARTING)
    for line in (LOADED, LOADED):
        t2.observe_log_line(line)
    assert (t2.graphs_compiled, t2.graphs_loaded) == (0, 2)
    assert stages.compile_cache_warning("warm", 0, 2, None) is None
    t2.advance(stages.READY)
    t2.observe_log_line(COMPILED)                            # after ready: not the start's (and not a stage)
    assert t2.graphs_compiled == 0


def test_estimate_counts_down_and_never_below_one_second_per_stage():
    typical = stages.TYPICAL_SECONDS["cold"]
    full = stages.estimate_remaining(stages.PLANNING, 0, typical)
    assert full == sum(typical.values())
    assert stages.estimate_remaining(stages.COMPILING, 100, typical) == typical[stages.COMPILING] - 100 + \
        typical[stages.CAPTURING] + typical[stages.WARMING]
    assert stages.estimate_remaining(stages.WARMING, 10_000, typical) == 1.0
    assert stages.estimate_remaining(stages.READY, 0, typical) == 0.0
    assert stages.estimate_remaining(stages.LOADING, 0, stages.TYPICAL_SECONDS["warm"]) < \
        stages.estimate_remaining(stages.LOADING, 0, typical)


def test_worker_check():
    ok = {"rank": 0, "warmup": {"ok": True}}
    assert worker_check([ok, dict(ok, rank=1)], 2, True) is None
    msg = worker_check([ok], 2, True)
    assert "worker(s) 1 of 2" in msg and msg.endswith("?")
    msg = worker_check([ok, {"rank": 1, "warmup": {"ok": False, "error": "JIT after warmup: k1"}}], 2, True)
    assert msg == "The plugin's strict warmup failed on worker 1 (JIT after warmup: k1) while require_plugin is on."
    assert worker_check([], 4, False) is None
    # TP=2 x DP=2: the second engine's workers are 2 and 3 (contract.status_rank); both engines must report
    assert worker_check([dict(ok, rank=r) for r in range(4)], 2, True, data_parallel_size=2) is None
    msg = worker_check([ok, dict(ok, rank=1)], 2, True, data_parallel_size=2)
    assert "worker(s) 2, 3 of 4" in msg
    # the seed's check counts every engine's workers too
    assert strict_warmup_problems([dict(ok, rank=r) for r in range(4)], 2, 2) == []
    assert strict_warmup_problems([ok, dict(ok, rank=1)], 2, 2) == ["2 of 4 workers reported their warmup"]


def test_vllm_argv_and_passthrough():
    vllm_args = ("serve", "/m", "--tensor-parallel-size", "2")      # a Plan's vllm_args
    argv = vllm_argv(vllm_args, 8100, ["--max-num-seqs", "4"], None, python="/py")
    assert argv == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--tensor-parallel-size", "2",
                    "--host", "127.0.0.1", "--port", "8100", "--max-num-seqs", "4"]
    argv = vllm_argv(vllm_args, 1, [], "'/usr/bin/env' python3 fake.py")
    assert argv[:3] == ["/usr/bin/env", "python3", "fake.py"] and argv[3] == "serve"
    for bad in (["--port", "1"], ["--host=0.0.0.0"], ["--uds", "/x"]):
        with pytest.raises(UsageError):
            check_passthrough(bad)
    check_passthrough(["--max-num-seqs", "4", "--portable"])
    assert flag_value(["--api-key", "a", "--api-key=b"], "--api-key") == "b"


def test_vllm_env_is_the_parents_overlaid_by_the_plans():
    """No variable is stripped (the plugin reads only its contract's TBPLUGIN_* names, never the appliance's
    TURINGBOX_* settings); the plan's values win, None unsets."""
    parent = {"PATH": "/bin", "HF_TOKEN": "hf", "VLLM_PLUGINS": "", "TURINGBOX_GDN": "auto",
              "TURINGBOX_STRICT_WARMUP": "0", "TURINGBOX_RUNTIME_DIR": "/raw", "TBPLUGIN_GDN_LIB": "/opt/gdn.so"}
    plan_env = {"TBPLUGIN_RUNTIME_DIR": "/resolved", "TBPLUGIN_BENCHMARK_MODE": "0", "CUDA_VISIBLE_DEVICES": "1",
                "VLLM_PLUGINS": None}
    env = vllm_env(parent, plan_env, {"TRITON_CACHE_DIR": "/c/triton"})
    assert env == {"PATH": "/bin", "HF_TOKEN": "hf", "TURINGBOX_GDN": "auto", "TURINGBOX_STRICT_WARMUP": "0",
                   "TURINGBOX_RUNTIME_DIR": "/raw", "TBPLUGIN_RUNTIME_DIR": "/resolved",
                   "TBPLUGIN_BENCHMARK_MODE": "0", "CUDA_VISIBLE_DEVICES": "1",
                   "TRITON_CACHE_DIR": "/c/triton", "TBPLUGIN_GDN_LIB": "/opt/gdn.so"}
    assert parent["VLLM_PLUGINS"] == "" and "TBPLUGIN_RUNTIME_DIR" not in parent   # the parent's mapping is left alone


def test_the_plans_engine_start_method_is_a_default_the_operator_overrides():
    fork = {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "CUDA_VISIBLE_DEVICES": "0"}
    assert vllm_env({}, fork)["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    env = vllm_env({"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "CUDA_VISIBLE_DEVICES": "3"}, fork)
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"       # the operator's choice
    assert env["CUDA_VISIBLE_DEVICES"] == "0"                    # the plan's GPUs are not a default


def test_api_key_state():
    def state(env):
        return api_key_state(config.load(None, env, groups=("serve",)).serve)

    on, line = state({"TURINGBOX_API_KEY": "sk-9f3Q"})
    assert on is True and line.startswith("API key: on") and "sk-9f3Q" not in line
    assert state({"TURINGBOX_API_KEY": ""}) == (False, "API key: off (TURINGBOX_API_KEY is set but empty)")
    assert state({}) == (False, "API key: off (TURINGBOX_API_KEY is not set)")


def test_redaction():
    assert mask_argv(["serve", "m", "--api-key", "k", "--hf-token=t", "--x", "1"]) == \
        ["serve", "m", "--api-key", "***", "--hf-token=***", "--x", "1"]
    plan = {"vllm_args": ["serve", "--api-key", "k1"], "env": {"HF_TOKEN": "hf", "CUDA_VISIBLE_DEVICES": "0"},
            "note": "contains sk-live-42 somewhere"}
    p = public_plan(plan, ["sk-live-42"])
    assert p["vllm_args"] == ["serve", "--api-key", "***"]
    assert p["env"] == {"HF_TOKEN": "***", "CUDA_VISIBLE_DEVICES": "0"}
    assert "sk-live-42" not in str(p) and plan["env"]["HF_TOKEN"] == "hf"      # the original is untouched
    assert make_redactor(["abc", ""])("x abc y abcabc") == "x *** y ******"


def test_small_helpers():
    assert route_label("/v1/chat/completions") == "chat/completions"
    assert route_label("/v1/models/demo") == "models"
    assert route_label("/v1/../../etc/passwd") == "other"
    assert describe_exit(3) == "exit code 3" and describe_exit(-9) == "signal 9 (SIGKILL)"
    assert cache_is_warm({"result": "hit"}) and not cache_is_warm({"result": "miss"}) and not cache_is_warm(None)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_plain_vllm_args_drop_only_the_plugins_flags():
    from turingbox.engine.launch import plain_vllm_args
    args = ["serve", "/m", "--max-num-seqs", "16", "--worker-cls", "turingbox_plugin.worker.TuringboxWorker",
            "--additional-config", '{"turingbox": {}}', "--additional-config={}", "--enable-prefix-caching"]
    assert plain_vllm_args(args) == ["serve", "/m", "--max-num-seqs", "16", "--enable-prefix-caching"]
    assert plain_vllm_args(["serve", "/m"]) == ["serve", "/m"]
