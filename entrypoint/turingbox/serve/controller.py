"""`turingbox serve`: plan -> caches -> vLLM -> wait -> warmup -> worker check -> ready, then drain.

The sidecar binds the public port first, so liveness answers from the first second and
readiness tells the stage. Everything slow or blocking (planning, cache preparation, active
warmup) runs in daemon threads so the event loop keeps answering probes, and a SIGTERM can end
serve at any stage without waiting for them. A start that cannot succeed (no plan: no GPU, the model
does not fit; vLLM not ready) prints one sentence, turns liveness 503 for exit_linger_seconds and
exits (2 for a plan or setting that cannot work, 1 otherwise), so an orchestrator restarts or pages.

Signals are handled like uvicorn's capture_signals, but with the drain in between: the first
SIGTERM/SIGINT turns readiness to 503 and refuses new /v1 requests, lets in-flight requests
finish up to drain_grace_seconds, then stops vLLM's process group (SIGTERM, grace, SIGKILL) and
exits 0. A second signal kills the group and exits at once with 128 + the signal number. The handlers'
installation, the exit and the sidecar's uvicorn server are lifecycle.py's.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import json
import logging
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
from typing import Any, Callable, Mapping

import httpx

from turingbox import config
from turingbox.cache.store import prepare_cache
from turingbox.config import CacheSettings
from turingbox.engine.diagnosis import FailureDiagnosis
from turingbox.engine.engine import ENGINE_READY, ENGINE_START, Engine, EngineNotAnswering, EngineUnfit
from turingbox.engine.launch import (
    MASK, SECRET_FLAGS, StartKvSize, flag_value, flag_values, health_client, kv_size_for_start, mask_argv,
    parent_env, read_workers, vllm_env
)
from turingbox.engine.supervisor import Supervisor, describe_exit
from turingbox.errors import UsageError
from turingbox.model import hub
from turingbox.plan.types import Plan
from turingbox.serve import stages
from turingbox.serve.active_warmup import run_active_warmup
from turingbox.serve.app import Sidecar
from turingbox.serve.lifecycle import SidecarServer, configure_logging, exit_now, handle_stop_signals, sidecar_server
from turingbox.serve.metrics import ServeMetrics
from turingbox.serve.options import ServeOptions, api_key_state
from turingbox.serve.state import ServeState
from turingbox_plugin.contract import RUNTIME_DIR_ENV

log = logging.getLogger("turingbox.serve")

EXIT_UPSTREAM_FAILED = 1        # vLLM died, or startup after launching it failed
_SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL|_KEY$", re.I)


# ---- pure helpers ----------------------------------------------------------------------------


def check_passthrough(passthrough: list[str]) -> None:
    for arg in passthrough:
        flag = arg.split("=", 1)[0]
        if flag in ("--host", "--port", "--uds"):
            raise UsageError(f"{flag} after -- would move vLLM away from the sidecar: use --host/--port for the "
                             "public address and --upstream-port for vLLM's loopback port.")


def public_plan(plan: dict, secrets: list[str]) -> dict:
    """The plan JSON (Plan.to_dict()) with secret env values, secret flag values and any known secret string
    masked: what GET /turingbox/plan and the startup log show."""
    p = copy.deepcopy(plan)
    if isinstance(p.get("vllm_args"), list):
        p["vllm_args"] = mask_argv([str(a) for a in p["vllm_args"]])
    if isinstance(p.get("env"), dict):
        p["env"] = {k: (MASK if _SECRET_ENV.search(k) and v else v) for k, v in p["env"].items()}
    text = json.dumps(p)
    for s in secrets:
        if s:
            text = text.replace(json.dumps(s)[1:-1], MASK)
    return json.loads(text)


def secret_values(api_key: str | None, argv: list[str], env: Mapping[str, str]) -> list[str]:
    """Every secret serve knows of: the API key, values of secret vLLM flags in argv, and values of
    secret-looking environment variables (long enough not to mask ordinary words)."""
    found = [api_key] if api_key else []
    for flag in SECRET_FLAGS:
        found += flag_values(argv, flag)
    found += [v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= 8]
    return sorted({s for s in found if s})


def make_redactor(secrets: list[str]) -> Callable[[str], str]:
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(text: str) -> str:
        for s in secrets:
            text = text.replace(s, MASK)
        return text
    return redact


def cache_is_warm(status: Any) -> bool:
    """Whether the cache status says the compile caches were found (picks the startup estimate)."""
    if not isinstance(status, dict):
        return False
    if isinstance(status.get("result"), str):       # turingbox.cache.store: "hit" / "miss" / ...
        return status["result"] == "hit"
    text = json.dumps(status)
    return '"hit"' in text and '"miss"' not in text


def bind_public(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP
    # (uvloop always does). Without it, Nagle holds a small SSE chunk written right after another
    # until the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(bind_failure(host, port, exc)) from None
    sock.setblocking(False)
    return sock


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """One sentence for a failed bind that names the setting to change: the host when the address is not this
    machine's (or no address at all), the port when it is taken or privileged."""
    h, p = config.REGISTRY["host"], config.REGISTRY["port"]
    host_fix = f"choose another {h.flag_name} / {h.env_name} (an address of this machine, or 0.0.0.0 for all)."
    port_fix = f"choose another {p.flag_name} / {p.env_name}."
    why = exc.strerror or str(exc)
    lead = f"The sidecar cannot listen on {host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"{lead}: {host} is not an address and does not resolve to one ({why}); {host_fix}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{lead}: {host} is not an address of this machine ({why}); {host_fix}"
    if exc.errno == errno.EADDRINUSE:
        return f"{lead}: port {port} is in use by another process ({why}); {port_fix}"
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return f"{lead}: ports below 1024 need privileges this process lacks ({why}); {port_fix}"
    if exc.errno == errno.EAFNOSUPPORT:
        return f"{lead}: this machine has no {'IPv6' if ':' in host else 'IPv4'} networking ({why}); {host_fix}"
    return f"{lead} ({why}): choose another {h.flag_name} / {h.env_name} or {p.flag_name} / {p.env_name}."


