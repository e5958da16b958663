"""The demo model: the Qwen3.6-27B architecture with the real tokenizer and no weights.

vLLM serves it with `--load-format dummy` (random weights), which exercises the full serving path
(GDN + full attention, MTP, tokenizer, chat template, tool and reasoning tokens) without a download.
`ensure_demo_model` is idempotent (an existing complete dir with the same options is reused) and
atomic (the dir is built next to the target and renamed into place; nothing half-written is left).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from importlib import resources
from typing import Any

from turingbox.errors import UsageError
from turingbox.model import tokenizer as demo_tokenizer
from turingbox.config import DEMO_SETTINGS, FULL_ATTENTION_INTERVAL  # noqa: F401  (re-exported)
from turingbox.config import demo_layers as _demo_layers
from turingbox_plugin.contract import DEMO_MARKER  # the key in config.json that marks a demo model

DEMO_SOURCE = "qwen3.6-27b"
DEMO_DIR_NAME = "turingbox-demo-qwen3.6-27b"
DEMO_FORMAT_KEY = "turingbox_demo_format"
# Bump when the written files change shape, so existing demo dirs are rebuilt.
DEMO_FORMAT_VERSION = 1
TRANSFORMERS_FORMAT_VERSION = "5.0.0"     # the files follow transformers 5 (readable by 4.x too)

AWQ_QUANTIZATION_CONFIG = {
    "quant_method": "awq",
    "bits": 4,
    "group_size": 128,
    "zero_point": True,
    "version": "gemm",
    # vLLM 0.21 cannot quantize these: the vision MLP is not group-aligned and in_proj_ba
    # (2 x value heads per rank) fails Marlin and plain AWQ alike (seen on a GPU).
    "modules_to_not_convert": ["visual", "mtp", "in_proj_ba"],
}

# Files a complete demo dir holds (config.json last: it is what marks the dir as ours).
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
DEMO_FILES = demo_tokenizer.TOKENIZER_FILES + PROCESSOR_FILES + ("generation_config.json", "config.json")

# models_dir / demo_layers / demo_awq are declared in turingbox.config (DEMO_SETTINGS).


def default_demo_dir(models_dir: str) -> str:
    return os.path.join(models_dir, DEMO_DIR_NAME)


def base_config() -> dict[str, Any]:
    """The Qwen3.6-27B config.json shipped in package data."""
    text = resources.files("turingbox").joinpath("data", f"{DEMO_SOURCE}.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate_layers(layers: int | None, setting: str = "--layers") -> int | None:
    """None (keep all layers) or a positive multiple of 4; anything else -> UsageError naming the setting."""
    if layers is None:
        return None
    if isinstance(layers, bool) or not isinstance(layers, int):
        raise UsageError(f"{setting} {layers!r} is invalid: must be a positive multiple of "
                         f"{FULL_ATTENTION_INTERVAL}.")
    try:
        return _demo_layers(str(layers))
    except ValueError as exc:
        raise UsageError(f"{setting} {layers!r} is invalid: {exc}.") from None


def demo_marker(awq: bool, layers: int) -> dict[str, Any]:
    return {"source": DEMO_SOURCE, "layers": layers, "awq": bool(awq)}


def make_config(awq: bool = False, layers: int | None = None) -> dict[str, Any]:
    """config.json for the demo: PURE (the architecture, scaled to `layers`, plus the marker)."""
    layers = validate_layers(layers)
    cfg = copy.deepcopy(base_config())
    text = cfg["text_config"]
    full_layers = int(text["num_hidden_layers"])
    n = full_layers if layers is None else layers
    interval = int(text.get("full_attention_interval") or FULL_ATTENTION_INTERVAL)
    text["num_hidden_layers"] = n
    text["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                           for i in range(n)]
    if awq:
        cfg["quantization_config"] = copy.deepcopy(AWQ_QUANTIZATION_CONFIG)
    cfg[DEMO_MARKER] = demo_marker(awq, n)
    cfg[DEMO_FORMAT_KEY] = DEMO_FORMAT_VERSION
    # Without it transformers 5.x takes a local tokenizer for a possibly broken Mistral one and warns.
    cfg.setdefault("transformers_version", TRANSFORMERS_FORMAT_VERSION)
    return cfg


def generation_config() -> dict[str, Any]:
    specials = demo_tokenizer.special_tokens()
    eos = specials[demo_tokenizer.EOS_TOKEN]
    pad = specials[demo_tokenizer.PAD_TOKEN]
    # Qwen3's recommended thinking-mode sampling; vLLM uses these as request defaults.
    return {"bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad,
            "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": TRANSFORMERS_FORMAT_VERSION}


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_demo_files(out_dir: str, config: dict[str, Any], tokenizer_cache_parent: str | None) -> None:
    """Write every demo file into the existing out_dir; config.json goes last."""
    demo_tokenizer.copy_tokenizer_files(out_dir, tokenizer_cache_parent)
    for name in PROCESSOR_FILES:
        data = resources.files("turingbox").joinpath("data", name).read_bytes()
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    _write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
    _write_json(os.path.join(out_dir, "config.json"), config)


def _read_config(model_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def read_marker(model_dir: str) -> dict[str, Any] | None:
    """The demo marker of model_dir's config.json, or None when it is not a (readable) demo dir."""
    marker = _read_config(model_dir).get(DEMO_MARKER)
    return marker if isinstance(marker, dict) else None


