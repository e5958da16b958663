"""`turingbox plan`: inventory + model config + settings -> the plan (JSON or a readable table).

The side effects live here (NVML or --gpus-json, config.json, the demo model, package versions);
the decisions live in the pure `turingbox.plan.planner.make_plan`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import replace
from typing import Mapping

from turingbox import settings as S
from turingbox.errors import PlanError, UsageError
from turingbox.plan.types import Plan

from turingbox.settings import PLAN_SETTINGS  # noqa: E402  (re-exported: serve, doctor, tests)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", help="print the vLLM plan for this machine's GPUs (or a --gpus-json inventory)",
        description="Choose tensor parallelism, MTP depth, memory sizing and vLLM arguments for the visible "
                    "GPUs and the model; print a table with the reasons, or the plan as JSON.")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    S.add_arguments(parser, PLAN_SETTINGS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args, write_demo=False)     # `plan` only reports: it writes no model dirs
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(plan.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(format_table(plan))
    return 0


# ---- plan_from_args ----------------------------------------------------------------------------------

def _software() -> dict[str, str]:
    from turingbox.cache.fingerprint import software_versions
    return software_versions()


def _load_model(path: str):
    from turingbox_plugin.errors import ToolError
    where = f"{S.REGISTRY['model'].flag_name}/{S.REGISTRY['model'].env_name} {path}"
    if os.path.isfile(path):
        raise UsageError(f"{where} is a file; it must be the model directory that holds config.json"
                         + (f" (here {os.path.dirname(path)})." if os.path.basename(path) == "config.json" else "."))
    if not os.path.exists(path):
        raise UsageError(f"{where} does not exist; it must be the model directory that holds config.json.")
    from turingbox_plugin.contract import load_model_config
    try:
        return load_model_config(path)
    except ToolError as exc:       # one sentence either way; callers catch UsageError
        raise UsageError(str(exc)) from None


def _plan_hub(inventory, values: dict, software: dict, write: bool) -> Plan:
    """A Hugging Face id: plan from its config.json (turingbox.model.hub.model_config) for the snapshot directory
    serve keeps it in, served under the hub id unless --served-model-name says otherwise.

    write True (serve, warmup): config.json, the hub's listing and the ref go into the models volume; the weights
    follow in serve's downloading stage (hub.ensure_snapshot), after this plan showed they fit. write False
    (`turingbox plan`): nothing is written; config.json is read from the volume, or from the hub into memory, and
    the first reason says what serve would download.
    """
    import hashlib

    from turingbox.model import hub
    from turingbox.plan.planner import make_plan
    from turingbox_plugin.errors import ToolError
    from turingbox_plugin.contract import model_config_from_dict

    source = hub.model_config(values["model"], values.get("model_revision"), values["models_dir"], write=write)
    digest = hashlib.sha256(json.dumps(source.config, sort_keys=True).encode()).hexdigest()   # load_model_config's
    try:
        model = model_config_from_dict(source.config, source.path, digest)
    except ToolError as exc:
        raise UsageError(f"{values['model']}: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{values['model']}: its {hub.CONFIG_FILE} has an unexpected value ({exc}).") from None
    plan = make_plan(inventory, model, {**values, "served_model_name": values.get("served_model_name")
                                        or values["model"]}, software)
    return replace(plan, reasons=(source.note, *plan.reasons))


def plan_from_args(args: argparse.Namespace | None, env: Mapping[str, str] | None = None,
                   write_demo: bool = True) -> Plan:
    """Resolve the plan settings once, read the GPUs and the model (or the demo model), plan.

    write_demo: build the chosen demo model directory (serve and warmup need it on disk); `turingbox
    plan` passes False and plans from the demo's in-memory config.
    """
    from turingbox.gpus.inventory import read_inventory
    from turingbox.plan.planner import make_plan

    values = S.resolve(PLAN_SETTINGS, args, env)      # env None: the process environment (settings reads it)
    inventory = read_inventory(values["gpus_json"], env)
    software = _software()
    if S.is_hub_id(values["model"]):
        return _plan_hub(inventory, values, software, write=write_demo)
    if values["model"]:
        return make_plan(inventory, _load_model(values["model"]), values, software)
    return _plan_demo(inventory, values, args, env, software, write_demo)


def _demo_dir(models_dir: str, awq: bool, layers: int | None) -> str:
    from turingbox.model import demo
    if not awq and layers is None:
        return demo.default_demo_dir(models_dir)
    suffix = ("-awq" if awq else "") + (f"-{layers}l" if layers else "")
    return os.path.join(models_dir, demo.DEMO_DIR_NAME + suffix)


def _plan_demo(inventory, values: dict, args, env: Mapping[str, str] | None, software: dict,
               write_demo: bool = True) -> Plan:
    """No model configured: the demo model, in the first variant that fits these GPUs."""
    import hashlib

    from turingbox.model import demo
    from turingbox.plan.planner import make_plan
    from turingbox_plugin.contract import model_config_from_dict

    if not values.get("models_dir"):
        raise UsageError("no model is configured and TURINGBOX_MODELS_DIR is empty; set --model or --models-dir.")
    explicit = S.explicit("demo_awq", args, env) or S.explicit("demo_layers", args, env)
    if explicit:
        variants = [(bool(values.get("demo_awq")), values.get("demo_layers"))]
        why = "the demo variant set by TURINGBOX_DEMO_AWQ/TURINGBOX_DEMO_LAYERS"
    else:
        newest = max((g.sm for g in inventory.gpus), default=0)
        smaller = [(True, n) for n in (32, 16, 8, 4)]
        if newest and newest < 80:
            variants = [(True, None)] + smaller
            why = "AWQ INT4 on sm_75, as the seed served it on Turing"
        else:
            variants = [(False, None), (True, None)] + smaller
            why = "the first variant (bf16 27B, then AWQ, then fewer layers) that fits"

    def describe(awq: bool, cfg: dict) -> str:
        return f"{'AWQ INT4' if awq else 'bf16'}, {cfg['text_config']['num_hidden_layers']} layers"

    first: tuple[str, PlanError] | None = None
    for awq, layers in variants:
        target = _demo_dir(values["models_dir"], awq, layers)
        cfg = demo.make_config(awq, layers)
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
        try:
            plan = make_plan(inventory, model_config_from_dict(cfg, target, digest), values, software)
        except PlanError as exc:
            if first is None:
                first = (describe(awq, cfg), exc)
            continue
        if write_demo:
            # The files written are exactly make_config's, so the plan made from memory stands.
            target = demo.ensure_demo_model(target, awq=awq, layers=layers)
        where = target if write_demo else f"{target} (not written by `turingbox plan`; serve or demo-model builds it)"
        lead = [f"model: the built-in demo ({describe(awq, cfg)} of Qwen3.6-27B) at {where}: no model was "
                f"configured; {why}."]
        if first is not None:
            # A smaller stand-in, not the model the user gets by default: say so first.
            plan = replace(plan, demo_fallback={"wanted": first[0], "used": describe(awq, cfg),
                                                "why": str(first[1]).rstrip(".")})
            lead.insert(0, f"demo fallback: the {first[0]} demo does not fit, so this plan serves the {describe(awq, cfg)} "
                           f"stand-in ({str(first[1]).rstrip('.')}).")
        return replace(plan, reasons=(*lead, *plan.reasons))
    assert first is not None
    # The refusal carries the numbers of the demo the user would get, not of the last stand-in tried.
    raise PlanError(f"the built-in demo ({first[0]}) cannot be planned, nor any smaller stand-in: {first[1]}")


# ---- table output --------------------------------------------------------------------------------------

def format_table(plan: Plan) -> str:
    from turingbox.plan.planner import served_model_names
    m = plan.memory
    rows = [
        ("model", f"{plan.model}" + ("  (demo)" if plan.demo else "")),
        ("served as", ", ".join(served_model_names(plan))),
        ("GPUs", f"{plan.tensor_parallel_size}x {plan.gpu_name} (sm_{plan.compute_capability.replace('.', '')}), "
                 f"CUDA_VISIBLE_DEVICES={plan.env['CUDA_VISIBLE_DEVICES']}"),
        ("tensor_parallel_size", plan.tensor_parallel_size),
        ("num_speculative_tokens", plan.num_speculative_tokens),
        ("dtype / quantization", f"{plan.dtype} / {plan.quantization or 'none'}"),
        ("attention / kv cache", f"{plan.attention_backend} / {plan.kv_cache_dtype}"),
        ("GDN prefill / path", f"{plan.gdn_prefill_backend} / {plan.gdn_path}"),
        ("max_model_len", plan.max_model_len),
        ("max_num_seqs", plan.max_num_seqs),
        ("max_num_batched_tokens", plan.max_num_batched_tokens),
        ("gpu_memory_utilization", plan.gpu_memory_utilization),
        ("per GPU (GiB)", f"weights {m['weights_gib']:.2f}, activations {m['activation_gib']:.2f}, "
                          f"CUDA graphs {m['cudagraph_gib']:.2f}, KV cache {m['kv_cache_gib']:.2f}"),
        ("KV cache", f"{m['kv_cache_tokens']} tokens, block size {m['block_size']}, "
                     f"{m['max_concurrency_at_max_len']}x max_model_len"),
        ("CUDA graphs", "off (eager)" if plan.enforce_eager else
         f"{len(plan.cudagraph_capture_sizes)} sizes up to {max(plan.cudagraph_capture_sizes or [0])}"),
        ("cache_key", plan.cache_key),
    ]
    width = max(len(k) for k, _ in rows)
    out = ["turingbox plan", ""] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if plan.excluded_gpus:
        out += ["", "excluded GPUs:"] + [f"  - GPU {e['index']} {e['uuid']}: {e['reason']}" for e in plan.excluded_gpus]
    out += ["", "reasons:"] + [f"  - {r}" for r in plan.reasons]
    out += ["", "vllm " + " ".join(shlex.quote(a) for a in plan.vllm_args), ""]
    return "\n".join(out)