def _in_daemon_thread(fn: Callable, *args: Any) -> asyncio.Future:
    """Run a blocking call in a daemon thread (exit never waits for it, unlike to_thread)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def deliver(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:        # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):    # the loop may be gone at exit
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=run, daemon=True, name=getattr(fn, "__name__", "serve-step")).start()
    return fut


def _finish_session(session: Any, ok: bool) -> None:
    try:
        session.finish(ok)
    except Exception as exc:
        log.warning("could not finish the cache entry: %s", exc)


def _complete_session(session: Any, kv_bytes: int | None, signature: str) -> None:
    """After ready: record the KV size this start profiled (None: nothing to record), then complete the entry;
    in this order, since the session holds the entry's writer lock until it is finished."""
    if kv_bytes is not None:
        try:
            session.record_kv_size(kv_bytes, signature)
        except Exception as exc:          # never at the cost of completing the entry and releasing its lock
            log.warning("could not record the KV cache size: %s", exc)
    _finish_session(session, True)


class StartupFailed(Exception):
    """Startup after vLLM was launched went wrong; the message is one sentence."""


# ---- the controller ----------------------------------------------------------------------------

class Controller:
    def __init__(self, options: ServeOptions, cache: CacheSettings, plan_fn: Callable[[], Plan],
                 passthrough: list[str], runtime_dir: str | None = None) -> None:
        self.options = options
        self.cache_settings = cache
        self.configured_runtime_dir = runtime_dir
        self.plan_fn = plan_fn
        self.passthrough = passthrough
        self.upstream_key = flag_value(passthrough, "--api-key")
        self.secrets = secret_values(options.api_key, passthrough, parent_env())   # what vLLM inherits
        self.api_key_on, self.api_key_line = api_key_state(options)
        self.redact = make_redactor(self.secrets)
        self.tracker = stages.StartupTracker(on_change=self._stage_changed)
        self.state = ServeState(tracker=self.tracker, options=options, upstream_api_key=self.upstream_key)
        self.runtime_dir: str | None = None
        self.own_runtime_dir: str | None = None   # this instance's directory (instance_runtime_dir): removed at exit
        self.raw_plan: Plan | None = None
        self.engine: Engine | None = None          # once planned
        self.metrics = ServeMetrics(self.tracker, worker_status=self._worker_status,
                                    gpu_uuids=lambda: list(self.raw_plan.gpus) if self.raw_plan else [])
        self.sidecar = Sidecar(self.state, self.metrics)
        self.diagnosis = FailureDiagnosis()
        self.supervisor = Supervisor(on_line=self._observe_line, redact=self.redact)
        self.cache_session: Any = None      # until finished
        self.cache_to_close: Any = None     # until exit: close() removes a private/cold temporary copy
        self.kv_size: StartKvSize | None = None     # this start's KV size (set once the cache is prepared)
        self.stop_requested = asyncio.Event()
        self.upstream_died = asyncio.Event()
        self.fatal: tuple[int, str] | None = None
        self.fatal_event = asyncio.Event()
        self.signals: list[int] = []
        self.server: SidecarServer | None = None

    # -- signals

    def on_signal(self, sig: int) -> None:
        self.signals.append(sig)
        name = signal.Signals(sig).name
        if len(self.signals) == 1:
            log.info("%s received: draining (readiness 503, no new requests, up to %.0f s for in-flight ones)",
                     name, self.options.drain_grace_seconds)
            self.state.draining = True
            if self.tracker.stage != stages.FAILED:
                self.tracker.advance(stages.DRAINING)
            self.stop_requested.set()
            return
        log.warning("second signal (%s): stopping vLLM with SIGKILL and exiting now", name)
        self.supervisor.kill_now()
        self._remove_temporaries(wait=False)
        exit_now(128 + sig)

    def _observe_line(self, line: str) -> None:
        self.diagnosis.observe(line)          # first: a stage-detection error must not hide a cause
        self.tracker.observe_log_line(line)

    def _stage_changed(self, old: str, new: str) -> None:
        if new in stages.ORDER:
            log.info("stage: %s -> %s (%.1f s since start)", old, new, self.tracker.elapsed())

    def _worker_status(self) -> list[dict]:
        return read_workers(self.runtime_dir) if self.runtime_dir else []

    # -- main

    async def run(self, sock: socket.socket) -> int:
        handle_stop_signals(self.on_signal)
        self.server = sidecar_server(self.sidecar, self.options)
        server_task = asyncio.create_task(self.server.serve(sockets=[sock]), name="sidecar")
        host, port = sock.getsockname()[:2]
        log.info("sidecar listening on %s:%d (health, metrics, /v1 proxy)", host, port)
        if self.api_key_on:
            log.info("%s", self.api_key_line)
        else:
            log.warning("%s: /v1 is open to anyone who reaches %s:%d", self.api_key_line, host, port)
        startup = asyncio.create_task(self._startup(), name="startup")
        waits = {asyncio.create_task(e.wait()) for e in (self.stop_requested, self.upstream_died, self.fatal_event)}
        waits.add(server_task)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            if w is not server_task:
                w.cancel()
        try:
            if server_task.done():
                server_task.result()
                code = 1      # the sidecar itself stopped: nothing to serve with
                log.error("the sidecar's HTTP server stopped unexpectedly")
                await self._cancel(startup)
                await self.supervisor.stop(self.options.vllm_stop_grace_seconds)
            elif self.stop_requested.is_set():
                code = await self._drain(startup)
            elif self.upstream_died.is_set():
                code = await self._after_upstream_death(startup)
            else:
                code, _ = self.fatal or (EXIT_UPSTREAM_FAILED, "")
                await self._cancel(startup)
                await self.supervisor.stop(self.options.vllm_stop_grace_seconds)
                # Liveness has answered 503 since the failure: let probes see it before the port closes.
                await asyncio.sleep(self.options.exit_linger_seconds)
        finally:
            self._finish_cache(False, engine_failed=self.fatal is not None)
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server_task, timeout=10)
            await self.sidecar.aclose()
            # vLLM is stopped by now; a finish still publishing the entry completes first.
            await _in_daemon_thread(self._remove_temporaries)
        return code

    def _remove_temporaries(self, wait: bool = True) -> None:
        """Delete what serve created in TMPDIR (runtime dir, private/cold cache copy), never configured dirs."""
        session = self.cache_to_close     # kept until closed: a second signal meanwhile still removes it
        if session is not None:
            try:
                session.close(wait=wait)
            except Exception as exc:
                log.warning("could not remove the temporary cache copy: %s", exc)
            self.cache_to_close = None
        runtime, self.own_runtime_dir = self.own_runtime_dir, None
        if runtime:
            shutil.rmtree(runtime, ignore_errors=True)

    async def _cancel(self, task: asyncio.Task) -> None:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _drain(self, startup: asyncio.Task) -> int:
        await self._cancel(startup)
        if self.state.in_flight:
            log.info("waiting for %d in-flight request(s)", self.state.in_flight)
            idle = asyncio.create_task(self.state.idle.wait())
            died = asyncio.create_task(self.upstream_died.wait())
            done, _ = await asyncio.wait({idle, died}, timeout=self.options.drain_grace_seconds,
                                         return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
            died.cancel()
            if self.state.in_flight:
                log.warning("drain grace of %.0f s is over with %d request(s) still running: they will be cut",
                            self.options.drain_grace_seconds, self.state.in_flight)
        if self.supervisor.proc is not None:
            code = await self.supervisor.stop(self.options.vllm_stop_grace_seconds)
            log.info("vLLM stopped (%s)", describe_exit(code))
        if self.upstream_died.is_set():
            return EXIT_UPSTREAM_FAILED
        log.info("drained: exiting")
        return 0

    async def _after_upstream_death(self, startup: asyncio.Task) -> int:
        await self._cancel(startup)
        lines = list(self.supervisor.last)
        print(f"turingbox: {self.state.upstream_dead} Its last {len(lines)} log lines:", file=sys.stderr)
        for line in lines:
            print(f"  | {line}", file=sys.stderr)
        sys.stderr.flush()
        # Let open streams send their error event, and probes see liveness 503, before exiting.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.state.idle.wait(), timeout=5.0)
        await asyncio.sleep(self.options.exit_linger_seconds)
        self.supervisor.signal_group(signal.SIGKILL)      # leftovers (engine core, workers)
        return EXIT_UPSTREAM_FAILED

    # -- startup stages

    async def _startup(self) -> None:
        try:
            await self._startup_steps()
        except asyncio.CancelledError:
            raise
        except StartupFailed as exc:
            self._fail_fatal(EXIT_UPSTREAM_FAILED, str(exc))
        except UsageError as exc:
            self._fail_fatal(exc.exit_code, str(exc))
        except Exception as exc:          # a bug: say so in one line, keep the traceback in the log
            log.exception("startup failed")
            self._fail_fatal(EXIT_UPSTREAM_FAILED, f"Startup failed unexpectedly: {type(exc).__name__}: {exc}.")

    def _fail_fatal(self, code: int, sentence: str) -> None:
        """End serve with code after one line on stderr; liveness turns 503 at once (an orchestrator
        restarts or pages), readiness and /v1 give the sentence as the reason."""
        sentence = " ".join(sentence.split())          # one line, whatever the message held
        self.tracker.fail(sentence)
        self.state.mark_upstream_dead(sentence)
        print(f"turingbox: {sentence}", file=sys.stderr, flush=True)
        self.fatal = (code, sentence)
        self.fatal_event.set()

    async def _startup_steps(self) -> None:
        opts = self.options
        # 1. plan. An impossible plan (no GPU, does not fit: PlanError, a UsageError) ends serve with its
        # sentence and exit 2 through _startup; a sidecar that can never be ready must not look alive.
        plan = await _in_daemon_thread(self.plan_fn)
        self.raw_plan = plan
        plan_env = {k: str(v) for k, v in plan.env.items() if v is not None}
        plan_args = list(plan.vllm_args)
        self.secrets = sorted({*self.secrets, *secret_values(None, plan_args, plan_env)})
        self.redact = self.supervisor.redact = make_redactor(self.secrets)
        # Whether /v1 needs a key, said where operators look (the key itself never is).
        self.state.plan = {**public_plan(plan.to_dict(), self.secrets), "api_key": "on" if self.api_key_on else "off"}
        log.info("plan %s", json.dumps(self.state.plan, sort_keys=True, separators=(",", ":")))
        for reason in plan.reasons:
            log.info("plan reason: %s", reason)
        # 1b. a Hugging Face id: the files the models volume lacks, now that the plan showed the model fits
        await self._ensure_model(plan)
        self.tracker.advance(stages.STARTING)

        # 2. caches
        env = vllm_env(parent_env(), plan.env, await self._prepare_cache(plan))
        kv = self.kv_size = await self._kv_size(plan, env)

        # 3. vLLM, with status files in a directory of this instance's own under the configured runtime dir:
        # two instances on one host (two compose services, serve beside a warmup) must not read each other's.
        # A saved plan without one: the operator's runtime_dir setting if given (its default is the planner's).
        base = ((plan.env or {}).get(RUNTIME_DIR_ENV)
                or self.configured_runtime_dir or tempfile.gettempdir())
        # Under the controller's own supervisor, made before the plan so a signal at any stage reaches the group.
        self.engine = engine = Engine(
            plan, env=env, runtime_base=base, kind="serve", vllm_command=opts.vllm_command,
            passthrough=self.passthrough, extra_args=kv.args, upstream_port=opts.upstream_port,
            answer_timeout_s=opts.startup_timeout_seconds, stop_grace_s=opts.vllm_stop_grace_seconds,
            on_stage=self._engine_stage, supervisor=self.supervisor, diagnosis=self.diagnosis)
        self.runtime_dir = self.own_runtime_dir = engine.runtime_dir
        # what `turingbox jit-report --url` reads
        self.state.plan = {**self.state.plan, "env": {**(self.state.plan.get("env") or {}),
                                                      RUNTIME_DIR_ENV: self.runtime_dir}}
        await engine.start()
        asyncio.create_task(self._watch_upstream(), name="vllm-watch")

        # 4. wait until vLLM answers /health and /v1/models (the engine-ready stage turns serve's to warming)
        await self._wait_for_upstream(engine)

        # 5. active warmup with real requests, 6. the workers' plugin status
        if opts.active_warmup:
            await self._active_warmup(engine.url, engine.served_model)
        workers = self._check_workers(engine)

        self.state.upstream_url = engine.url
        self.state.startup_ok = True
        self.tracker.advance(stages.READY)
        # Completing the cache entry walks every file of it: not on the loop that proxies requests. A start that
        # profiled its KV size (loading its graphs) records it there first, for the next start to skip the profile.
        t = self.tracker
        session, self.cache_session = self.cache_session, None
        if session is not None:
            _in_daemon_thread(_complete_session, session, kv.measured(workers, t.graphs_compiled, t.graphs_loaded),
                              kv.signature)
        log.info("ready after %.1f s (stages: %s; vLLM graphs: %d loaded from cache, %d compiled)", t.ready_after_s,
                 ", ".join(f"{k} {v:.1f} s" for k, v in t.durations.items()), t.graphs_loaded, t.graphs_compiled)
        warning = stages.compile_cache_warning(t.profile, t.graphs_compiled, t.graphs_loaded,
                                               getattr(session, "entry", None),
                                               engine.env.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("", "0"))
        if warning:
            log.warning("%s", warning)
        await self._probe_upstream(engine.url)

    async def _ensure_model(self, plan: Plan) -> None:
        """The downloading stage: a plan whose model is a hub snapshot directory (turingbox.model.hub) gets the files
        the models volume lacks, with progress in /health/ready, before vLLM starts on that directory (so vLLM never
        downloads). Skipped for a plain model directory and for a complete snapshot. A failure ends serve with its
        sentence (HF_HUB_OFFLINE with files missing: exit 2; the hub unreachable or a download broken off: exit 1,
        and the next start resumes it)."""
        if hub.parse_snapshot_dir(plan.model) is None:
            return
        if not hub.is_complete(plan.model):
            self.tracker.advance(stages.DOWNLOADING)

        def report(progress: Any) -> None:      # on the download's thread: one reference assignment
            self.tracker.download = progress.to_dict()

        try:
            await _in_daemon_thread(lambda: hub.ensure_snapshot(plan.model, progress=report))
        finally:
            self.tracker.download = None

    async def _prepare_cache(self, plan: Plan) -> dict[str, str]:

        def prepare() -> Any:
            # Recorded in the thread, so a SIGTERM that cancels the wait still finds the copy to remove.
            self.cache_to_close = prepare_cache(plan, self.cache_settings)
            return self.cache_to_close

        try:
            self.cache_session = await _in_daemon_thread(prepare)
        except Exception as exc:         # read-only or full volume: serve cold rather than not at all
            log.warning("compile caches unavailable, starting cold: %s", exc)
            return {}
        status = getattr(self.cache_session, "status", {}) or {}
        log.info("cache %s", json.dumps(status, sort_keys=True, default=str))
        self.tracker.profile = "warm" if cache_is_warm(status) else "cold"
        return {k: str(v) for k, v in (getattr(self.cache_session, "env", {}) or {}).items()}

    async def _kv_size(self, plan: Plan, env: dict[str, str]) -> StartKvSize:
        """This start's KV size (kv_size_from_cache: the size an earlier start of the same signature recorded in the
        cache entry), with one line saying whether it is given, and why not."""
        session = self.cache_session
        kv = await _in_daemon_thread(kv_size_for_start, plan, self.passthrough, env,          # reads the manifest
                                     self.cache_settings.kv_size_from_cache, session and session.kv_size)
        log.info("%s", kv.sentence)
        return kv

    def _finish_cache(self, ok: bool, engine_failed: bool = False) -> None:
        """Finish the cache session (unless handed off at ready). engine_failed: vLLM died or startup failed; a
        start given a recorded KV size then drops it, so the next start profiles instead of failing alike."""
        session, self.cache_session = self.cache_session, None
        if session is not None:
            if engine_failed and self.kv_size is not None and self.kv_size.given:
                with contextlib.suppress(Exception):
                    session.forget_kv_size(self.kv_size.signature)
            _finish_session(session, ok)

    async def _watch_upstream(self) -> None:
        code = await self.supervisor.wait()
        if self.supervisor.stopping:
            return
        stage = self.tracker.stage
        sentence = f"vLLM exited unexpectedly with {describe_exit(code)} during stage {stage}."
        if self.diagnosis.sentence:
            sentence += " " + self.diagnosis.sentence
        log.error("%s", sentence)
        self.state.mark_upstream_dead(sentence)
        self.tracker.fail(sentence)
        self._finish_cache(False, engine_failed=True)
        self.upstream_died.set()

    def _engine_stage(self, name: str) -> None:
        """The engine's stages, as serve reports them (its own log-line stages come from _observe_line)."""
        engine = self.engine
        if name == ENGINE_START:
            log.info("starting vLLM: %s", shlex.join(mask_argv(engine.argv)))
        elif name == ENGINE_READY:
            log.info("vLLM answers on %s, models %s", engine.url, engine.served_models)
            self.tracker.advance(stages.WARMING)

    async def _wait_for_upstream(self, engine: Engine) -> None:
        """Until vLLM answers; its death meanwhile is _watch_upstream's to report (the engine does not fail fast)."""
        limit = self.options.startup_timeout_seconds
        try:
            await engine.wait_until_answering(
                lambda: (f"vLLM did not answer within startup_timeout_seconds={limit:.0f} "
                         f"(last stage: {self.tracker.stage})."), fail_on_exit=False)
        except EngineNotAnswering as exc:
            raise StartupFailed(str(exc)) from None

    async def _active_warmup(self, base: str, model: str) -> None:
        timeout = max(60.0, min(900.0, self.options.startup_timeout_seconds - self.tracker.elapsed()))
        try:
            result = await _in_daemon_thread(run_active_warmup, base, model, self.upstream_key, timeout)
        except Exception as exc:
            why = str(exc).strip() or type(exc).__name__
            if not why.lower().startswith("active warmup"):
                why = "Active warmup failed: " + why
            raise StartupFailed(why[0].upper() + why[1:].rstrip(".") + ".") from None
        log.info("active warmup %s", json.dumps(result, sort_keys=True, default=str))

    def _check_workers(self, engine: Engine) -> list[dict]:
        try:
            workers = engine.check(strict=False)
        except EngineUnfit as exc:
            raise StartupFailed(str(exc)) from None
        for w in workers:
            warm = w.get("warmup") or {}
            log.info("worker rank %s: plugin %s, gdn %s, warmup %s kernels in %s s, ok=%s",
                     w.get("rank"), w.get("plugin_version"), w.get("gdn_path"), warm.get("kernels"),
                     warm.get("seconds"), warm.get("ok"))
        if not workers:
            log.warning("no worker reported the turingbox plugin (require_plugin is off)")
        return workers

    async def _probe_upstream(self, base: str) -> None:
        """After ready: readiness turns 503 when vLLM stops answering /health within the probe period."""
        period = self.options.upstream_probe_seconds
        async with health_client(period) as client:
            while True:
                await asyncio.sleep(period)
                try:
                    r = await client.get(base + "/health")
                    failure = None if r.status_code == 200 else f"vLLM's /health answered {r.status_code}."
                except httpx.TimeoutException as exc:
                    failure = f"vLLM's /health did not answer within {period:g} s ({type(exc).__name__})."
                except httpx.HTTPError as exc:
                    failure = f"vLLM's /health failed ({type(exc).__name__}: {exc})."
                if failure != self.state.probe_failure:
                    if failure:
                        log.warning("%s", failure)
                    else:
                        log.info("vLLM answers /health again")
                self.state.probe_failure = failure


def serve(options: ServeOptions, cache: CacheSettings, plan_fn: Callable[[], Plan], passthrough: list[str],
          runtime_dir: str | None = None) -> int:
    """Run serve to the end; returns the exit code. runtime_dir: the runtime_dir setting when the operator gave
    one (for a saved plan whose env names none)."""
    configure_logging()
    check_passthrough(passthrough)
    sock = bind_public(options.host, options.port)

    async def main() -> int:
        return await Controller(options, cache, plan_fn, passthrough, runtime_dir).run(sock)

    try:    # uvloop comes with vLLM (fastapi[standard]); it lowers the proxy's per-request and per-chunk cost
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    if loop_factory is not None and hasattr(asyncio, "Runner"):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())
    return asyncio.run(main())
