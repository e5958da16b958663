"""Fixtures of the reliability tests: real `turingbox serve` processes in front of the stand-in upstream.

The serve processes run this checkout's code (PYTHONPATH set to its packages), whatever copy of
turingbox happens to be installed.
"""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "sidecar"))
sys.path.insert(0, HERE)

from sidecar_harness import Serve  # noqa: E402

REPO_PYTHONPATH = os.pathsep.join(
    [os.path.join(REPO, p) for p in ("entrypoint", "warmup", "plugin")]
    + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


def serve_env(**extra: str) -> dict:
    return {"PYTHONPATH": REPO_PYTHONPATH, **extra}


@pytest.fixture
def serve_factory(tmp_path):
    started: list[Serve] = []

    def make(env: dict | None = None, **kw) -> Serve:
        d = tmp_path / f"s{len(started)}"
        d.mkdir()
        s = Serve(str(d), env=serve_env(**(env or {})), **kw)
        started.append(s)
        return s
    yield make
    for s in started:
        s.close()
