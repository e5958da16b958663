"""Substitute turingbox's GDN kernels into vLLM 0.21 (worker processes only).

Substitution point: `PluggableLayer.register_oot(name="GatedDeltaNetAttention")` (vLLM 0.21's
`GatedDeltaNetAttention` is a PluggableLayer; `PluggableLayer.__new__` instantiates the
registered out-of-tree class instead). The subclass
  * replaces the layer's `chunk_gated_delta_rule` op (prefill, including vLLM's own warmup call)
    with the tensor-core prefill, and
  * handles pure decode batches (spec decode with k+1 tokens, or plain decode) itself:
    vLLM's causal_conv1d_update, then one launch of the fused gating + recurrent kernel that
    writes straight into `core_attn_out`.
Mixed batches (prefill + spec decode in one step) keep vLLM's path for the decode part while the
prefill part still uses the tensor-core kernel. `install()` must run before the model is built.

Mode: `install("turbo")` or `install("vllm")`, as resolved once by activation.resolve_settings.
`install` returns True only when the layer is substituted; otherwise it logs one loud line and
returns False; `last_status()` tells why.
"""

from __future__ import annotations

import logging
import os
import threading

from . import library, ops

MODES = ("turbo", "vllm")
LAYER_NAME = "GatedDeltaNetAttention"

log = logging.getLogger("turingbox.gdn")
_lock = threading.Lock()
_status: dict = {"installed": False, "mode": None, "reason": "install() not called"}


def last_status() -> dict:
    return dict(_status)


def check_mode(mode: str | None) -> str:
    """The resolved mode (activation.PluginSettings.gdn_path), never re-read from the environment."""
    chosen = (mode or "vllm").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"gdn mode must be one of {', '.join(MODES)}, not {chosen!r}.")
    return chosen


def _set(installed: bool, mode: str | None, reason: str) -> bool:
    _status.update(installed=installed, mode=mode, reason=reason)
    if installed:
        log.info("turingbox GDN: %s", reason)
    elif mode == "turbo":
        log.warning("turingbox GDN turbo path NOT active: %s", reason)
    return installed


def install(mode: str | None = "turbo") -> bool:
    """Register the turbo GDN layer with vLLM. Re-entrant; never initialises CUDA."""
    with _lock:
        try:
            chosen = check_mode(mode)
        except ValueError as exc:
            return _set(False, None, str(exc))
        if chosen == "vllm":
            return _set(False, "vllm", "vLLM's GDN kernels requested")
        ok, why = library.library_status()
        if not ok:
            return _set(False, "turbo", why)
        try:
            from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
            from vllm.model_executor.layers.mamba import gdn_linear_attn
        except Exception as exc:  # vLLM missing or a different layout
            return _set(False, "turbo", f"vLLM's GDN layer cannot be imported ({exc})")
        if not hasattr(gdn_linear_attn, LAYER_NAME):
            return _set(False, "turbo", f"this vLLM has no {LAYER_NAME} layer")
        existing = op_registry_oot.get(LAYER_NAME)
        if existing is not None:
            if getattr(existing, "_turingbox", False):
                return _set(True, "turbo", "turbo GDN layer already registered")
            return _set(False, "turbo", f"{LAYER_NAME} is already replaced by {existing.__module__}")
        cls = _make_layer_class(gdn_linear_attn.GatedDeltaNetAttention)
        PluggableLayer.register_oot(cls, name=LAYER_NAME)
        return _set(True, "turbo", f"registered {cls.__qualname__} for {LAYER_NAME} ({why})")


def _make_layer_class(base):
    import torch
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

    class TurboChunkGatedDeltaRule(torch.nn.Module):
        """ChunkGatedDeltaRule's forward signature, backed by the tensor-core prefill; shapes or
        dtypes the kernels do not cover go to vLLM's op."""

        def __init__(self, fallback):
            super().__init__()
            self.fallback = fallback

        def forward(self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                    chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=True,
                    core_attn_out=None):
            if (q.shape[-1] != ops.HEAD_DIM or v.shape[-1] != ops.HEAD_DIM
                    or q.dtype not in (torch.float16, torch.bfloat16)):
                return self.fallback(
                    q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                    chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out,
                )
            return ops.chunk_gated_delta_rule(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out,
            )

    class TuringboxGatedDeltaNetAttention(base):
        _turingbox = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.chunk_gated_delta_rule = TurboChunkGatedDeltaRule(self.chunk_gated_delta_rule)
            self._turbo_decode = self.head_k_dim == ops.HEAD_DIM and self.head_v_dim == ops.HEAD_DIM

        def _forward_core(self, mixed_qkv, b, a, core_attn_out):
            md = get_forward_context().attn_metadata
            if md is None or not self._turbo_decode:
                return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
            md = md[self.prefix]
            spec_only = (
                md.spec_sequence_masks is not None and md.num_prefills == 0 and md.num_decodes == 0
            )
            plain_decode = (
                md.spec_sequence_masks is None and md.num_prefills == 0 and md.num_decodes > 0
            )
            if not (spec_only or plain_decode) or self.kv_cache[1].dtype != torch.float32:
                return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
            conv_state = (
                self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
            )
            ssm_state = self.kv_cache[1]
            n = md.num_actual_tokens
            mixed_qkv, a, b = mixed_qkv[:n], a[:n], b[:n]
            conv_weights = self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))
            if spec_only:
                idx = md.spec_state_indices_tensor
                x = causal_conv1d_update(
                    mixed_qkv, conv_state, conv_weights, self.conv1d.bias, self.activation,
                    conv_state_indices=idx[:, 0][: md.num_spec_decodes],
                    num_accepted_tokens=md.num_accepted_tokens,
                    query_start_loc=md.spec_query_start_loc,
                    max_query_len=idx.size(-1), validate_data=False,
                )
                cu = md.spec_query_start_loc[: md.num_spec_decodes + 1]
                accepted = md.num_accepted_tokens
            else:
                idx = md.non_spec_state_indices_tensor
                x = causal_conv1d_update(
                    mixed_qkv, conv_state, conv_weights, self.conv1d.bias, self.activation,
                    conv_state_indices=idx[:n], validate_data=True,
                )
                cu = md.non_spec_query_start_loc[: md.num_decodes + 1]
                accepted = None
            kd = self.key_dim // self.tp_size
            # Strided views of the conv output: the kernel takes token/head strides, no copies.
            q = x[:, :kd].unflatten(-1, (-1, self.head_k_dim)).unsqueeze(0)
            k = x[:, kd : 2 * kd].unflatten(-1, (-1, self.head_k_dim)).unsqueeze(0)
            v = x[:, 2 * kd :].unflatten(-1, (-1, self.head_v_dim)).unsqueeze(0)
            ops.fused_sigmoid_gating_delta_rule_update(
                A_log=self.A_log, a=a, b=b, dt_bias=self.dt_bias, q=q, k=k, v=v,
                initial_state=ssm_state, inplace_final_state=True, cu_seqlens=cu,
                ssm_state_indices=idx, num_accepted_tokens=accepted,
                use_qk_l2norm_in_kernel=True, out=core_attn_out[:n].unsqueeze(0),
            )

    return TuringboxGatedDeltaNetAttention
