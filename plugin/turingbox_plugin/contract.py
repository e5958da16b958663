"""What the appliance and the plugin agree on, in one module: the appliance imports this and writes only
what it declares; the plugin reads only what it declares.

- `PluginConfig`: the keys of vLLM's `--additional-config '{"turingbox": {...}}'`, typed, with the plugin's
  defaults (what a plain `vllm serve --additional-config '{"turingbox": {}}'` gets).
- `ENGINE_ENV`: the values that travel in the engine's environment instead, because vLLM hashes
  additional_config into its compile-cache key and these change per start (runtime_dir), per run
  (benchmark_mode) or per machine without changing a kernel (autotune_compile_threads); `read_engine_env` is the
  plugin's one reader of them.
- The plugin's variables all carry its own prefix, `PREFIX` (TBPLUGIN_): the engine's, `GDN_LIB_ENV` and the
  client tools' `BENCH_URL_ENV` / `API_KEY_ENV`. No name the plugin reads is a TURINGBOX_* setting of the
  appliance, so the appliance's settings may stay in vLLM's environment unread; the appliance resolves its own
  (TURINGBOX_RUNTIME_DIR, TURINGBOX_BENCHMARK_MODE) and its engine launcher writes the results under these names.
- The worker status files (`STATUS_STAGES`, `status_path`, `STATUS_KEYS`), and `ModelConfig`, the static
  facts of a model directory the planner and check-model share.

Pure: no torch, no vLLM, no appliance import.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping, Sequence

from turingbox_plugin.model_config import DEMO_MARKER, ModelConfig, load_model_config, model_config_from_dict

__all__ = ["CONFIG_KEY", "GDN_MODES", "PluginConfig", "PREFIX", "ENGINE_ENV", "RUNTIME_DIR_ENV", "BENCHMARK_MODE_ENV",
           "AUTOTUNE_THREADS_ENV",
           "GDN_LIB_ENV", "BENCH_URL_ENV", "API_KEY_ENV", "read_engine_env", "client_defaults", "turingbox_section", "STATUS_STAGES", "STATUS_KEYS", "status_path", "status_rank",
           "ModelConfig", "load_model_config", "model_config_from_dict", "DEMO_MARKER"]

CONFIG_KEY = "turingbox"                 # the plugin's key inside vLLM's additional_config
GDN_MODES = ("auto", "turbo", "vllm")    # "auto": turbo on sm_75 only (PluginConfig.gdn_path)

# Every variable of the plugin starts with this (the appliance's settings start with TURINGBOX_; none is read here).
PREFIX = "TBPLUGIN_"
# The engine's environment: variable -> the PluginSettings field it fills (see the module's docstring).
RUNTIME_DIR_ENV = PREFIX + "RUNTIME_DIR"
BENCHMARK_MODE_ENV = PREFIX + "BENCHMARK_MODE"
AUTOTUNE_THREADS_ENV = PREFIX + "AUTOTUNE_COMPILE_THREADS"   # unset: the worker's CPUs per GPU worker (autotune)
ENGINE_ENV = {RUNTIME_DIR_ENV: "runtime_dir", BENCHMARK_MODE_ENV: "benchmark_mode",
              AUTOTUNE_THREADS_ENV: "autotune_compile_threads"}
# Where the plugin's sm_75 GDN library lies when not in the package's lib/ folder (no appliance setting).
GDN_LIB_ENV = PREFIX + "GDN_LIB"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _truthy(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} = {value!r} is not a boolean (use 1/0, true/false)")


def _where(key: str) -> str:
    return f"additional_config.{CONFIG_KEY}.{key}"


@dataclass(frozen=True)
class PluginConfig:
    """additional_config["turingbox"], typed. The appliance's planner fills every key from its resolved
    settings; a plain vLLM user may give any subset, the rest are these defaults."""
    strict_warmup: bool = False
    require_plugin: bool = False
    gdn: str = "vllm"
    num_speculative_tokens: int | None = None
    max_num_seqs: int | None = None
    cudagraph_capture_sizes: tuple[int, ...] = ()
    prune_autotune: bool = True           # sm_75: drop autotune configs differing only in num_stages

    def gdn_path(self, capability: tuple[int, int] | None) -> str:
        """The GDN path for a GPU of this compute capability: "auto" picks turbo on sm_75 only."""
        if self.gdn != "auto":
            return self.gdn
        return "turbo" if capability == (7, 5) else "vllm"

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON (what the appliance writes into --additional-config)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(PluginConfig)}

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> tuple[PluginConfig, dict[str, Any]]:
        """(the typed config, the keys it does not know) from a section; ValueError with one sentence for a
        malformed value (the worker turns it into a startup failure: a typo must never silently disable strict
        warmup)."""
        cfg = dict(section)
        gdn = str(cfg["gdn"]).strip().lower() if cfg.get("gdn") is not None else cls.gdn
        if gdn not in GDN_MODES:
            raise ValueError(f"{_where('gdn')} = {gdn!r} is not one of {', '.join(GDN_MODES)}")
        sizes = cfg.get("cudagraph_capture_sizes") or ()
        if not isinstance(sizes, Sequence) or isinstance(sizes, str) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"{_where('cudagraph_capture_sizes')} = {sizes!r} is not a list of positive integers")

        def opt_int(key: str) -> int | None:
            v = cfg.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{_where(key)} = {v!r} is not a whole number >= 0")
            return v

        def flag(key: str) -> bool:
            default = getattr(cls, key)
            return _truthy(cfg[key], _where(key)) if cfg.get(key) is not None else default

        config = cls(strict_warmup=flag("strict_warmup"), require_plugin=flag("require_plugin"), gdn=gdn,
                     num_speculative_tokens=opt_int("num_speculative_tokens"), max_num_seqs=opt_int("max_num_seqs"),
                     cudagraph_capture_sizes=tuple(sorted(set(sizes))), prune_autotune=flag("prune_autotune"))
        known = {f.name for f in fields(cls)}
        return config, {k: v for k, v in cfg.items() if k not in known}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PluginConfig:
        """A saved plan's "plugin" object (strict: no unknown key)."""
        config, unknown = cls.from_section(d)
        if unknown:
            raise ValueError(f"plugin has unknown key(s) {', '.join(sorted(unknown))}")
        return config


