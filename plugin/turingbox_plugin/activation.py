"""Whether the plugin is active in this process, and with which settings.

Pure: a function of vLLM's `additional_config` and the engine's environment as turingbox_plugin.contract
declares them, and the only place the plugin turns them into settings. Active exactly when additional_config
has a "turingbox" section: the appliance writes every key of contract.PluginConfig there (its resolved
values); a user running `vllm serve` themselves passes `--additional-config '{"turingbox": {...}}'` with any
subset. No TURINGBOX_* setting of the appliance is read here: an operator's TURINGBOX_GDN=auto in vLLM's
environment cannot reach the workers raw (issue 15).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from turingbox_plugin.contract import (CONFIG_KEY, GDN_MODES, PluginConfig, _truthy, read_engine_env,
                                       turingbox_section)

__all__ = ["CONFIG_KEY", "GDN_MODES", "PluginSettings", "resolve_settings", "turingbox_section",
           "argv_additional_config"]


@dataclass(frozen=True)
class PluginSettings(PluginConfig):
    """The contract's PluginConfig, plus what this process learnt beside it."""
    active: bool = False
    runtime_dir: str | None = None        # contract.ENGINE_ENV (additional_config would split vLLM's cache key)
    benchmark_mode: bool = False          # contract.ENGINE_ENV
    autotune_compile_threads: int | None = None   # contract.ENGINE_ENV: a CPU count, no kernel (autotune.compile_threads)
    source: str = "inactive"              # "additional_config" | "inactive"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "active": self.active, "runtime_dir": self.runtime_dir,
                "benchmark_mode": self.benchmark_mode, "autotune_compile_threads": self.autotune_compile_threads,
                "source": self.source}


def resolve_settings(additional_config: Any = None, env: Mapping[str, str] | None = None) -> PluginSettings:
    """Settings from additional_config['turingbox'] and the contract's engine variables (env: the process's
    environment when None). Raises ValueError with one sentence for a malformed value."""
    section = turingbox_section(additional_config)
    if section is None:
        return PluginSettings()
    config, unknown = PluginConfig.from_section(section)
    engine = read_engine_env(env)
    # in the section (a plain vLLM user's choice, never the appliance's) they win over the engine variables
    runtime_dir = unknown.pop("runtime_dir", None) or engine["runtime_dir"]
    bench = unknown.pop("benchmark_mode", None)
    benchmark_mode = _truthy(bench, f"additional_config.{CONFIG_KEY}.benchmark_mode") if bench is not None \
        else engine["benchmark_mode"]
    return PluginSettings(**{k: getattr(config, k) for k in config.__dataclass_fields__}, active=True,
                          runtime_dir=runtime_dir, benchmark_mode=benchmark_mode,
                          autotune_compile_threads=engine["autotune_compile_threads"],
                          source="additional_config", extra=unknown)


def argv_additional_config(argv: Sequence[str]) -> Any:
    """The --additional-config value from a `vllm serve` argv (the API-server process), else None."""
    for i, arg in enumerate(argv):
        if arg == "--additional-config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--additional-config="):
            return arg.split("=", 1)[1]
    return None
