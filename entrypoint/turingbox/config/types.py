"""The typed settings the core takes: one frozen dataclass per group of the table (config/table.py).

Each field is one row of the table, with the row's default (computed when the object is made, so a default that
depends on the home or temporary directory is not fixed at import). `load()` (config/__init__.py) fills them from
the flags and TURINGBOX_* variables; tests make them directly with the values they need. Besides the values, each
group records which settings were given (a flag or a non-empty variable) and which variables were set but empty,
for the few decisions and messages that depend on where a value came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from turingbox.config.table import (CACHE_SETTINGS, DEMO_SETTINGS, LAUNCHER_SETTINGS, PLANNER_SETTINGS, REGISTRY,
                                    SERVE_SETTINGS, WARMUP_SETTINGS)


def _default(name: str) -> Any:
    return field(default_factory=lambda: REGISTRY[name].default_value())


@dataclass(frozen=True)
class _Group:
    # names given by a flag or a non-empty variable (the rest are their defaults)
    given: frozenset[str] = field(default=frozenset(), compare=False)
    # names whose TURINGBOX_* variable is set but empty (which counts as unset)
    empty_variables: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in ("given", "empty_variables"))


@dataclass(frozen=True)
class PlanSettings(_Group):
    """What the planner reads (`turingbox plan`, and serve/warmup when they plan). None: decide automatically."""
    model: str | None = _default("model")
    model_revision: str | None = _default("model_revision")
    gpus_json: str | None = _default("gpus_json")
    tensor_parallel_size: int | None = _default("tensor_parallel_size")
    objective: str = _default("objective")
    mtp: int | None = _default("mtp")
    max_model_len: int | None = _default("max_model_len")
    max_num_seqs: int | None = _default("max_num_seqs")
    max_num_batched_tokens: int | None = _default("max_num_batched_tokens")
    gpu_memory_utilization: float | None = _default("gpu_memory_utilization")
    kv_cache_dtype: str | None = _default("kv_cache_dtype")
    attention_backend: str | None = _default("attention_backend")
    dtype: str | None = _default("dtype")
    gdn_prefill_backend: str | None = _default("gdn_prefill_backend")
    gdn: str = _default("gdn")
    enforce_eager: bool = _default("enforce_eager")
    prefix_caching: bool = _default("prefix_caching")
    load_format: str = _default("load_format")
    served_model_name: str | None = _default("served_model_name")
    min_model_len: int = _default("min_model_len")
    strict_warmup: bool = _default("strict_warmup")
    require_plugin: bool = _default("require_plugin")
    benchmark_mode: bool = _default("benchmark_mode")
    runtime_dir: str = _default("runtime_dir")
    autotune_compile_threads: int | None = _default("autotune_compile_threads")


@dataclass(frozen=True)
class DemoSettings(_Group):
    """The built-in demo model: where models are kept and which variant was asked for."""
    models_dir: str = _default("models_dir")
    demo_layers: int | None = _default("demo_layers")
    demo_awq: bool = _default("demo_awq")

    @property
    def variant_given(self) -> bool:
        """Whether the operator chose the demo variant (TURINGBOX_DEMO_AWQ/TURINGBOX_DEMO_LAYERS or their flags)."""
        return bool({"demo_awq", "demo_layers"} & self.given)


@dataclass(frozen=True)
class ServeSettings(_Group):
    """`turingbox serve`: the sidecar in front of vLLM."""
    host: str = _default("host")
    port: int = _default("port")
    upstream_port: int = _default("upstream_port")
    api_key: str | None = _default("api_key")
    metrics_require_key: bool = _default("metrics_require_key")
    drain_grace_seconds: float = _default("drain_grace_seconds")
    vllm_stop_grace_seconds: float = _default("vllm_stop_grace_seconds")
    startup_timeout_seconds: float = _default("startup_timeout_seconds")
    max_request_bytes: int = _default("max_request_bytes")
    max_header_bytes: int = _default("max_header_bytes")
    client_timeout_seconds: float = _default("client_timeout_seconds")
    max_n: int | None = _default("max_n")
    max_tokens: int | None = _default("max_tokens")
    default_max_tokens: int | None = _default("default_max_tokens")
    max_total_tokens: int | None = _default("max_total_tokens")
    max_concurrent_requests: int | None = _default("max_concurrent_requests")
    max_concurrent_per_key: int | None = _default("max_concurrent_per_key")
    request_timeout_seconds: float = _default("request_timeout_seconds")
    active_warmup: bool = _default("active_warmup")
    upstream_probe_seconds: float = _default("upstream_probe_seconds")
    exit_linger_seconds: float = _default("exit_linger_seconds")
    vllm_command: str | None = _default("vllm_command")
    plan_file: str | None = _default("plan_file")


@dataclass(frozen=True)
class CacheSettings(_Group):
    """The compile cache: the volume, the baked read-only root, the lock wait, the ahead-of-time sources and
    whether a start takes the KV cache size its entry recorded."""
    cache_dir: str = _default("cache_dir")
    baked_cache_dir: str | None = _default("baked_cache_dir")
    cache_lock_wait: float = _default("cache_lock_wait")
    aot_triton_dir: str | None = _default("aot_triton_dir")
    aot_flashinfer_dir: str | None = _default("aot_flashinfer_dir")
    aot_modelinfos_dir: str | None = _default("aot_modelinfos_dir")
    kv_size_from_cache: bool = _default("kv_size_from_cache")


@dataclass(frozen=True)
class WarmupSettings(_Group):
    """`turingbox warmup` / `cache seed`."""
    warmup_timeout: float = _default("warmup_timeout")


@dataclass(frozen=True)
class LauncherSettings(_Group):
    """How vLLM is started and stopped: serve's rows that warmup and `cache seed` read too."""
    vllm_command: str | None = _default("vllm_command")
    vllm_stop_grace_seconds: float = _default("vllm_stop_grace_seconds")


# group name -> (its dataclass, the table's names in it); the test keeps the two the same
GROUPS: dict[str, tuple[type[_Group], tuple[str, ...]]] = {
    "plan": (PlanSettings, PLANNER_SETTINGS),
    "demo": (DemoSettings, DEMO_SETTINGS),
    "serve": (ServeSettings, SERVE_SETTINGS),
    "cache": (CacheSettings, CACHE_SETTINGS),
    "warmup": (WarmupSettings, WARMUP_SETTINGS),
    "launcher": (LauncherSettings, LAUNCHER_SETTINGS),   # a subset of serve's rows
}
for _cls, _names in GROUPS.values():
    assert set(_cls.setting_names()) == set(_names), f"{_cls.__name__} does not match the table"


@dataclass(frozen=True)
class Settings:
    """What one command loaded: the groups it asked `load` for (None: not loaded)."""
    plan: PlanSettings | None = None
    demo: DemoSettings | None = None
    serve: ServeSettings | None = None
    cache: CacheSettings | None = None
    warmup: WarmupSettings | None = None
    launcher: LauncherSettings | None = None
