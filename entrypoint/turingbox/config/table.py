"""Every setting of the appliance, declared once: a CLI flag and a TURINGBOX_* environment variable.

The one table is SETTINGS below (grouped by what it configures: the plan, the demo model, the serve
sidecar, the compile cache, warmup); each row gives the name, help, parser, default and, where it is
not derived from the name, the flag or variable. Nothing else declares a setting: a command adds the
flags it uses with `add_arguments(parser, names)` and loads them once with `turingbox.config.load`
into the typed groups of config/types.py; the core takes those. Precedence: CLI flag > TURINGBOX_* env >
default. A bad value raises UsageError naming the setting, the variable and the value. Defaults that
depend on the machine (cache_dir, models_dir, runtime_dir) are computed at load (default_factory).

The vocabulary the parsers check against (MTP_MAX, BACKENDS, KV_DTYPES, ...) lives here too, so the
parsers need nothing above this module; the planner imports it from here.

Settings handed to the vLLM plugin (turingbox_plugin, which imports nothing of the appliance and has
its own resolver, turingbox_plugin.activation) are listed in PLUGIN_CONFIG and PLUGIN_ENV: the
appliance resolves them here and passes only the results on.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from turingbox.config import envs
from turingbox.errors import UsageError
from turingbox_plugin import contract as plugin_contract

# ---- the vocabulary of allowed values (the planner imports these from here) --------------------

MTP_MAX = 8          # vLLM accepts more, but acceptance of deeper drafts collapses; refuse silly values
BACKENDS = ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
OBJECTIVES = ("latency", "throughput")
GDN_PATHS = plugin_contract.GDN_MODES              # "auto": turbo on sm_75 only
GDN_PREFILL_BACKENDS = ("triton", "flashinfer")
# how vLLM reads a real checkpoint's weights (the demo has none: --load-format dummy); "auto": the planner's choice
LOAD_FORMATS = ("auto", "safetensors", "safetensors-prefetch", "runai_streamer", "fastsafetensors")
FULL_ATTENTION_INTERVAL = 4               # every 4th layer of Qwen3.5/3.6 is full attention


@dataclass(frozen=True)
class Setting:
    name: str                      # python name, e.g. "max_model_len"
    help: str
    parse: Callable[[str], Any] = str   # str -> value; raise ValueError with a short reason
    default: Any = None
    flag: str = ""                 # defaults to --max-model-len
    env: str = ""                  # defaults to TURINGBOX_MAX_MODEL_LEN
    secret: bool = False           # never logged nor shown in /turingbox/plan
    choices: tuple = field(default=())
    # a default that depends on the machine (the home or temporary directory): computed when settings are
    # loaded, not when this module is imported; `default` is then None
    default_factory: Callable[[], Any] | None = None

    def default_value(self) -> Any:
        """The default now: default_factory's result where the row has one, else default."""
        return self.default_factory() if self.default_factory is not None else self.default

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env_name(self) -> str:
        return self.env or "TURINGBOX_" + self.name.upper()


# ---- value parsers: each raises ValueError with a short reason ----------------------------

MAX_INT = 2**31 - 1  # beyond any count vLLM takes; keeps float maths in the planner finite


def positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value <= 0:
        raise ValueError("must be a positive whole number")
    if value > MAX_INT:
        raise ValueError(f"must be at most {MAX_INT}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value < 0:
        raise ValueError("must be zero or a positive whole number")
    if value > MAX_INT:
        raise ValueError(f"must be at most {MAX_INT}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number between 0 and 1") from None
    if not 0.0 < value < 1.0 or value != value:
        raise ValueError("must be a number between 0 and 1 (exclusive)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number")
    return value


def boolean(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise ValueError("must be a TCP port between 0 and 65535")
    return value


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = str(text).strip().lower()
        if t not in options:
            raise ValueError("must be one of " + ", ".join(options))
        return t
    return parse


def non_negative_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be zero or a positive number")
    return value


def path(text: str) -> str:
    text = str(text).strip()
    if not text:
        raise ValueError("must be a path")
    return os.path.abspath(os.path.expanduser(text))


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def model_ref(text: str) -> str:
    """A model directory (made absolute) or a Hugging Face id <owner>/<name> that names no local path."""
    t = str(text).strip()
    if not t:
        raise ValueError("must be a model directory or a Hugging Face id <owner>/<name>")
    if HUB_ID.fullmatch(t) and not os.path.exists(t):
        return t
    return path(t)


def is_hub_id(value: str | None) -> bool:
    return bool(value) and not os.path.isabs(value) and bool(HUB_ID.fullmatch(value))


def directory(text: str) -> str:
    text = str(text).strip()
    if not text:
        raise ValueError("must be a directory path")
    return os.path.abspath(os.path.expanduser(text))


def context(text: str) -> int:
    """Tokens: 262144, 256k or 256K (x1024)."""
    t = str(text).strip().lower()
    scale = 1024 if t.endswith("k") else 1
    value = positive_int(t[:-1] if scale > 1 else t) * scale
    return value


def mtp(text: str) -> int:
    value = non_negative_int(text)
    if value > MTP_MAX:
        raise ValueError(f"must be between 0 and {MTP_MAX}")
    return value


def backend(text: str) -> str:
    return choice(*(b.lower() for b in BACKENDS))(text).upper()


def dtype(text: str) -> str | None:
    value = choice("auto", "half", "float16", "bfloat16")(text)
    return None if value == "auto" else ("half" if value == "float16" else value)


def kv_dtype(text: str) -> str | None:
    return choice(*KV_DTYPES)(text)


def demo_layers(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"must be a positive multiple of {FULL_ATTENTION_INTERVAL}") from None
    if value <= 0 or value % FULL_ATTENTION_INTERVAL:
        raise ValueError(f"must be a positive multiple of {FULL_ATTENTION_INTERVAL} "
                         f"(every {FULL_ATTENTION_INTERVAL}th layer is full attention)")
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


# ---- THE TABLE: every setting of the appliance, once ------------------------------------------
# Setting(name, help, parser, default, flag=..., env=...); the flag defaults to --<name-with-dashes>,
# the variable to TURINGBOX_<NAME>. The order within a group is the order of the flags in --help.

_PLAN = (   # turingbox plan / serve / warmup: what the planner reads (planner.DEFAULTS is these defaults)
    # the model and the GPUs
    Setting("model", "model directory (config.json, tokenizer, weights) or a Hugging Face id <owner>/<name>, "
            "downloaded into models_dir; unset: the built-in demo model", model_ref),
    Setting("model_revision", "Hugging Face revision (branch, tag or commit) of a hub id model (default: main)",
            str),
    Setting("gpus_json", "read the GPU inventory from this JSON file instead of NVML (simulation)", path),
    # parallelism and speculative decoding
    Setting("tensor_parallel_size", "tensor-parallel GPUs (default: the largest legal count of identical GPUs)",
            positive_int, env="TURINGBOX_TP"),
    Setting("objective", "what to optimise when the model fits in fewer GPUs than are visible: latency (one "
            "wide TP group) or throughput (data-parallel replicas)", choice(*OBJECTIVES), default="latency"),
    Setting("mtp", f"MTP speculative tokens, 0-{MTP_MAX} (default: by architecture and TP)", mtp),
    # context, batching and memory
    Setting("max_model_len", "context length in tokens, e.g. 262144 or 256k (default: the model's; "
            "shrunk to what fits)", context),
    Setting("max_num_seqs", "concurrent sequences, each able to reach max_model_len (default: what fits)",
            positive_int),
    Setting("max_num_batched_tokens", "tokens per engine step (prefill chunk)", positive_int),
    Setting("gpu_memory_utilization", "fraction of each GPU vLLM may budget (default: from free memory)", fraction),
    # kernels
    Setting("kv_cache_dtype", "KV cache dtype: " + ", ".join(KV_DTYPES) + " (default: fp8)", kv_dtype),
    Setting("attention_backend", "attention backend: " + ", ".join(BACKENDS) + " (default: by architecture)",
            backend),
    Setting("dtype", "activation dtype: auto, half, bfloat16 (sm_75: half)", dtype),
    Setting("gdn_prefill_backend", "GDN prefill kernels: triton or flashinfer (sm_90 only)",
            choice(*GDN_PREFILL_BACKENDS)),
    Setting("gdn", "GDN path in the workers: auto, turbo (turingbox's sm_75 kernels) or vllm",   # plugin
            choice(*GDN_PATHS), default="auto"),
    Setting("enforce_eager", "no CUDA graphs (debugging; decode is several times slower)", boolean, default=False),
    Setting("prefix_caching", "prefix caching (with --mamba-cache-mode align for GDN models)", boolean,
            default=True),
    # reading the weights
    Setting("load_format", "how vLLM reads a checkpoint's weights: " + ", ".join(LOAD_FORMATS) + " (auto: "
            "runai_streamer at TP=1 where runai-model-streamer is installed, else safetensors-prefetch; vLLM's own "
            "auto for a model directory with only .bin/.pt weights; the demo model has no weights and always loads "
            "dummy ones)", choice(*LOAD_FORMATS), default="auto"),
    # what clients see, and the least context worth serving
    Setting("served_model_name", "model name clients use (default: the model directory's name)", str),
    Setting("min_model_len", "refuse to plan when the context would shrink below this many tokens", context,
            default=4096),
    # the plugin in vLLM's workers (handed on: PLUGIN_CONFIG, PLUGIN_ENV)
    Setting("strict_warmup", "fail start-up when any kernel compiles after warmup", boolean, default=True),
    Setting("require_plugin", "fail start-up when the turingbox vLLM plugin is not active in the workers",
            boolean, default=True),
    Setting("benchmark_mode", "plugin benchmark mode (synthetic MTP acceptance for dummy weights)", boolean,
            default=False),
    Setting("runtime_dir", "directory where workers write their status files", path,
            default_factory=lambda: os.path.join(tempfile.gettempdir(), "turingbox-runtime")),
    Setting("autotune_compile_threads", "threads per worker that compile a Triton autotuning's configs at once "
            "before timing them (default: the CPUs per GPU worker, at most 16; 1: one by one, as Triton does)",
            positive_int),
)

_DEMO = (   # the built-in demo model (turingbox plan/serve without --model, turingbox model demo)
    Setting("models_dir", "directory where models (the demo model included) are kept", directory,
            default_factory=lambda: os.path.join(os.path.expanduser("~"), ".cache", "turingbox", "models")),
    Setting("demo_layers", "demo model: number of layers (a positive multiple of 4; default: all 64 of Qwen3.6-27B)",
            demo_layers),
    Setting("demo_awq", "demo model: add the AWQ INT4 quantization config of the seed", boolean, default=False),
)

_SERVE = (  # turingbox serve: the sidecar in front of vLLM
    # listening
    Setting("host", "address the sidecar listens on", str, "0.0.0.0"),
    Setting("port", "public port of the sidecar (health, metrics, /v1 proxy)", port, 8000),
    Setting("upstream_port", "loopback port for vLLM itself; 0 picks a free one", port, 0),
    # access
    Setting("api_key", "API key required on /v1/* and /turingbox/plan as 'Authorization: Bearer "
            "KEY' (unset or empty: off, /v1 open, logged as a warning)", api_key, None, secret=True),
    Setting("metrics_require_key", "also require the API key on /metrics", boolean, False),
    # stopping and starting
    Setting("drain_grace_seconds", "on SIGTERM, how long in-flight requests may take to finish",
            non_negative_float, 30.0),
    Setting("vllm_stop_grace_seconds", "how long vLLM gets between SIGTERM and SIGKILL", non_negative_float, 15.0),
    Setting("startup_timeout_seconds", "give up when vLLM is not answering after this long", positive_float, 3600.0),
    # request limits
    Setting("max_request_bytes", "largest request body the proxy accepts", positive_int, 32 * 1024 * 1024),
    Setting("max_header_bytes", "largest request head (request line and headers) the sidecar "
            "accepts; larger ones get 431", positive_int, 64 * 1024),
    Setting("client_timeout_seconds", "longest a client may take to send its request head, and "
            "to send each part of its body (then 408)", positive_float, 60.0),
    # admission: what one request may ask for, checked before it reaches vLLM (400/429 in vLLM's error shape)
    Setting("max_n", "largest n / best_of / beam width one request may ask for (default: the plan's "
            "max_num_seqs)", positive_int, None),
    Setting("max_tokens", "ceiling on a request's max_tokens / max_completion_tokens / max_output_tokens "
            "(default: the plan's max_model_len)", positive_int, None),
    Setting("default_max_tokens", "max_tokens given to a request that sends none (default: from the plan, "
            "at most max_tokens)", positive_int, None),
    Setting("max_total_tokens", "largest prompt + n x max_tokens one request may ask for (default: from the "
            "plan)", positive_int, None),
    Setting("max_concurrent_requests", "requests in flight at once over all clients; more get 429 with "
            "Retry-After (default: from the plan)", positive_int, None),
    Setting("max_concurrent_per_key", "requests in flight at once per API key (or client address without "
            "a key); more get 429 (default: max_concurrent_requests)", positive_int, None),
    Setting("request_timeout_seconds", "longest one request may run before it is aborted in vLLM and "
            "answered 504 (0: no limit)", non_negative_float, 900.0),
    # readiness and liveness
    Setting("active_warmup", "send real requests through vLLM before reporting ready", boolean, True),
    Setting("upstream_probe_seconds", "after ready, how often vLLM's /health is probed (and "
            "how long a probe may take before readiness turns 503)", positive_float, 5.0),
    Setting("exit_linger_seconds", "after vLLM died or startup failed (no plan, vLLM not ready), "
            "how long the sidecar keeps answering (liveness 503) before exiting", non_negative_float, 2.0),
    # the engine and the plan it runs
    Setting("vllm_command", "program that runs vLLM (default: this Python with "
            "-m vllm.entrypoints.cli.main); for tests and custom builds", command_line, None),
    Setting("plan_file", "serve this plan JSON (from `turingbox plan --json`) instead of "
            "planning now", str, None),
)

_CACHE = (  # the compile cache (serve, warmup, cache show/verify/seed)
    Setting("cache_dir", "cache root holding one compile-cache entry per plan fingerprint (a volume in "
            "compose/Kubernetes)", default_factory=lambda: os.path.join(os.path.expanduser("~"), ".cache", "turingbox")),
    Setting("baked_cache_dir", "read-only cache root baked into the image, consulted before the cache volume"),
    Setting("cache_lock_wait", "seconds to wait for another process's writer lock on the same entry before "
            "using a private copy", positive_float, 20.0),
    Setting("aot_triton_dir", "Triton cache compiled ahead of time at image build (python -m "
            "turingbox_warmup.image.triton_aot), copied into the triton/ folder of every new cache entry"),
    Setting("aot_flashinfer_dir", "FlashInfer modules built ahead of time at image build (python -m "
            "turingbox_warmup.image.flashinfer_aot), copied into the flashinfer/ folder of every new cache entry"),
    Setting("aot_modelinfos_dir", "vLLM's model-class facts computed at image build (python -m "
            "turingbox_warmup.image.modelinfos), copied into the vllm/ folder of every new cache entry"),
    # off: session 27's kvcut (H100) showed the graphs still load and vLLM's ~2.5 s profile skipped, but no shorter
    # start: the kernels the profile loaded load later instead (docs/startup.md "Session 27")
    Setting("kv_size_from_cache", "start vLLM with the KV cache size (--kv-cache-memory-bytes) that an earlier start "
            "with the same arguments and environment measured in this cache entry, so vLLM skips its CUDA-graph "
            "memory profile (a start given it that fails drops it); off: vLLM profiles memory at every start "
            "(starts record the size either way)", boolean, False),
)

_WARMUP = (  # turingbox warmup / cache seed
    Setting("warmup_timeout", "seconds each vLLM start of a seeding run may take to reach ready (compiles, "
            "autotuning and JIT included; a seed whose first start compiled starts vLLM a second time)",
            positive_float, 1800.0),
)

SETTINGS: tuple[Setting, ...] = _PLAN + _DEMO + _SERVE + _CACHE + _WARMUP


def _names(group: tuple[Setting, ...]) -> tuple[str, ...]:
    return tuple(s.name for s in group)


REGISTRY: dict[str, Setting] = {s.name: s for s in SETTINGS}
assert len(REGISTRY) == len(SETTINGS), "a setting is declared twice"
assert len({s.env_name for s in SETTINGS}) == len(SETTINGS), "two settings share a variable"

# Every other TURINGBOX_* name the project reads: not settings of the appliance (no flag), each with who reads
# it. `turingbox serve`/`plan` accept these in their environment; any other TURINGBOX_* name is a typo.
OTHER_VARIABLES: dict[str, str] = {
    # build and development tools, never read by `turingbox serve` (declared, and read, in config/envs.py)
    **{name: why for name, why in envs.VARIABLES.items() if name.startswith("TURINGBOX_")},
    "TURINGBOX_VERSION": "the image's label, set at build",
    # compose's own interpolation variables (docker compose reads them, not the appliance)
    "TURINGBOX_IMAGE": "compose: the image tag",
    "TURINGBOX_BIND_ADDRESS": "compose: the host address the port is published on",
    "TURINGBOX_GPU_COUNT": "compose: how many GPUs the service reserves",
}
assert not set(OTHER_VARIABLES) & {s.env_name for s in SETTINGS}, "a setting is also listed as another variable"

# The test harness's and the GPU session scripts' own variables (tests/, tools/): the appliance never reads them,
# but they are in the environment the tests and sessions run `turingbox` in (tests/conftest.py keeps the
# TURINGBOX_TEST_* ones), so they are no typo. tests/turingbox/config/test_doc.py keeps this list complete.
HARNESS_PREFIX = "TURINGBOX_TEST_"
HARNESS_VARIABLES: dict[str, str] = {
    "TURINGBOX_BAKE_TEST_IMAGE": "tests/turingbox_warmup: the image the bake tests run",
    "TURINGBOX_VLLM_CPU": "tests/turingbox/plan, tools/ci: vLLM's Python code installed for the CPU tests",
    "TURINGBOX_SKIP_GDN_BUILD": "bench/gpu/bootstrap.sh: skip building the sm_75 GDN library",
    "TURINGBOX_CAPTURE_DIR": "bench/gpu/cache_aot_check.py: where its engines record kernel launches",
    "TURINGBOX_DEMO_DIR": "bench/gpu/crash_repro_cpu.py: the demo model it loads",
}


# Names that appear in the tree but are no variable of anyone: examples of what the CLI refuses or the plugin ignores
# (the README's and the tests' typos, a retired name). Never read; the CLI refuses them like any unknown name.
EXAMPLES_OF_NO_VARIABLE: dict[str, str] = {
    "TURINGBOX_MAX_MODEL_LENGTH": "README.md, tests: the typo of TURINGBOX_MAX_MODEL_LEN the CLI refuses",
    "TURINGBOX_ZZZ": "tests/turingbox/cli/test_settings.py: a name close to no setting",
    "TURINGBOX_PLUGIN": "tests/turingbox_plugin: a retired name, which must activate nothing in the plugin",
}


def unknown_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """TURINGBOX_* names in the environment that are neither a setting nor another known variable, each with
    the closest known name (None when nothing is close): the typos a person makes. Lower case counts
    (turingbox_mtp): variable names are case-sensitive, so that one is ignored as surely as a misspelling."""
    import difflib
    env = envs.process_environment() if env is None else env
    prefix = "TURINGBOX_"
    known = {s.env_name for s in SETTINGS} | set(OTHER_VARIABLES)
    # Compare what follows the prefix: every name shares it, which would make any name "close" to any other.
    tails = {k[len(prefix):]: k for k in sorted(known)}
    out = []
    for name in sorted(n for n in env if n.upper().startswith(prefix) and n not in known
                       and n not in HARNESS_VARIABLES and not n.startswith(HARNESS_PREFIX)):
        tail = name[len(prefix):].upper()
        close = difflib.get_close_matches(tail, list(tails), n=1, cutoff=0.6)
        if not close:   # a shortened or stretched name: a letter too many, _LENGTH for _LEN
            close = [t for t in tails if tail and (tail.startswith(t) or t.startswith(tail))][:1]
        out.append((name, tails[close[0]] if close else None))
    return out


def refuse_unknown_variables(env: Mapping[str, str] | None = None) -> None:
    """UsageError (exit 2) for the first unknown TURINGBOX_* variable, naming the closest known one."""
    for name, close in unknown_variables(env):
        hint = f"; did you mean {close}?" if close else "; `turingbox settings` lists them all."
        raise UsageError(f"{name} is not a setting{hint}")


# What each command resolves (and the order of its flags in --help).
PLANNER_SETTINGS = _names(_PLAN)
DEMO_SETTINGS = _names(_DEMO)
PLAN_SETTINGS = PLANNER_SETTINGS + DEMO_SETTINGS      # turingbox plan (and serve/warmup when they plan)
SERVE_SETTINGS = _names(_SERVE)
CACHE_SETTINGS = _names(_CACHE)
WARMUP_SETTINGS = _names(_WARMUP)
LAUNCHER_SETTINGS = ("vllm_command", "vllm_stop_grace_seconds")   # serve's, read by warmup too (starts vLLM as serve)
# What make_plan fills in for a setting the caller left out (None: decide automatically).
PLANNER_DEFAULTS: dict[str, Any] = {s.name: s.default for s in _PLAN}

# ---- handed to the plugin ------------------------------------------------------------------
# The plugin (turingbox_plugin) runs in vLLM's workers and imports nothing of the appliance; what the two
# agree on is turingbox_plugin.contract. The appliance resolves these settings here, the planner turns them
# into a contract.PluginConfig, and only the results travel: in vLLM's argv as --additional-config
# '{"turingbox": {...}}' (PLUGIN_CONFIG: contract key -> the settings it comes from; () for a key no setting
# of the appliance changes, written with the contract's default), or, where vLLM would hash a volatile value
# into its compile-cache key, in the plan's env (PLUGIN_ENV: the contract's ENGINE_ENV variable -> setting).
# The plugin's variables carry its own prefix (contract.PREFIX, TBPLUGIN_): it reads no TURINGBOX_* name, so the
# appliance's settings need no removing from the environment vLLM inherits, and a setting's variable
# (TURINGBOX_RUNTIME_DIR) reaches the plugin only as the value the planner resolved, under the contract's name.
PLUGIN_CONFIG: dict[str, tuple[str, ...]] = {
    "strict_warmup": ("strict_warmup",),
    "require_plugin": ("require_plugin",),
    "gdn": ("gdn",),                                   # "auto" resolved to the GPU's path by the planner
    "num_speculative_tokens": ("mtp",),                # unset: the planner's MTP depth
    "max_num_seqs": ("max_num_seqs",),                 # unset: what fits
    "cudagraph_capture_sizes": ("max_num_seqs", "enforce_eager"),   # the planner's sizes up to max_num_seqs
    "prune_autotune": (),                              # the contract's default (on)
}
PLUGIN_ENV: dict[str, str] = dict(plugin_contract.ENGINE_ENV)
assert all(name in REGISTRY and not var.startswith("TURINGBOX_") for var, name in PLUGIN_ENV.items()), \
    "an engine variable of the plugin's contract carries no setting, or is named like a setting of the appliance"


# ---- resolution ----------------------------------------------------------------------------

def _validate(setting: Setting, raw: str, source: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as exc:
        shown = "***" if setting.secret else repr(raw)
        raise UsageError(f"{source} {shown} is invalid: {exc}.") from None


def add_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add the flags of the named settings; values stay raw strings until config.load()."""
    for name in names:
        s = REGISTRY[name]
        if s.parse is boolean:
            parser.add_argument(s.flag_name, dest=name, nargs="?", const="1", default=None,
                                help=f"{s.help} [env {s.env_name}]")
        else:
            parser.add_argument(s.flag_name, dest=name, default=None, metavar="VALUE",
                                help=f"{s.help} [env {s.env_name}]")


def redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved settings safe to log: secrets replaced by whether they are set."""
    out = {}
    for k, v in values.items():
        s = REGISTRY.get(k)
        out[k] = ("set" if v else "unset") if (s and s.secret) else v
    return out
