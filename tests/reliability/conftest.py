"""Fixtures of the reliability tests: real `turingbox serve` processes in front of the stand-in upstream,
running this checkout's code (serve_env)."""
from __future__ import annotations

import pytest

from tests.reliability.serve_env import serve_env
from tests.support.sidecar_harness import Serve


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
