"""The demo-model choice: no model configured, so plan the built-in demo model in the first variant that fits
the GPUs (bf16 27B, then AWQ INT4, then fewer layers; AWQ first on sm_75), or the variant the operator set."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace

from turingbox.config import DemoSettings, PlanSettings
from turingbox.errors import PlanError, UsageError
from turingbox.model import demo
from turingbox.plan.planner import make_plan
from turingbox.plan.types import Plan
from turingbox_plugin.contract import model_config_from_dict


def demo_dir(models_dir: str, awq: bool, layers: int | None) -> str:
    if not awq and layers is None:
        return demo.default_demo_dir(models_dir)
    suffix = ("-awq" if awq else "") + (f"-{layers}l" if layers else "")
    return os.path.join(models_dir, demo.DEMO_DIR_NAME + suffix)


def plan_demo(inventory, settings: PlanSettings, demo_settings: DemoSettings, software: dict,
              write_demo: bool = True) -> Plan:
    """No model configured: the demo model, in the first variant that fits these GPUs."""


    models_dir = demo_settings.models_dir
    if not models_dir:
        raise UsageError("no model is configured and TURINGBOX_MODELS_DIR is empty; set --model or --models-dir.")
    if demo_settings.variant_given:
        variants = [(bool(demo_settings.demo_awq), demo_settings.demo_layers)]
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
        target = demo_dir(models_dir, awq, layers)
        cfg = demo.make_config(awq, layers)
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
        try:
            plan = make_plan(inventory, model_config_from_dict(cfg, target, digest), settings, software)
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