def turingbox_section(additional_config: Any) -> dict[str, Any] | None:
    """The plugin's dict inside vLLM's additional_config (a dict or its JSON text), or None when absent."""
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


def read_engine_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{"runtime_dir": str | None, "benchmark_mode": bool, "autotune_compile_threads": int | None} from the engine's
    environment (ENGINE_ENV); ValueError with one sentence for a malformed value."""
    # environ: the ENGINE_ENV channel the appliance's engine launcher sets (the contract's one reader)
    env = os.environ if env is None else env
    threads = (env.get(AUTOTUNE_THREADS_ENV) or "").strip()
    if threads and not (threads.isdigit() and int(threads) > 0):
        raise ValueError(f"{AUTOTUNE_THREADS_ENV} = {threads!r} is not a whole number > 0")
    return {"runtime_dir": env.get(RUNTIME_DIR_ENV) or None,
            "benchmark_mode": _truthy(env.get(BENCHMARK_MODE_ENV, ""), BENCHMARK_MODE_ENV),
            "autotune_compile_threads": int(threads) if threads else None}


# The client tools' defaults (bench decode/prefill, jit-report against a running server).
BENCH_URL_ENV = PREFIX + "BENCH_URL"
API_KEY_ENV = PREFIX + "API_KEY"        # the bearer token (the appliance's TURINGBOX_API_KEY is not read here)


def client_defaults(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """{"url", "api_key"}: the bench client's defaults from its two variables."""
    # environ: the client tools' BENCH_URL_ENV / API_KEY_ENV
    env = os.environ if env is None else env
    return {"url": env.get(BENCH_URL_ENV) or "http://localhost:8000", "api_key": env.get(API_KEY_ENV) or None}


def gdn_library_override(env: Mapping[str, str] | None = None) -> str | None:
    """$TBPLUGIN_GDN_LIB (GDN_LIB_ENV), or None."""
    # environ: GDN_LIB_ENV, the plugin's own library path (bench/gpu/bootstrap.sh sets it)
    env = os.environ if env is None else env
    return env.get(GDN_LIB_ENV) or None


# ---- worker status files: <runtime_dir>/worker-<rank>.json, one per worker, rewritten atomically ----------
STATUS_STAGES = ("starting", "loading", "compiling", "warming", "ready", "failed")
# keys every status file has (informative extras beside them): "warmup" is {"kernels", "seconds", "ok",
# "error"}, "jit_after_ready" {kernel: count}, "active" {path: what it says}
STATUS_KEYS = ("plugin_version", "pid", "rank", "stage", "warmup", "jit_after_ready", "gdn_path", "active")


def status_rank(parallel_config: Any, rank: int) -> int:
    """The worker's number among all engines' workers: data-parallel engine index x workers per engine + the
    worker's rank in its engine. vLLM 0.21 runs a dense model's DP engines independently (each engine's
    parallel_config says data_parallel_size 1, rank 0..TP-1) and keeps the engine's index in
    data_parallel_index, so without it two engines' rank-0 workers would write one status file."""
    index = int(getattr(parallel_config, "data_parallel_index", 0) or 0)
    per_engine = int(getattr(parallel_config, "world_size", 1) or 1)
    return index * per_engine + int(rank)


def status_path(runtime_dir: str, rank: int) -> str:
    return os.path.join(runtime_dir, f"worker-{int(rank)}.json")



# ---- the plugin's reads and writes of other tools' variables (vLLM's, Triton's, CUDA's) -------------------------
# Beside the contract's own variables above, so that this module is the plugin's one reader of the environment.

def environment() -> Mapping[str, str]:
    """This process's environment (the doctor reports from it)."""
    # environ: the plugin's one reader of the process environment
    return os.environ


def variable(name: str) -> str | None:
    """Another tool's variable as set (None when unset): TRITON_CACHE_DIR, CUDA_HOME, VLLM_PLUGINS, ..."""
    return environment().get(name)


def set_default_variable(name: str, value: str) -> None:
    """Give another tool's variable a default before the tool reads it; a value already set wins."""
    os.environ.setdefault(name, value)


@contextlib.contextmanager
def override_variable(name: str, value: str) -> Iterator[None]:
    """Set another tool's variable for the duration (the tool reads it from the process environment), then restore
    it as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
