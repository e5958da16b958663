"""The settings the planner reads, declared once: flag, TURINGBOX_* variable, parser and default. The
planner's defaults are these (planner.DEFAULTS is built from them), so a default is written in one place."""
from __future__ import annotations

import os
import tempfile

from turingbox import settings as S
from turingbox.plan import arch as archmod

try:   # declares models_dir / demo_layers / demo_awq; the demo writer itself is imported lazily
    from turingbox.model import demo as _demo_settings  # noqa: F401
    DEMO_SETTINGS: tuple[str, ...] = ("models_dir", "demo_layers", "demo_awq")
except ImportError:       # pragma: no cover - the demo module ships with the appliance
    DEMO_SETTINGS = ()


def _path(text: str) -> str:
    text = str(text).strip()
    if not text:
        raise ValueError("must be a path")
    return os.path.abspath(os.path.expanduser(text))


def _context(text: str) -> int:
    """Tokens: 262144, 256k or 256K (x1024)."""
    t = str(text).strip().lower()
    scale = 1024 if t.endswith("k") else 1
    value = S.positive_int(t[:-1] if scale > 1 else t) * scale
    return value


def _mtp(text: str) -> int:
    value = S.non_negative_int(text)
    if value > archmod.MTP_MAX:
        raise ValueError(f"must be between 0 and {archmod.MTP_MAX}")
    return value


def _backend(text: str) -> str:
    return S.choice(*(b.lower() for b in archmod.BACKENDS))(text).upper()


def _dtype(text: str) -> str | None:
    value = S.choice("auto", "half", "float16", "bfloat16")(text)
    return None if value == "auto" else ("half" if value == "float16" else value)


def _kv_dtype(text: str) -> str | None:
    return S.choice(*archmod.KV_DTYPES)(text)


_DECLARED = [
    S.Setting("model", "model directory (config.json, tokenizer, weights); unset: the built-in demo model", _path),
    S.Setting("gpus_json", "read the GPU inventory from this JSON file instead of NVML (simulation)", _path),
    S.Setting("tensor_parallel_size", "tensor-parallel GPUs (default: the largest legal count of identical GPUs)",
              S.positive_int, env="TURINGBOX_TP"),
    S.Setting("objective", "what to optimise when the model fits in fewer GPUs than are visible: latency (one "
              "wide TP group) or throughput (data-parallel replicas)", S.choice("latency", "throughput"),
              default="latency"),
    S.Setting("mtp", f"MTP speculative tokens, 0-{archmod.MTP_MAX} (default: by architecture and TP)", _mtp),
    S.Setting("max_model_len", "context length in tokens, e.g. 262144 or 256k (default: the model's; "
              "shrunk to what fits)", _context),
    S.Setting("max_num_seqs", "concurrent sequences, each able to reach max_model_len (default: what fits)",
              S.positive_int),
    S.Setting("max_num_batched_tokens", "tokens per engine step (prefill chunk)", S.positive_int),
    S.Setting("gpu_memory_utilization", "fraction of each GPU vLLM may budget (default: from free memory)",
              S.fraction),
    S.Setting("kv_cache_dtype", "KV cache dtype: " + ", ".join(archmod.KV_DTYPES) + " (default: fp8)", _kv_dtype),
    S.Setting("attention_backend", "attention backend: " + ", ".join(archmod.BACKENDS) + " (default: by architecture)",
              _backend),
    S.Setting("dtype", "activation dtype: auto, half, bfloat16 (sm_75: half)", _dtype),
    S.Setting("gdn_prefill_backend", "GDN prefill kernels: triton or flashinfer (sm_90 only)",
              S.choice("triton", "flashinfer")),
    S.Setting("gdn", "GDN path in the workers: auto, turbo (turingbox's sm_75 kernels) or vllm",
              S.choice("auto", "turbo", "vllm"), default="auto"),
    S.Setting("enforce_eager", "no CUDA graphs (debugging; decode is several times slower)", S.boolean, default=False),
    S.Setting("prefix_caching", "prefix caching (with --mamba-cache-mode align for GDN models)", S.boolean,
              default=True),
    S.Setting("served_model_name", "model name clients use (default: the model directory's name)", str),
    S.Setting("min_model_len", "refuse to plan when the context would shrink below this many tokens", _context,
              default=4096),
    S.Setting("strict_warmup", "fail start-up when any kernel compiles after warmup", S.boolean, default=True),
    S.Setting("require_plugin", "fail start-up when the turingbox vLLM plugin is not active in the workers",
              S.boolean, default=True),
    S.Setting("benchmark_mode", "plugin benchmark mode (synthetic MTP acceptance for dummy weights)", S.boolean,
              default=False),
    S.Setting("runtime_dir", "directory where workers write their status files", _path,
              default=os.path.join(tempfile.gettempdir(), "turingbox-runtime")),
]
for _s in _DECLARED:
    S.declare(_s)

PLAN_SETTINGS: tuple[str, ...] = tuple(s.name for s in _DECLARED) + DEMO_SETTINGS
# what make_plan fills in for a setting the caller left out
PLANNER_DEFAULTS = {s.name: s.default for s in _DECLARED}
