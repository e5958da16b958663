"""The settings `turingbox serve` reads (declared once here: flag + TURINGBOX_* variable)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from turingbox import settings as S


def non_negative_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be zero or a positive number")
    return value


def command_line(text: str) -> str:
    try:
        parts = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"is not a valid command line ({exc})") from None
    if not parts:
        raise ValueError("must name a program")
    return text


def api_key(text: str) -> str:
    value = str(text)
    if value != value.strip() or not value:
        raise ValueError("must be a non-empty key without surrounding spaces")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("must not contain spaces or control characters")
    return value


SERVE_SETTINGS = tuple(s.name for s in (
    S.declare(S.Setting("host", "address the sidecar listens on", str, "0.0.0.0")),
    S.declare(S.Setting("port", "public port of the sidecar (health, metrics, /v1 proxy)", S.port, 8000)),
    S.declare(S.Setting("upstream_port", "loopback port for vLLM itself; 0 picks a free one", S.port, 0)),
    S.declare(S.Setting("api_key", "API key required on /v1/* and /turingbox/plan as 'Authorization: Bearer "
                        "KEY' (unset or empty: off, /v1 open, logged as a warning)", api_key, None, secret=True)),
    S.declare(S.Setting("metrics_require_key", "also require the API key on /metrics", S.boolean, False)),
    S.declare(S.Setting("drain_grace_seconds", "on SIGTERM, how long in-flight requests may take to finish",
                        non_negative_float, 30.0)),
    S.declare(S.Setting("vllm_stop_grace_seconds", "how long vLLM gets between SIGTERM and SIGKILL",
                        non_negative_float, 15.0)),
    S.declare(S.Setting("startup_timeout_seconds", "give up when vLLM is not answering after this long",
                        S.positive_float, 3600.0)),
    S.declare(S.Setting("max_request_bytes", "largest request body the proxy accepts", S.positive_int,
                        32 * 1024 * 1024)),
    S.declare(S.Setting("max_header_bytes", "largest request head (request line and headers) the sidecar "
                        "accepts; larger ones get 431", S.positive_int, 64 * 1024)),
    S.declare(S.Setting("client_timeout_seconds", "longest a client may take to send its request head, and "
                        "to send each part of its body (then 408)", S.positive_float, 60.0)),
    S.declare(S.Setting("active_warmup", "send real requests through vLLM before reporting ready",
                        S.boolean, True)),
    S.declare(S.Setting("upstream_probe_seconds", "after ready, how often vLLM's /health is probed (and "
                        "how long a probe may take before readiness turns 503)", S.positive_float, 5.0)),
    S.declare(S.Setting("exit_linger_seconds", "after vLLM died or startup failed (no plan, vLLM not ready), "
                        "how long the sidecar keeps answering (liveness 503) before exiting", non_negative_float, 2.0)),
    S.declare(S.Setting("vllm_command", "program that runs vLLM (default: this Python with "
                        "-m vllm.entrypoints.cli.main); for tests and custom builds", command_line, None)),
    S.declare(S.Setting("plan_file", "serve this plan JSON (from `turingbox plan --json`) instead of "
                        "planning now", str, None)),
))


def api_key_state(api_key: str | None, env: Mapping[str, str]) -> tuple[bool, str]:
    """(on, the startup log line's text) for the sidecar's key. settings.resolve treats an empty variable
    as unset; an empty TURINGBOX_API_KEY (a `.env` line `TURINGBOX_API_KEY=`, `${TURINGBOX_API_KEY:-}` in a
    compose file, an empty Secret key) means off as well, and the line says so by name (never the key)."""
    if api_key:
        return True, "API key: on (/v1/* and /turingbox/plan need 'Authorization: Bearer <key>')"
    name = S.REGISTRY["api_key"].env_name
    why = f"{name} is set but empty" if env.get(name) == "" else f"{name} is not set"
    return False, f"API key: off ({why})"


@dataclass(frozen=True)
class ServeOptions:
    host: str = "0.0.0.0"
    port: int = 8000
    upstream_port: int = 0
    api_key: str | None = None
    metrics_require_key: bool = False
    drain_grace_seconds: float = 30.0
    vllm_stop_grace_seconds: float = 15.0
    startup_timeout_seconds: float = 3600.0
    max_request_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    client_timeout_seconds: float = 60.0
    active_warmup: bool = True
    upstream_probe_seconds: float = 5.0
    exit_linger_seconds: float = 2.0
    vllm_command: str | None = None
    plan_file: str | None = None

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> "ServeOptions":
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})
