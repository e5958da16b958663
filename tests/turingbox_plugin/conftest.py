"""Fixtures for plugin tests: real subprocess servers on free loopback ports."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest

from tests.support.waiting import wait_until

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_VLLM = os.path.join(REPO, "tests", "support", "fake_vllm.py")


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
    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            return httpx.get(url + "/v1/models", timeout=1.0).status_code in (200, 401)
        except httpx.HTTPError:
            return False
    wait_until(up, timeout, what=f"{url}/v1/models")


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
def ttft_server(fake_vllm_factory):
    """The stand-in vLLM with a time to first token of overhead + prompt_tokens * per_token: (url, overhead,
    per_token)."""
    overhead, per_token = 0.03, 0.00005
    url = fake_vllm_factory("--fake-first-chunk-delay", str(overhead), "--fake-prefill-per-token", str(per_token))
    return url, overhead, per_token


@pytest.fixture
def openai_recorder(fake_vllm_factory, tmp_path):
    """start(structured_outputs, *flags) -> (url, record file): the stand-in vLLM recording every request body,
    answering grammar requests as `structured_outputs` says (fake_vllm.py: apply | refuse), one token each."""
    started = []

    def start(structured_outputs: str = "apply", *flags: str):
        record = tmp_path / f"requests-{len(started)}.jsonl"
        started.append(record)
        url = fake_vllm_factory("--fake-record", str(record), "--fake-structured-outputs", structured_outputs,
                                "--fake-eos-after", "1", *flags)
        return url, record

    return start


@pytest.fixture
def real_model_dir(tmp_path):
    if not os.path.exists(REAL_CONFIG):
        pytest.skip(f"{REAL_CONFIG} is not available")
    d = tmp_path / "qwen3.6-27b"
    d.mkdir()
    with open(REAL_CONFIG) as f:
        (d / "config.json").write_text(f.read())
    return d
