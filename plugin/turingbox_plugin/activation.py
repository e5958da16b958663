"""Whether the plugin is active in this process, and with which settings.

Pure: a function of vLLM's `additional_config` dict and the environment, and the only place the
plugin reads its settings. The appliance passes its resolved values in
`--additional-config '{"turingbox": {...}}'` (flag > env > default already applied there); users
running `vllm serve` themselves may use that or TURINGBOX_* variables. A key present in
additional_config wins over the variable, the same order as the appliance's own (the explicit
argument beats the ambient environment); a variable only fills keys the config leaves out.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

CONFIG_KEY = "turingbox"          # key inside vLLM's additional_config
ENV_ACTIVATE = "TURINGBOX_PLUGIN"  # any true value activates the plugin without additional_config

GDN_MODES = ("auto", "turbo", "vllm")   # the appliance's TURINGBOX_GDN values, "auto" its default
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class PluginSettings:
    active: bool = False
    strict_warmup: bool = False
    require_plugin: bool = False
    benchmark_mode: bool = False
    gdn: str = "vllm"                     # "turbo" | "vllm" | "auto" (turbo on sm_75, see gdn_path)
    num_speculative_tokens: int | None = None
    max_num_seqs: int | None = None
    cudagraph_capture_sizes: tuple[int, ...] = ()
    runtime_dir: str | None = None
    prune_autotune: bool = True           # sm_75: drop autotune configs differing only in num_stages
    source: str = "inactive"              # "additional_config" | "env" | "inactive"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def gdn_path(self, capability: tuple[int, int] | None) -> str:
        """The GDN path for a GPU of this compute capability: "auto" picks turbo on sm_75 only."""
        if self.gdn != "auto":
            return self.gdn
        return "turbo" if capability == (7, 5) else "vllm"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cudagraph_capture_sizes"] = list(self.cudagraph_capture_sizes)
        d.pop("extra", None)
        return d


def _truthy(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} = {value!r} is not a boolean (use 1/0, true/false)")


def turingbox_section(additional_config: Any) -> dict[str, Any] | None:
    """The plugin's dict inside vLLM's additional_config, or None when absent."""
    if additional_config is None:
        return None
    if isinstance(additional_config, str):
        try:
            additional_config = json.loads(additional_config)
        except ValueError:
            return None
    if not isinstance(additional_config, Mapping):
        return None
    section = additional_config.get(CONFIG_KEY)
    if section is None:
        return None
    if section is True:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"additional_config['{CONFIG_KEY}'] must be an object, got {type(section).__name__}")
    return dict(section)


def resolve_settings(additional_config: Any = None, env: Mapping[str, str] | None = None) -> PluginSettings:
    """Settings from additional_config['turingbox'] overlaid by TURINGBOX_* variables.

    Raises ValueError with one sentence for a malformed value (the worker turns it into a
    startup failure; a typo must never silently disable strict warmup).
    """
    env = os.environ if env is None else env
    section = turingbox_section(additional_config)
    env_on = env.get(ENV_ACTIVATE, "")
    active_env = _truthy(env_on, ENV_ACTIVATE) if env_on != "" else False
    if section is None and not active_env:
        return PluginSettings()
    cfg = dict(section or {})

    def flag(key: str, env_name: str, default: bool) -> bool:
        if key in cfg:
            return _truthy(cfg[key], f"additional_config.{CONFIG_KEY}.{key}")
        if env.get(env_name, "") != "":
            return _truthy(env[env_name], env_name)
        return default

    if cfg.get("gdn") is not None:
        gdn, gdn_source = str(cfg["gdn"]), f"additional_config.{CONFIG_KEY}.gdn"
    else:
        gdn, gdn_source = env.get("TURINGBOX_GDN") or "vllm", "TURINGBOX_GDN"
    gdn = gdn.strip().lower()
    if gdn not in GDN_MODES:
        raise ValueError(f"{gdn_source} = {gdn!r} is not one of {', '.join(GDN_MODES)}")
    sizes = cfg.get("cudagraph_capture_sizes") or ()
    if not isinstance(sizes, Sequence) or isinstance(sizes, str) or not all(
            isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(f"cudagraph_capture_sizes = {sizes!r} is not a list of positive integers")

    def opt_int(key: str) -> int | None:
        v = cfg.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"additional_config.{CONFIG_KEY}.{key} = {v!r} is not a whole number >= 0")
        return v

    known = {"strict_warmup", "require_plugin", "benchmark_mode", "gdn", "num_speculative_tokens",
             "max_num_seqs", "cudagraph_capture_sizes", "runtime_dir", "prune_autotune"}
    return PluginSettings(
        active=True,
        strict_warmup=flag("strict_warmup", "TURINGBOX_STRICT_WARMUP", False),
        require_plugin=flag("require_plugin", "TURINGBOX_REQUIRE_PLUGIN", False),
        benchmark_mode=flag("benchmark_mode", "TURINGBOX_BENCHMARK_MODE", False),
        gdn=gdn,
        num_speculative_tokens=opt_int("num_speculative_tokens"),
        max_num_seqs=opt_int("max_num_seqs"),
        cudagraph_capture_sizes=tuple(sorted(set(sizes))),
        runtime_dir=cfg.get("runtime_dir") or env.get("TURINGBOX_RUNTIME_DIR") or None,
        prune_autotune=flag("prune_autotune", "TURINGBOX_PRUNE_AUTOTUNE", True),
        source="additional_config" if section is not None else "env",
        extra={k: v for k, v in cfg.items() if k not in known},
    )


def argv_additional_config(argv: Sequence[str]) -> Any:
    """The --additional-config value from a `vllm serve` argv (the API-server process), else None."""
    for i, arg in enumerate(argv):
        if arg == "--additional-config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--additional-config="):
            return arg.split("=", 1)[1]
    return None
