"""`turingbox doctor`'s plan line: the MTP depth and memory the planner would pick on this machine.
Registered with the plugin's doctor through the `turingbox_plugin.doctor_checks` entry point, so the
plugin alone never imports the appliance. Its `add_arguments` gives doctor the settings table's
`--gpus-json` (TURINGBOX_GPUS_JSON), the same flag `turingbox plan` takes."""
from __future__ import annotations

import argparse

from turingbox import config
from turingbox.plan.from_settings import plan_from_settings
from turingbox_plugin.doctor import FAIL, PASS, Check

# The plan settings doctor takes as flags; the others come from their TURINGBOX_* variables, as for `plan`.
DOCTOR_FLAGS = ("gpus_json",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, DOCTOR_FLAGS)


def check_plan(model_dir: str | None, args: argparse.Namespace | None = None) -> Check:
    """Plan as `turingbox plan` would: MODEL, else TURINGBOX_MODEL, else the built-in demo (not written)."""

    ns = argparse.Namespace(**vars(args)) if args is not None else argparse.Namespace()
    ns.model = model_dir          # doctor's MODEL argument is the `model` setting's flag
    try:
        settings = config.load(ns, groups=("plan", "demo"))
        plan = plan_from_settings(settings.plan, settings.demo, write_demo=False)
    except Exception as exc:  # the planner's and the settings' errors are one sentence already
        return Check("plan", FAIL, " ".join(str(exc).split()) if str(exc) else type(exc).__name__)
    what = f"the built-in demo ({'AWQ INT4' if plan.quantization else plan.dtype})" if plan.demo else plan.model
    if plan.demo_fallback:
        what = f"the built-in demo's {plan.demo_fallback['used']} stand-in"
    return Check("plan", PASS, f"{what} on {plan.tensor_parallel_size}x {plan.gpu_name}: "
                               f"TP {plan.tensor_parallel_size}, MTP {plan.num_speculative_tokens}, "
                               f"KV {plan.kv_cache_dtype}, KV pool {plan.memory.get('kv_cache_gib')} GiB/rank, "
                               f"max_model_len {plan.max_model_len}")


check_plan.add_arguments = add_arguments  # type: ignore[attr-defined]  (doctor adds these flags; see its EXTRA_CHECKS_GROUP)
