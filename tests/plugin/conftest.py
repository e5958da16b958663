"""Fixtures for plugin tests: real subprocess servers on free loopback ports."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_VLLM = os.path.join(REPO, "tests", "fakes", "fake_vllm.py")
TTFT_SERVER = os.path.join(os.path.dirname(__file__), "ttft_server.py")
OPENAI_RECORDER = os.path.join(os.path.dirname(__file__), "openai_recorder.py")


def _real_config() -> str:
    """The published Qwen3.6-27B config.json (shared/models), as the appliance ships it."""
    in_repo = os.path.join(REPO, "entrypoint", "turingbox", "data", "qwen3.6-27b.json")
    if os.path.isfile(in_repo):
        return in_repo
    # inside the image only tests/ is mounted; the installed appliance carries the same file
    import importlib.resources
    return str(importlib.resources.files("turingbox") / "data" / "qwen3.6-27b.json")


REAL_CONFIG = _real_config()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=1.0).status_code in (200, 401):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not come up")


def _start(argv: list[str], url: str, env: dict | None = None):
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    try:
        wait_ready(url, proc)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc


@pytest.fixture
def fake_vllm_factory():
    procs = []

    def start(*extra: str, env: dict | None = None) -> str:
        if not os.path.exists(FAKE_VLLM):
            pytest.skip("tests/fakes/fake_vllm.py is not in the tree yet")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        procs.append(_start([sys.executable, FAKE_VLLM, "serve", "demo", "--host", "127.0.0.1", "--port", str(port),
                             *extra], url, env))
        return url

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def ttft_server():
    """A server whose time to first token is overhead + prompt_tokens * per_token (see ttft_server.py)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start([sys.executable, TTFT_SERVER, str(port), "0.03", "0.00005"], url)
    yield url, 0.03, 0.00005
    proc.terminate()
    proc.wait(timeout=5)


@pytest.fixture
def openai_recorder(tmp_path):
    """start(mode) -> (url, record file): a server recording request bodies (see openai_recorder.py)."""
    procs = []

    def start(mode: str = ""):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        record = tmp_path / f"requests-{len(procs)}.jsonl"
        procs.append(_start([sys.executable, OPENAI_RECORDER, str(port), str(record), mode], url))
        return url, record

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=5)


@pytest.fixture
def real_model_dir(tmp_path):
    if not os.path.exists(REAL_CONFIG):
        pytest.skip(f"{REAL_CONFIG} is not available")
    d = tmp_path / "qwen3.6-27b"
    d.mkdir()
    with open(REAL_CONFIG) as f:
        (d / "config.json").write_text(f.read())
    return d
