"""The values `turingbox serve` runs with: the resolved serve settings (declared in turingbox.settings, with
their defaults; nothing here writes a default a second time)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from turingbox import settings as S

SERVE_SETTINGS = S.SERVE_SETTINGS
_DEFAULT = {name: S.REGISTRY[name].default for name in SERVE_SETTINGS}


def api_key_state(api_key: str | None, env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(on, the startup log line's text) for the sidecar's key. settings.resolve treats an empty variable
    as unset; an empty TURINGBOX_API_KEY (a `.env` line `TURINGBOX_API_KEY=`, `${TURINGBOX_API_KEY:-}` in a
    compose file, an empty Secret key) means off as well, and the line says so by name (never the key).
    env: the process environment when None (read by turingbox.settings)."""
    if api_key:
        return True, "API key: on (/v1/* and /turingbox/plan need 'Authorization: Bearer <key>')"
    name = S.REGISTRY["api_key"].env_name
    why = f"{name} is set but empty" if S.env_state("api_key", env) == "empty" else f"{name} is not set"
    return False, f"API key: off ({why})"


@dataclass(frozen=True)
class ServeOptions:
    host: str = _DEFAULT["host"]
    port: int = _DEFAULT["port"]
    upstream_port: int = _DEFAULT["upstream_port"]
    api_key: str | None = _DEFAULT["api_key"]
    metrics_require_key: bool = _DEFAULT["metrics_require_key"]
    drain_grace_seconds: float = _DEFAULT["drain_grace_seconds"]
    vllm_stop_grace_seconds: float = _DEFAULT["vllm_stop_grace_seconds"]
    startup_timeout_seconds: float = _DEFAULT["startup_timeout_seconds"]
    max_request_bytes: int = _DEFAULT["max_request_bytes"]
    max_header_bytes: int = _DEFAULT["max_header_bytes"]
    client_timeout_seconds: float = _DEFAULT["client_timeout_seconds"]
    active_warmup: bool = _DEFAULT["active_warmup"]
    upstream_probe_seconds: float = _DEFAULT["upstream_probe_seconds"]
    exit_linger_seconds: float = _DEFAULT["exit_linger_seconds"]
    vllm_command: str | None = _DEFAULT["vllm_command"]
    plan_file: str | None = _DEFAULT["plan_file"]
    max_n: int | None = _DEFAULT["max_n"]
    max_tokens: int | None = _DEFAULT["max_tokens"]
    default_max_tokens: int | None = _DEFAULT["default_max_tokens"]
    max_total_tokens: int | None = _DEFAULT["max_total_tokens"]
    max_concurrent_requests: int | None = _DEFAULT["max_concurrent_requests"]
    max_concurrent_per_key: int | None = _DEFAULT["max_concurrent_per_key"]
    request_timeout_seconds: float = _DEFAULT["request_timeout_seconds"]
    # the cache settings (cache_dir, baked_cache_dir, cache_lock_wait, aot_*), resolved with the rest at the
    # edge: a bad value ends serve with exit 2 instead of a cold start; empty: prepare_cache resolves them
    cache: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> "ServeOptions":
        cache = {k: v for k, v in values.items() if k in S.CACHE_SETTINGS}
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__}, cache=cache)
