"""Static facts about a model directory's config.json, shared by the planner and check-model.

Pure: reads JSON only (no torch, no transformers, no vLLM), so it runs anywhere.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from turingbox_plugin.errors import ToolError

DEMO_MARKER = "turingbox_demo"  # key in config.json written by `turingbox demo-model`


@dataclass(frozen=True)
class Quantization:
    method: str                  # "awq", "gptq", "fp8", ...
    bits: int                    # weight bits (16 when unknown)
    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    path: str
    architecture: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    layer_types: tuple[str, ...]                  # "full_attention" / "linear_attention" per layer
    # Gated DeltaNet (linear attention) geometry; 0 when the model has none.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: str = "float32"
    mtp_num_hidden_layers: int = 0
    torch_dtype: str = "bfloat16"
    quantization: Quantization | None = None
    has_vision: bool = False
    is_demo: bool = False
    num_experts: int = 0                         # routed experts, read as vLLM 0.21 reads them; 0: a dense model
    config_hash: str = ""                        # sha256 of the canonical config.json
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_full_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "full_attention")

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def is_moe(self) -> bool:
        """vLLM's ModelConfig.is_moe: it keeps MoE data-parallel engines in lockstep, dense ones independent."""
        return self.num_experts > 0

    @property
    def has_mtp(self) -> bool:
        return self.mtp_num_hidden_layers > 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra", None)
        return d


def _require(cfg: dict, key: str, where: str) -> Any:
    if key not in cfg:
        raise ToolError(f"{where} has no '{key}'; it is not a config.json this tool understands.")
    return cfg[key]


def load_model_config(model_dir: str) -> ModelConfig:
    """Parse `model_dir/config.json`; raise ToolError (exit 2, one sentence) when it is unusable."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isdir(model_dir):
        raise ToolError(f"model directory {model_dir} does not exist.")
    if not os.path.isfile(path):
        raise ToolError(f"model directory {model_dir} has no config.json.")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        cfg = json.loads(raw)
    except (OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolError(f"{path} is not valid JSON ({reason}).") from None
    if not isinstance(cfg, dict):
        raise ToolError(f"{path} does not hold a JSON object.")
    try:
        return model_config_from_dict(cfg, model_dir, hashlib.sha256(
            json.dumps(cfg, sort_keys=True).encode()).hexdigest())
    except ToolError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ToolError(f"{path} has an unexpected value ({exc}).") from None


# vLLM 0.21's ModelArchConfigConvertor.get_num_experts: the first of these names in the text config, else the
# largest n_routed_experts of a "moe" block in block_configs.
EXPERT_NAMES = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


def num_experts(text: dict) -> int:
    n = next((text[k] for k in EXPERT_NAMES if k in text), 0)      # vLLM's getattr_iter: the first name present
    if isinstance(n, list):
        n = n[0] if n else 0
    if not n:
        n = max((int(b.get("n_routed_experts") or 0) for b in text.get("block_configs") or ()
                 if isinstance(b, dict) and b.get("block_type") == "moe"), default=0)
    return int(n or 0)


def model_config_from_dict(cfg: dict, model_dir: str, config_hash: str) -> ModelConfig:
    where = os.path.join(model_dir, "config.json")
    text = cfg.get("text_config") or cfg          # multimodal wrappers keep the LM in text_config
    archs = cfg.get("architectures") or ["unknown"]
    heads = int(_require(text, "num_attention_heads", where))
    hidden = int(_require(text, "hidden_size", where))
    layers = int(_require(text, "num_hidden_layers", where))
    head_dim = int(text.get("head_dim") or hidden // heads)
    layer_types = tuple(text.get("layer_types") or ["full_attention"] * layers)
    if len(layer_types) != layers:
        raise ToolError(f"{where} lists {len(layer_types)} layer_types for {layers} layers.")
    q = cfg.get("quantization_config") or text.get("quantization_config")
    quant = None
    if q:
        quant = Quantization(
            method=str(q.get("quant_method", "unknown")).lower(),
            bits=int(q.get("bits") or q.get("w_bit") or (8 if "fp8" in str(q.get("quant_method")) else 16)),
            group_size=int(q.get("group_size") or q.get("q_group_size") or 0),
            modules_to_not_convert=tuple(q.get("modules_to_not_convert") or ()),
        )
    positive = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads}
    for k, v in positive.items():
        if v <= 0:
            raise ToolError(f"{where} has {k} = {v}; it must be positive.")
    return ModelConfig(
        path=os.path.abspath(model_dir),
        architecture=str(archs[0]),
        model_type=str(cfg.get("model_type", text.get("model_type", "unknown"))),
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        vocab_size=int(_require(text, "vocab_size", where)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=int(text.get("max_position_embeddings") or 4096),
        layer_types=layer_types,
        linear_num_key_heads=int(text.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(text.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(text.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(text.get("linear_value_head_dim") or 0),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim") or 0),
        mamba_ssm_dtype=str(text.get("mamba_ssm_dtype") or "float32"),
        mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0),
        torch_dtype=str(text.get("dtype") or text.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16"),
        quantization=quant,
        has_vision="vision_config" in cfg,
        is_demo=bool(cfg.get(DEMO_MARKER)),
        num_experts=num_experts(text),
        config_hash=config_hash,
        extra={"raw": cfg},
    )
