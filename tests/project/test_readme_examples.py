"""README.md's shell examples run as pasted. Every command line of every ```bash block is either run here or
listed in NOT_RUN with the reason (Docker, GPUs, a cluster); a new example that is neither fails the test.

The curl examples go to a real `turingbox serve` of the demo model (planned for the H200 fixture, nothing
configured, as after `make up`) on the stand-in engine (tests/support/fake_vllm.py), with only the port changed;
the `turingbox` examples run from the checkout with the venv's console script. A comment line that follows a
command and starts with `# turingbox:` is the one line the command prints on stderr, with exit 2."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx
import pytest

from turingbox import config as S

from tests.support.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
FAKE_VLLM = os.path.join(REPO, "tests", "support", "fake_vllm.py")
GPUS = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")
README_PORT = "localhost:8000"
DEMO_DIR_NAME = "turingbox-demo-qwen3.6-27b"        # the bf16 demo, the variant that fits one H200


@dataclass
class Example:
    line: int             # README line of the command's first line
    command: str          # continuation lines joined
    stderr: str | None = None   # the `# turingbox: ...` line after it: the expected refusal


def examples() -> list[Example]:
    lines = open(README, encoding="utf-8").read().splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        i += 1
        after_command = False      # a `# turingbox:` line right below a command is what that command prints
        while i < len(lines) and lines[i].strip() != "```":
            start, text = i, lines[i]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + lines[i].strip()
            stripped = text.strip()
            if stripped.startswith("# turingbox:") and after_command:
                out[-1].stderr = stripped[2:]
            elif stripped and not stripped.startswith("#"):
                out.append(Example(start + 1, stripped))
            after_command = bool(stripped) and not stripped.startswith("#")
            i += 1
        i += 1
    return out


# (pattern, why it does not run here): matched against the command's start
NOT_RUN = [
    (r"make up\b", "builds the image and serves on this machine's GPUs (Docker, NVIDIA Container Toolkit)"),
    (r"make test\b", "the whole suite, this test included"),
    (r"make warmup-cache\b", "runs the appliance image on the host's GPUs (Docker SDK)"),
    (r"docker compose\b", "needs Docker, the built image and the NVIDIA Container Toolkit"),
    (r"kubectl\b", "needs a Kubernetes cluster with the NVIDIA device plugin"),
]


# ---- what the runnable ones must print ----------------------------------------------------------------------

def _json(out: str):
    try:
        return json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON: {out[:500]!r}") from None


def check_ready(out: str, ctx: dict) -> None:
    body = _json(out)
    assert body["status"] == "ready" and body["stage"] == "ready", body


def check_plan(out: str, ctx: dict) -> None:
    plan = _json(out)
    assert plan["demo"] and plan["served_model_name"] == DEMO_DIR_NAME, plan.get("served_model_name")
    assert plan["reasons"] and plan["vllm_args"][:2] == ["serve", plan["model"]]
    i = plan["vllm_args"].index("--served-model-name")
    assert plan["vllm_args"][i + 1:i + 3] == [DEMO_DIR_NAME, "demo"], plan["vllm_args"][i:i + 4]


def check_models(out: str, ctx: dict) -> None:
    ids = [m["id"] for m in _json(out)["data"]]
    # vLLM 0.21 lists one card per --served-model-name, the first first
    assert ids == [DEMO_DIR_NAME, "demo"], ids


def check_chat(out: str, ctx: dict) -> None:
    body = _json(out)
    assert "error" not in body and body.get("object") == "chat.completion", body
    assert body["model"] == DEMO_DIR_NAME, body["model"]      # vLLM names the first served name
    assert body["choices"][0]["message"]["content"], body


def check_settings_listing(out: str, ctx: dict) -> None:
    for s in S.SETTINGS:
        assert f"{s.env_name}  {s.flag_name}" in out, s.env_name


def check_plan_table(out: str, ctx: dict) -> None:
    assert out.startswith("turingbox plan\n") and "reasons:" in out and "\nvllm serve " in out, out[:300]
    assert re.search(r"^\s+served as\s+turingbox-demo-qwen3\.6-27b-awq, demo$", out, re.MULTILINE), out[:600]


def check_plan_json(out: str, ctx: dict) -> None:
    plan = _json(out)
    assert plan["tensor_parallel_size"] == 4 and plan["quantization"] == "awq" and plan["demo"], plan["reasons"][:2]


# (pattern, checker): the first that matches the command (after the port is substituted) checks its stdout
RUN: list[tuple[str, Callable[[str, dict], None]]] = [
    (r"curl -s localhost:\d+/health/ready\b", check_ready),
    (r"curl -s localhost:\d+/turingbox/plan\b", check_plan),
    (r"curl -s localhost:\d+/v1/models\b", check_models),
    (r"curl -s localhost:\d+/v1/chat/completions\b", check_chat),
    (r"turingbox settings\s*(#|$)", check_settings_listing),
    (r"turingbox plan --gpus-json tests/fixtures/gpus/4x2080ti-22g\.json --json\b", check_plan_json),
    (r"turingbox plan --gpus-json tests/fixtures/gpus/4x2080ti-22g\.json\s*(#|$)", check_plan_table),
]


def classify(ex: Example):
    for pattern, why in NOT_RUN:
        if re.match(pattern, ex.command):
            return "skip", why
    if ex.stderr is not None:
        return "refusal", None
    for pattern, check in RUN:
        if re.match(pattern, ex.command.replace(README_PORT, "localhost:1")):
            return "run", check
    return None, None


# ---- a real serve on the stand-in engine --------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    """The caller's environment without settings, the fake's knobs or proxies (curl honours http_proxy)."""
    drop = re.compile(r"^(TURINGBOX_|FAKE_VLLM_)|^(https?|all|no)_proxy$", re.IGNORECASE)
    env = {k: v for k, v in os.environ.items() if not drop.search(k) and k != "VLLM_WORKER_MULTIPROC_METHOD"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")   # the venv's `turingbox`
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme-serve")
    port = _free_port()
    env = _clean_env()
    env.update({
        "TURINGBOX_VLLM_COMMAND": f"{sys.executable} {FAKE_VLLM}",
        "TURINGBOX_MODELS_DIR": str(tmp / "models"),       # the demo model is built here, as serve builds it
        "TURINGBOX_CACHE_DIR": str(tmp / "cache"),
        "TURINGBOX_RUNTIME_DIR": str(tmp / "runtime"),
        "TMPDIR": str(tmp),
        "PYTHONUNBUFFERED": "1",
        # like vLLM 0.21: a request naming a model it does not serve gets 404 (the stand-in's default takes any)
        "FAKE_VLLM_CHECK_MODEL": "1",
    })
    log = open(tmp / "serve.log", "wb")
    # everything the README leaves to the defaults stays default: the demo model, active warmup included
    proc = subprocess.Popen([sys.executable, "-m", "turingbox", "serve", "--gpus-json", GPUS, "--host", "127.0.0.1",
                             "--port", str(port)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240           # the demo tokenizer is built on the first start (~10 s)
    try:
        with httpx.Client(trust_env=False, timeout=5) as client:
            def ready() -> bool:
                assert proc.poll() is None, "serve exited:\n" + (tmp / "serve.log").read_text()[-4000:]
                try:
                    return client.get(url + "/health/ready").status_code == 200
                except httpx.TransportError:
                    return False
            try:
                wait_until(ready, deadline - time.monotonic(), interval=0.2, what="readiness")
            except AssertionError:
                raise AssertionError("not ready:\n" + (tmp / "serve.log").read_text()[-4000:]) from None
        yield {"port": port, "log": tmp / "serve.log"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        log.close()


def _run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=REPO, env=_clean_env(),
                          timeout=120)


EXAMPLES = examples()


def test_the_readme_has_the_examples_this_test_knows():
    assert len(EXAMPLES) >= 15, [e.command for e in EXAMPLES]
    unknown = [f"README.md:{e.line}: {e.command}" for e in EXAMPLES if classify(e)[0] is None]
    assert not unknown, "classify these README examples (RUN with a check, or NOT_RUN with why): " + "; ".join(unknown)
    kinds = [classify(e)[0] for e in EXAMPLES]
    assert kinds.count("run") >= 7 and kinds.count("refusal") >= 1, kinds
    # the chat example is the one an operator pastes first; it must use the demo model's stable name
    chat = [e for e in EXAMPLES if "/v1/chat/completions" in e.command]
    assert chat and all('"model": "demo"' in e.command for e in chat), chat


@pytest.mark.parametrize("ex", [e for e in EXAMPLES if classify(e)[0] == "run" and e.command.startswith("curl")],
                         ids=lambda e: f"README:{e.line}")
def test_curl_example(server, ex):
    assert ex.command.count(README_PORT) == 1, ex.command
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed; the README's examples use it")
    command = ex.command.replace(README_PORT, f"localhost:{server['port']}")
    r = _run(command)
    assert r.returncode == 0, (command, r.returncode, r.stderr)
    classify(ex)[1](r.stdout, server)


@pytest.mark.parametrize("ex", [e for e in EXAMPLES if classify(e)[0] == "run" and not e.command.startswith("curl")],
                         ids=lambda e: f"README:{e.line}")
def test_command_example(ex):
    r = _run(ex.command)
    assert r.returncode == 0, (ex.command, r.returncode, r.stderr[-2000:])
    classify(ex)[1](r.stdout, {})


@pytest.mark.parametrize("ex", [e for e in EXAMPLES if classify(e)[0] == "refusal"], ids=lambda e: f"README:{e.line}")
def test_refusal_example(ex):
    r = _run(ex.command)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", ex.stderr), (ex.command, r.returncode, r.stderr)


def test_the_stand_in_refuses_a_name_it_does_not_serve(server):
    """The control for the chat example: the same request naming another model gets vLLM 0.21's 404."""
    (ex,) = [e for e in EXAMPLES if "/v1/chat/completions" in e.command]
    r = _run(ex.command.replace(README_PORT, f"localhost:{server['port']}").replace('"model": "demo"',
                                                                                   '"model": "qwen"'))
    body = _json(r.stdout)
    assert body["error"]["message"] == "The model `qwen` does not exist." and body["error"]["code"] == 404, body
