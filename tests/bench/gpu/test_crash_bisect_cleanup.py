"""bench/gpu/crash_bisect.py leaves no server behind (session 23: a plain vLLM that was not ready within the limit
kept 40 GiB of the GPU through the next phases). A stand-in server process group (an API server that forks a
long-lived child, as vLLM's engine core is) is started through the real `Server.start`; whether it never gets
ready, exits early, or the script is sent SIGTERM (session.sh's `timeout`), the whole group must be gone."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU = os.path.join(REPO, "bench", "gpu")
sys.path.insert(0, GPU)
import crash_bisect  # noqa: E402

from tests.support.waiting import wait_until  # noqa: E402

# The "API server": forks an "engine core" that ignores nothing and sleeps, writes its pid, then either sleeps
# (never ready: no port is listened on) or exits at once (the API server died, the engine core lives on).
STAND_IN = textwrap.dedent("""
    import os, sys, time
    child = os.fork()
    if child == 0:
        time.sleep(600); os._exit(0)  # behaviour: the engine core lives until it is killed
    open(sys.argv[1], "w").write(str(child))
    if sys.argv[2] == "exit":
        os._exit(1)
    time.sleep(600)  # behaviour: never ready, no port is listened on
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for the GPU's purposes: only its parent has not reaped it
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


class _StandIn(crash_bisect.Server):
    def __init__(self, tmp, how: str) -> None:
        a = argparse.Namespace(gate_log="", out=str(tmp), mode="plain", ready_limit=3, port=1, model_name="m")
        super().__init__(a, {"model": "m"})
        self.pidfile, self.how = str(tmp / "child.pid"), how

    def argv_env(self):
        return [sys.executable, "-c", STAND_IN, self.pidfile, self.how], dict(os.environ)


def _child(path: str) -> int:
    def written():
        return os.path.exists(path) and open(path).read()
    return int(wait_until(written, timeout=5, what="the stand-in's engine-core pid"))


def test_not_ready_stops_the_whole_group(tmp_path):
    srv = _StandIn(tmp_path, "sleep")
    try:
        srv.start()
    except SystemExit as exc:
        assert "not ready" in str(exc)
    else:
        raise AssertionError("start() returned for a server that never answered")
    assert not _alive(_child(srv.pidfile))
    assert srv.proc.poll() is not None


def test_api_server_exit_stops_its_engine_core(tmp_path):
    srv = _StandIn(tmp_path, "exit")
    try:
        srv.start()
    except SystemExit as exc:
        assert "exited rc=1" in str(exc)
    else:
        raise AssertionError("start() returned for a server that exited")
    assert not _alive(_child(srv.pidfile))


def test_sigterm_to_the_script_stops_its_server(tmp_path):
    """The script's own SIGTERM handling (main's leave_nothing_behind), as `timeout` sends it."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {GPU!r}); sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import pathlib, test_crash_bisect_cleanup as t
        srv = t._StandIn(pathlib.Path({str(tmp_path)!r}), "sleep")
        srv.a.ready_limit = 600
        t.crash_bisect.leave_nothing_behind(srv)
        srv.start()
    """)
    script = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    child = _child(str(tmp_path / "child.pid"))
    script.send_signal(signal.SIGTERM)
    assert script.wait(120) == 143
    assert not _alive(child)


def test_turingbox_mode_sees_the_sidecar_ready(tmp_path, monkeypatch):
    """Session 25's `mintokens` on the GPU: turingbox mode polled "/ready", which the sidecar does not serve, so a
    ready `turingbox serve` was waited on until the limit and none of the candidates was sent. Through the real
    `Server.start` against a real `turingbox serve` in front of the stand-in vLLM, it must see ready and stop."""
    from tests.support.sidecar_harness import FAKE_VLLM, H200, free_port, make_model_dir
    for k in [k for k in os.environ if k.startswith(("TURINGBOX_", "FAKE_VLLM_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("TURINGBOX_VLLM_COMMAND", f"{sys.executable} {FAKE_VLLM}")
    monkeypatch.setenv("TURINGBOX_GPUS_JSON", H200)
    monkeypatch.setenv("TURINGBOX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("TURINGBOX_ACTIVE_WARMUP", "0")
    monkeypatch.setenv("FAKE_VLLM_CONTROL_DIR", str(tmp_path / "control"))
    os.makedirs(tmp_path / "control")
    a = argparse.Namespace(gate_log="", out=str(tmp_path), mode="turingbox", ready_limit=60, port=free_port(),
                           model_name="", cache=str(tmp_path / "cache"))
    srv = crash_bisect.Server(a, {"model": make_model_dir(str(tmp_path))})
    try:
        ready_s = srv.start()
        assert ready_s < a.ready_limit
        assert crash_bisect.httpx.get(srv.url + "/health/ready", timeout=5, trust_env=False).status_code == 200
    finally:
        srv.stop()
    assert srv.proc.returncode is not None
