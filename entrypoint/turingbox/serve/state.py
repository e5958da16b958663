"""What the sidecar answers from: the controller writes it (stage, plan, upstream, drain, failure), the app's
handlers and the proxy read it."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from turingbox.serve import stages
from turingbox.serve.options import ServeOptions

DRAINING_RETRY_AFTER_S = 5


@dataclass
class ServeState:
    """What the sidecar answers from; the controller writes it, the handlers read it."""

    tracker: stages.StartupTracker
    options: ServeOptions
    plan: dict | None = None              # redacted: safe to show
    upstream_url: str | None = None
    upstream_api_key: str | None = None   # a key vLLM itself was given (passed after --)
    draining: bool = False
    startup_ok: bool = False
    upstream_dead: str | None = None      # why vLLM is gone (liveness fails)
    probe_failure: str | None = None      # after ready: why vLLM's /health did not answer
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    dead: asyncio.Event = field(default_factory=asyncio.Event)   # set together with upstream_dead

    def mark_upstream_dead(self, reason: str) -> None:
        self.upstream_dead = reason
        self.dead.set()

    def __post_init__(self) -> None:
        self.idle.set()

    def request_started(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self.idle.set()

    def is_ready(self) -> bool:
        return (self.tracker.stage == stages.READY and not self.draining and self.upstream_dead is None
                and self.probe_failure is None)

    def not_ready_body(self) -> dict[str, Any]:
        body = self.tracker.snapshot()
        if self.upstream_dead is not None:
            body.update(stage=stages.FAILED, estimate_s=None, reason=self.upstream_dead)
        elif self.draining:
            body.update(stage=stages.DRAINING, estimate_s=None, reason=stages.DESCRIPTIONS[stages.DRAINING])
        elif self.probe_failure is not None and self.tracker.stage == stages.READY:
            body.update(stage="unresponsive", estimate_s=None, reason=self.probe_failure)
        return body

    def retry_after(self) -> str:
        estimate = self.tracker.estimate()
        if self.draining or estimate is None:
            return str(DRAINING_RETRY_AFTER_S)
        return str(max(1, min(int(math.ceil(estimate)), 600)))
