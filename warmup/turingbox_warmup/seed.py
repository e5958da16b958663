"""The seed workflow: what `turingbox warmup [--seed-only]` and `turingbox cache seed` do (their parsers:
cli/warmup.py, cli/cache.py), from typed settings, in the container (the Kubernetes seed Job runs it too).

Seeding prints one `turingbox-stage: <name>` line per stage and a final
`turingbox-seed-result: {json}` line; `make warmup-cache` (turingbox_warmup.seed_volume) drives its progress bar
from them: the protocol is turingbox_warmup.seed_protocol.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import signal
import sys
import tempfile
from typing import Callable

from turingbox import config
from turingbox.cache import store
from turingbox.config import CacheSettings, LauncherSettings, WarmupSettings
from turingbox.engine.engine import Engine, EngineNotAnswering, EngineUnfit
from turingbox.engine.launch import kv_size_for_start, parent_env, vllm_env
from turingbox.errors import UsageError
from turingbox.model import hub
from turingbox.plan.types import Plan
from turingbox.serve.active_warmup import run_active_warmup
from turingbox.serve.stages import GRAPH_COMPILED, GRAPH_LOADED
from turingbox_plugin.contract import RUNTIME_DIR_ENV
from turingbox_warmup.seed_protocol import result_line, stage_line


class SeedFailed(UsageError):
    """The engine could not be warmed: one sentence, exit code 1 (not bad input)."""

    exit_code = 1


# ---- warmup / seed --------------------------------------------------------------------------------

def stage(name: str, detail: str = "") -> None:
    print(stage_line(name, detail), flush=True)


def _ensure_model(plan: Plan) -> None:
    """A plan on a hub snapshot (TURINGBOX_MODEL=org/name): the files the models volume lacks, as serve's
    downloading stage fetches them (resumed, verified; offline: a sentence naming what is missing), so the engine
    below never downloads. A plain model directory: nothing to do."""
    if hub.parse_snapshot_dir(plan.model) is None:
        return
    stage("download", plan.model)
    last = [-1.0]

    def report(progress) -> None:       # a line per 10 % (and the last), not per chunk
        if progress.percent >= last[0] + 10 or progress.percent >= 100 > last[0]:
            last[0] = progress.percent
            print(f"turingbox: downloading {progress.repo_id}: {progress.describe()}", flush=True)

    hub.ensure_snapshot(plan.model, progress=report)


def warmup(make_plan: Callable[[], Plan], cache: CacheSettings, settings: WarmupSettings,
           launcher: LauncherSettings, seed_only: bool, passthrough: list[str]) -> int:
    """`warmup` / `cache seed`: plan (make_plan: a saved plan or the planner), fetch a hub model's files, choose the
    cache entry, then warm the engine in it unless it is complete already (seed_only: warm it anyway)."""
    stage("plan")
    plan = make_plan()
    _ensure_model(plan)
    stage("cache")
    session = store.prepare_cache(plan, cache)
    try:
        return _seed(plan, session, settings, launcher, seed_only, passthrough, cache.kv_size_from_cache)
    finally:
        session.close()   # a private/cold copy lives in TMPDIR: never leave it behind


def _seed(plan: Plan, session: store.CacheSession, settings: WarmupSettings, launcher: LauncherSettings,
          seed_only: bool, passthrough: list[str], kv_size_from_cache: bool) -> int:
    for line in session.status["events"]:
        print(f"turingbox: {line}", flush=True)
    if session.status["result"] == "hit" and session.mode == "shared" and not seed_only:
        session.finish(True)
        stage("complete", "entry already complete; nothing to do")
        _print_result(session, plan)
        return 0
    ok = False
    try:
        _warm_engine(plan, session, list(passthrough), vllm_command=launcher.vllm_command,
                     warmup_timeout_s=settings.warmup_timeout, stop_grace_s=launcher.vllm_stop_grace_seconds,
                     kv_size_from_cache=kv_size_from_cache)
        ok = True
    except UsageError:
        raise
    except Exception as exc:  # the engine's own failure, reported in one sentence
        raise SeedFailed(f"Seeding cache entry {session.key} failed: {exc.__class__.__name__}: {exc}") from None
    finally:
        session.finish(ok)
    if session.mode == "shared" and not session.status.get("completed"):
        if not store.has_engine_artefacts(session.entry):
            raise SeedFailed(f"Seeding cache entry {session.key} left it incomplete: the engine wrote no compile "
                             f"artefacts into {session.entry} ({config.REGISTRY['vllm_command'].env_name} "
                             "names a stand-in rather than vLLM?).")
        raise SeedFailed(f"Seeding cache entry {session.key} warmed the engine, but the entry could not be completed "
                         f"({(session.status.get('events') or ['no reason recorded'])[-1]}).")
    stage("complete")
    _print_result(session, plan)
    if session.mode != "shared":
        print(f"turingbox: warning: the entry was warmed in {session.mode} mode in a temporary copy (removed on "
              f"exit), not written to {session.root or 'the cache volume'}", file=sys.stderr)
        return 1
    return 0


def _print_result(session: store.CacheSession, plan: Plan) -> None:
    sizes, _ = store.measure(session.entry)
    print(result_line({
        "cache_key": session.key, "entry": session.entry, "mode": session.mode,
        "result": session.status["result"], "sizes": sizes,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "num_speculative_tokens": plan.num_speculative_tokens, "gpu_name": plan.gpu_name,
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }), flush=True)


def _warm_engine(plan: Plan, session: store.CacheSession, passthrough: list[str], *, vllm_command: str | None,
                 warmup_timeout_s: float, stop_grace_s: float, kv_size_from_cache: bool) -> None:
    """Start vLLM with serve's own engine start (turingbox.engine.engine.Engine), wait until it answers, check the
    workers' strict warmup, run the active warmup, stop it gracefully.

    SIGTERM/SIGINT (a pod or job being stopped) cancel the run, so vLLM's whole process group is
    stopped and the entry is left incomplete rather than orphaning the engine."""
    async def guarded() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        received: list[int] = []

        def interrupt(sig: int) -> None:
            received.append(sig)
            task.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, interrupt, sig)
        try:
            await _warm_engine_async(plan, session, passthrough, vllm_command, warmup_timeout_s, stop_grace_s,
                                     kv_size_from_cache)
        except asyncio.CancelledError:
            if received:
                raise SeedFailed(f"Seeding cache entry {session.key} was interrupted by "
                                 f"{signal.Signals(received[0]).name}; the entry stays incomplete.") from None
            raise
    asyncio.run(guarded())


async def _warm_engine_async(plan: Plan, session: store.CacheSession, passthrough: list[str],
                             vllm_command: str | None, warmup_timeout_s: float, stop_grace_s: float,
                             kv_size_from_cache: bool) -> None:
    compiled = await _start_once(plan, session, passthrough, vllm_command, warmup_timeout_s, stop_grace_s,
                                 kv_size_from_cache)
    if compiled:
        # vLLM sizes its KV cache from the memory its profile run peaked at, and a start that compiles its graphs
        # peaks higher than one that loads them (H200, 64-layer demo: 79.84 against 81.19 GiB). Triton specialises
        # kernels on KV-derived integers, so the first served start, which loads, compiled kernels again (576
        # Triton cache files, ~10 s of its 75 s, session 12). A second start here loads as serve will and leaves
        # them in the entry, and records the KV size it profiled, which the next start is given (issue 35).
        stage("loading-start", f"vLLM compiled {compiled} graph(s); starting it once more as serve will, "
                               "loading them, to fill the kernels of that KV cache size")
        try:
            await _start_once(plan, session, passthrough, vllm_command, warmup_timeout_s, stop_grace_s,
                              kv_size_from_cache)
        except SeedFailed as exc:
            raise SeedFailed(f"The seed's second (loading) start failed: {exc}") from None
        except Exception as exc:      # the active warmup's one sentence, or the engine's own failure
            raise SeedFailed(f"The seed's second (loading) start failed: {exc.__class__.__name__}: {exc}") from None


async def _start_once(plan: Plan, session: store.CacheSession, passthrough: list[str], vllm_command: str | None,
                      warmup_timeout_s: float, stop_grace_s: float, kv_size_from_cache: bool) -> int:
    """One vLLM start (serve's Engine: the same argv, environment, supervisor, wait and worker check) with its own
    runtime folder (workers' status files are per start; a serve beside it keeps its own). As serve, it is given
    the KV size the entry recorded (kv_size_from_cache), and a start that loaded its graphs and profiled the KV
    size records it. Returns how many torch.compile graphs vLLM said it compiled (not loaded) at this start."""
    compiled = loaded = 0
    env = vllm_env(parent_env(), plan.env, session.env)
    kv = kv_size_for_start(plan, passthrough, env, kv_size_from_cache, session.kv_size)
    print(f"turingbox: {kv.sentence}", flush=True)

    def count_graphs(line: str) -> None:
        nonlocal compiled, loaded
        compiled += GRAPH_COMPILED in line
        loaded += GRAPH_LOADED in line
    engine = Engine(plan, env=env, runtime_base=plan.env.get(RUNTIME_DIR_ENV) or tempfile.gettempdir(), kind="warmup",
                    vllm_command=vllm_command, passthrough=passthrough, extra_args=kv.args,
                    answer_timeout_s=warmup_timeout_s, stop_grace_s=stop_grace_s, on_stage=stage,
                    on_line=count_graphs, output=sys.stdout.buffer)
    ok = False
    try:
        await engine.start()
        try:
            await engine.wait_until_answering(
                lambda: f"vLLM did not answer within warmup_timeout={warmup_timeout_s:.0f} s.")
            workers = engine.check(strict=True)
        except (EngineNotAnswering, EngineUnfit) as exc:
            raise SeedFailed(str(exc)) from None
        stage("active-warmup")
        await asyncio.to_thread(run_active_warmup, engine.url, engine.served_model, engine.api_key,
                                max(60.0, engine.seconds_left()))
        kv_bytes = kv.measured(workers, compiled, loaded)
        if kv_bytes is not None and session.record_kv_size(kv_bytes, kv.signature):
            print(f"turingbox: {session.status['events'][-1]}", flush=True)
        ok = True
    finally:
        if kv.given and not ok and session.forget_kv_size(kv.signature):    # the size it was given may be why
            print(f"turingbox: {session.status['events'][-1]}", flush=True)
        await engine.stop()
        engine.remove_runtime_dir()
    return compiled
