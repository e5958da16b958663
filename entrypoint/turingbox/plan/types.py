"""The plan as a value: `Plan`, a frozen dataclass with one typed field per key of the plan JSON.

`Plan.to_dict()` is the JSON contract (`turingbox plan --json`, `GET /turingbox/plan`, the startup log
line; docs/planning.md): the same keys in the same order as the fields below. `Plan.from_dict()` rebuilds a
Plan from that JSON (a saved plan: `serve --plan-file`, `warmup --plan-json`, `flashinfer_aot --plan-json`).

Sequences are tuples and the structured parts small frozen dataclasses (the plugin's config, the memory
breakdown); the free-form parts (the environment, the fingerprint inputs, the left-out GPUs) stay typed
Mappings, copied in and out, so a caller never shares a mutable part of a Plan.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from turingbox.errors import UsageError
from turingbox.plan import fingerprint
from turingbox.plan.memory import MemoryBreakdown
# additional_config["turingbox"]: the plugin's contract, typed once there (the plan's "plugin" key)
from turingbox_plugin.contract import PluginConfig


@dataclass(frozen=True)
class Plan:
    """One plan. The field order is the JSON key order."""
    tensor_parallel_size: int
    data_parallel_size: int
    objective: str                              # latency | throughput
    num_speculative_tokens: int                 # 0 = no MTP
    mtp_refused_parameters: tuple[str, ...]     # request parameters vLLM refuses while MTP is on
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    attention_backend: str
    dtype: str
    gdn_prefill_backend: str
    gdn_path: str
    quantization: str | None
    cudagraph_capture_sizes: tuple[int, ...]    # () with enforce_eager
    enforce_eager: bool
    prefix_caching: bool
    disable_custom_all_reduce: bool
    compute_capability: str                     # "7.5"
    gpu_name: str
    gpus: tuple[str, ...]                       # UUIDs used, in CUDA order
    gpu_indices: tuple[int, ...]
    excluded_gpus: tuple[Mapping[str, Any], ...]  # {"uuid", "index", "reason"} each
    model: str                                  # the model directory
    served_model_name: str                      # the first of vLLM's names (responses, metrics); a demo also answers to "demo"
    demo: bool
    demo_fallback: Mapping[str, Any] | None     # {"wanted", "used", "why"} when a smaller demo stands in
    load_format: str                            # how vLLM reads the weights: a key of planner.LOAD_FORMAT_ARGS
    memory: MemoryBreakdown                     # per-GPU breakdown (plan/memory.py, planner.size_memory)
    plugin: PluginConfig
    env: Mapping[str, str | None]               # None = remove the variable from vLLM's environment
    vllm_args: tuple[str, ...]                  # the exact argv after `vllm` (planner.vllm_args)
    reasons: tuple[str, ...]                    # one sentence per automatic decision
    cache_inputs: Mapping[str, Any]             # plan/fingerprint.py's fingerprint_inputs
    cache_key: str                              # compute_hash() when the plan was made

    def compute_hash(self) -> str:
        """The cache key: the hash of cache_inputs, everything of this plan that changes compiled code."""
        return fingerprint.cache_key(self.cache_inputs)

    def fingerprinted(self, software: Mapping[str, str], model_config_hash: str) -> Plan:
        """This plan with its cache_inputs (its kernel fields, GPU, `software` versions, model config hash) and
        their cache_key filled in."""
        inputs = fingerprint.fingerprint_inputs(self.to_dict(), self.gpu_name, self.compute_capability, software,
                                                model_config_hash)
        with_inputs = replace(self, cache_inputs=inputs)
        return replace(with_inputs, cache_key=with_inputs.compute_hash())

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object (a fresh copy: lists, dicts)."""
        return {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """A Plan from its JSON object. Raises ValueError naming the missing keys; unknown keys are ignored."""
        _require(d, cls, "plan")
        kw: dict[str, Any] = {f.name: copy.deepcopy(d[f.name]) for f in fields(cls)}
        for name in ("mtp_refused_parameters", "gpus", "vllm_args", "reasons"):
            kw[name] = tuple(str(x) for x in kw[name])
        for name in ("cudagraph_capture_sizes", "gpu_indices"):
            kw[name] = tuple(int(x) for x in kw[name])
        kw["excluded_gpus"] = tuple(kw["excluded_gpus"])
        kw["plugin"] = PluginConfig.from_dict(kw["plugin"])
        kw["memory"] = MemoryBreakdown.from_dict(kw["memory"])
        return cls(**kw)


def _require(d: Any, cls: type, what: str) -> None:
    if not isinstance(d, Mapping):
        raise ValueError(f"the {what} is a JSON {type(d).__name__}, not an object")
    missing = [f.name for f in fields(cls) if f.name not in d]
    if missing:
        raise ValueError(f"the {what} lacks {', '.join(missing)}")


def _to_json(v: Any) -> Any:
    if isinstance(v, (PluginConfig, MemoryBreakdown)):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {k: _to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    return v


def load_saved_plan(path: str, flag: str) -> Plan:
    """A plan saved by `turingbox plan --json` (serve's --plan-file, warmup's --plan-json); a file that is not one
    is a UsageError naming `flag` and the path."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise UsageError(f"{flag} {path!r} cannot be read ({exc.strerror or exc}).") from None
    except ValueError as exc:
        raise UsageError(f"{flag} {path!r} is not valid JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise UsageError(f"{flag} {path!r} is not a turingbox plan (a JSON object from `turingbox plan --json`).")
    inputs = data.get("cache_inputs")
    revision = inputs.get("revision", 1) if isinstance(inputs, dict) else None
    if revision is not None and revision != fingerprint.KEY_REVISION:
        # its vLLM argv and cache key are what an older turingbox planned: a hit on an entry vLLM cannot use
        raise UsageError(f"{flag} {path!r} was planned by an older turingbox (cache key revision {revision}, this "
                         f"one is {fingerprint.KEY_REVISION}); write it again with `turingbox plan --json`.")
    try:
        return Plan.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{flag} {path!r} is not a turingbox plan ({exc}); write it with "
                         "`turingbox plan --json`.") from None
