"""The image's ENTRYPOINT, run here as the image runs it (after tini): `docker run IMAGE doctor` and
`docker run IMAGE turingbox doctor` (what `docker compose run --rm turingbox turingbox doctor` passes) are the
same command (issue 34: the second said "invalid choice: 'turingbox'"). Real subprocesses, no Docker."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")


def image_entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT after `tini --`, with this machine's interpreter for the image's python3."""
    text = open(os.path.join(REPO, "Dockerfile")).read()
    [line] = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    argv = json.loads(line)
    assert argv[:2] == ["tini", "--"], argv             # tini stays PID 1: signals reach turingbox
    cmd = argv[2:]
    if cmd[0] in ("python3", "python"):
        return [sys.executable, *cmd[1:]]
    # a console script: the one installed beside this interpreter, as /opt/venv/bin holds it in the image
    return [shutil.which(cmd[0], path=os.path.dirname(sys.executable)) or cmd[0], *cmd[1:]]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    return subprocess.run([*image_entrypoint(), *args], capture_output=True, text=True, timeout=300, cwd="/",
                          env={**env, "TURINGBOX_MODELS_DIR": "/nonexistent-models"})


@pytest.mark.parametrize("args", [("plan", "--json", "--gpus-json", H200), ("doctor", "--json")])
def test_a_leading_turingbox_is_the_programs_own_name(args):
    plain, named = run(*args), run("turingbox", *args)
    for r in (plain, named):
        assert "invalid choice" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert named.returncode == plain.returncode
    a, b = json.loads(plain.stdout), json.loads(named.stdout)
    if args[0] == "plan":
        assert plain.returncode == 0 and a == b and a["tensor_parallel_size"] == 1
    else:
        assert [c["name"] for c in a["checks"]] == [c["name"] for c in b["checks"]] and "plan" in {c["name"] for c in b["checks"]}


def test_the_default_command_and_bad_commands_stay_as_they_were():
    assert "serve" in run("turingbox", "--help").stdout
    r = run("turingbox", "turingbox", "plan")              # only the one program name is dropped
    assert r.returncode == 2 and "invalid choice: 'turingbox'" in r.stderr
    assert run("--version").stdout == run("turingbox", "--version").stdout != ""
