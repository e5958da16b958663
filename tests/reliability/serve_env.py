"""The environment of the reliability tests' `turingbox serve` processes: this checkout's code (PYTHONPATH set to
its packages), whatever copy of turingbox happens to be installed."""
from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO_PYTHONPATH = os.pathsep.join(
    [os.path.join(REPO, p) for p in ("entrypoint", "warmup", "plugin")]
    + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


def serve_env(**extra: str) -> dict:
    return {"PYTHONPATH": REPO_PYTHONPATH, **extra}
