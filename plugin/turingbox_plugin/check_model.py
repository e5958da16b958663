"""`check-model DIR`: static compatibility of a model directory (no torch, no vLLM)."""
from __future__ import annotations

from typing import Any

from turingbox_plugin.model_config import ModelConfig, load_model_config

SUPPORTED_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                           "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM")
TP_SIZES = (1, 2, 4, 8)


def tp_legality(m: ModelConfig, tp: int) -> str | None:
    """None when tensor parallel size `tp` divides every head count, else the reason."""
    checks = [("num_attention_heads", m.num_attention_heads)]
    # KV heads may be replicated when tp > kv heads, but tp must then be a multiple of them.
    if m.num_key_value_heads % tp and tp % m.num_key_value_heads:
        return f"num_key_value_heads {m.num_key_value_heads} and TP {tp} do not divide each other"
    if m.linear_num_key_heads:
        checks += [("linear_num_key_heads", m.linear_num_key_heads),
                   ("linear_num_value_heads", m.linear_num_value_heads)]
    for name, value in checks:
        if value % tp:
            return f"{name} {value} is not divisible by TP {tp}"
    return None


def report(model_dir: str) -> dict[str, Any]:
    m = load_model_config(model_dir)
    tp = {str(t): (tp_legality(m, t) or "ok") for t in TP_SIZES}
    q = m.quantization
    notes = []
    if m.architecture not in SUPPORTED_ARCHITECTURES:
        notes.append(f"architecture {m.architecture} is not one turingbox is tuned for")
    if not m.has_mtp:
        notes.append("no MTP head: speculative decoding will be off")
    if q and q.method == "awq" and "in_proj_ba" not in q.modules_to_not_convert:
        notes.append("AWQ without in_proj_ba in modules_to_not_convert: it fails Marlin and plain AWQ (needs OC % 64)")
    return {
        "model": m.path,
        "architecture": m.architecture,
        "supported_architecture": m.architecture in SUPPORTED_ARCHITECTURES,
        "layers": m.num_hidden_layers,
        "full_attention_layers": m.num_full_attention_layers,
        "gdn_layers": m.num_linear_attention_layers,
        "mtp_layers": m.mtp_num_hidden_layers,
        "dtype": m.torch_dtype,
        "quantization": None if q is None else {"method": q.method, "bits": q.bits, "group_size": q.group_size,
                                                "modules_to_not_convert": list(q.modules_to_not_convert)},
        "heads": {"attention": m.num_attention_heads, "kv": m.num_key_value_heads,
                  "gdn_key": m.linear_num_key_heads, "gdn_value": m.linear_num_value_heads},
        "tensor_parallel": tp,
        "vision": m.has_vision,
        "demo": m.is_demo,
        "notes": notes,
    }
