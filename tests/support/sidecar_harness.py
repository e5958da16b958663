"""Real `turingbox serve` processes in front of the real fake-vLLM HTTP process (tests/support/fake_vllm.py)."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys

import httpx

from tests.support.waiting import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE_VLLM = os.path.join(REPO, "tests", "support", "fake_vllm.py")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "serve")
MODEL_CONFIG = os.path.join(FIXTURES, "qwen36-27b", "config.json")
H200 = os.path.join(FIXTURES, "h200.json")
NO_GPUS = os.path.join(FIXTURES, "no-gpus.json")


def make_model_dir(parent: str, demo: bool = False) -> str:
    """A model directory the planner accepts: the Qwen3.6-27B config.json (the fake needs no weights); demo: marked
    as `turingbox demo-model` marks its copy (random weights, text only)."""
    model = os.path.join(parent, "model")
    os.makedirs(model, exist_ok=True)
    with open(MODEL_CONFIG) as src:
        config = json.load(src)
    if demo:
        config["turingbox_demo"] = {"source": "qwen3.6-27b", "layers": 64, "awq": False, "format": 1}
    with open(os.path.join(model, "config.json"), "w") as dst:
        json.dump(config, dst)
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """One `python -m turingbox serve` process with its own port, log, fake-vLLM events and control dir."""

    def __init__(self, tmp: str, gpus_json: str = H200, env: dict | None = None, args: list[str] | None = None,
                 passthrough: list[str] | None = None, plan_file: str | None = None,
                 split_stderr: bool = False, demo: bool = False) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_path = os.path.join(tmp, "fake-events.jsonl")
        self.control = os.path.join(tmp, "control")
        os.makedirs(self.control, exist_ok=True)
        self.log_path = os.path.join(tmp, "serve.log")
        # split_stderr: stdout goes to its own file, so output() is stderr alone (else both, interleaved)
        self.stdout_path = os.path.join(tmp, "serve.stdout") if split_stderr else None
        # serve's own temporaries (private/cold cache copies, a mkdtemp runtime dir) land here, not in /tmp
        self.tmpdir = os.path.join(tmp, "tmpdir")
        os.makedirs(self.tmpdir, exist_ok=True)
        model = self.model = make_model_dir(tmp, demo)
        # the developer's own VLLM_WORKER_MULTIPROC_METHOD would win over the plan's (launch.OPERATOR_WINS)
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("TURINGBOX_", "FAKE_VLLM_")) and k != "VLLM_WORKER_MULTIPROC_METHOD"}
        full_env.update({
            "TURINGBOX_VLLM_COMMAND": f"{sys.executable} {FAKE_VLLM}",
            "TURINGBOX_CACHE_DIR": os.path.join(tmp, "cache"),
            "TURINGBOX_RUNTIME_DIR": os.path.join(tmp, "runtime"),
            "TURINGBOX_MODELS_DIR": os.path.join(tmp, "models"),
            "TURINGBOX_ACTIVE_WARMUP": "0",
            "TURINGBOX_UPSTREAM_PROBE_SECONDS": "0.5",
            "FAKE_VLLM_EVENTS": self.events_path,
            "FAKE_VLLM_CONTROL_DIR": self.control,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": self.tmpdir,
        })
        for k, v in (env or {}).items():       # None removes a variable
            if v is None:
                full_env.pop(k, None)
            else:
                full_env[k] = v
        cmd = [sys.executable, "-m", "turingbox", "serve", "--port", str(self.port), "--host", "127.0.0.1"]
        if plan_file:
            cmd += ["--plan-file", plan_file]
        else:
            cmd += ["--gpus-json", gpus_json, "--model", model]
        cmd += list(args or [])
        if passthrough:
            cmd += ["--", *passthrough]
        self.log = open(self.log_path, "wb")
        stdout = open(self.stdout_path, "wb") if self.stdout_path else self.log
        try:
            self.proc = subprocess.Popen(cmd, env=full_env, cwd=REPO, stdout=stdout, stderr=self.log,
                                         start_new_session=True)
        finally:
            if stdout is not self.log:
                stdout.close()
        self.client = httpx.Client(base_url=self.url, timeout=10.0, trust_env=False)

    # -- observing

    def get(self, path: str, **kw) -> httpx.Response:
        return self.client.get(path, **kw)

    def alive(self) -> bool:
        try:
            return self.get("/health/live", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                return self.get("/health/ready", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False
        wait_until(ready, timeout, what="readiness")

    def events(self, kind: str | None = None) -> list[dict]:
        try:
            with open(self.events_path) as f:
                evs = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []
        return [e for e in evs if kind is None or e["event"] == kind]

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stdout(self) -> str:
        """What serve wrote to stdout (split_stderr only)."""
        with open(self.stdout_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def metrics(self) -> str:
        return self.get("/metrics").text

    def temporaries(self) -> list[str]:
        """What serve made with mkdtemp in its TMPDIR (turingbox-private-/cold-/runtime-*)."""
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.tmpdir, "turingbox-*")))

    def cache_status(self) -> dict:
        """The `cache {...}` status serve logged after preparing the compile caches."""
        line = [x for x in self.output().splitlines() if "turingbox.serve: cache {" in x][0]
        return json.loads(line.split("cache ", 1)[1])

    # -- acting

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve did not exit within {timeout} s:\n{self.output()}") from None

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)
        for ev in self.events("started") + self.events("child"):   # never leave a fake behind
            for pid in (ev.get("pid"), ev.get("child_pid")):
                if pid and pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def sse_events(lines) -> list:
    """Parse SSE data lines into JSON objects ('[DONE]' kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