def is_complete_demo(model_dir: str, awq: bool, layers: int) -> bool:
    cfg = _read_config(model_dir)
    return (cfg.get(DEMO_MARKER) == demo_marker(awq, layers)
            and cfg.get(DEMO_FORMAT_KEY) == DEMO_FORMAT_VERSION
            and all(os.path.isfile(os.path.join(model_dir, name)) for name in DEMO_FILES))


def _replaceable(model_dir: str) -> bool:
    """Only our own demo dirs (or an empty dir) may be replaced: never delete someone's model."""
    if not os.path.lexists(model_dir):
        return True
    if not os.path.isdir(model_dir) or os.path.islink(model_dir):
        return False
    return read_marker(model_dir) is not None or not os.listdir(model_dir)


def ensure_demo_model(target_dir: str, awq: bool = False, layers: int | None = None) -> str:
    """Build the demo model at target_dir unless a complete one with the same options is there.

    Returns the absolute dir. Raises UsageError (one sentence) on bad options or when target_dir
    holds something that is not a turingbox demo model.
    """
    from filelock import FileLock

    layers = validate_layers(layers)
    target = os.path.abspath(os.path.expanduser(str(target_dir)))
    config = make_config(awq, layers)
    n = config[DEMO_MARKER]["layers"]
    if is_complete_demo(target, awq, n):
        return target
    parent, name = os.path.split(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the models directory {parent} ({exc.strerror}).") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"the models directory {parent} is not writable, so the demo model "
                         f"(layers={n}, awq={bool(awq)}) cannot be built there.")
    with FileLock(os.path.join(parent, f".{name}.lock")):
        if is_complete_demo(target, awq, n):      # built by another process while we waited
            return target
        if not _replaceable(target):
            raise UsageError(f"{target} exists and is not a turingbox demo model; "
                             "choose another directory for the demo model.")
        tmp = tempfile.mkdtemp(prefix=f".{name}.build-", dir=parent)
        old = None
        try:
            write_demo_files(tmp, config, tokenizer_cache_parent=parent)
            os.chmod(tmp, 0o755)
            if os.path.lexists(target):
                old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
                os.rename(target, os.path.join(old, name))
            os.rename(tmp, target)
        except BaseException:
            if old is not None and not os.path.lexists(target):
                os.rename(os.path.join(old, name), target)   # put the previous demo back
            raise
        finally:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return target


def prebuild_tokenizer(parent_dir: str) -> str:
    """Build the tokenizer cache used by demo models under parent_dir (e.g. at image build time)."""
    return demo_tokenizer.ensure_tokenizer_cache(os.path.abspath(os.path.expanduser(parent_dir)))
