"""Waiting on a condition, the one way tests wait: poll it until it holds or a deadline passes (then fail saying
what was awaited). No test sleeps a fixed time to let something happen (tests/project/test_no_fixed_sleeps.py)."""
from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05, what: str = ""):
    """predicate's first true value, polled every interval; AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)  # poll: the pause between two checks of the condition
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
