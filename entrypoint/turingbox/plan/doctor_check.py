"""`turingbox doctor`'s plan line: the MTP depth and memory the planner would pick on this machine.
Registered with the plugin's doctor through the `turingbox_plugin.doctor_checks` entry point, so the
plugin alone never imports the appliance."""
from __future__ import annotations

from turingbox_plugin.doctor import FAIL, PASS, WARN, Check
from turingbox_plugin.model_config import load_model_config


def check_plan(model_dir: str | None) -> Check:
    from turingbox import settings
    from turingbox.cache.fingerprint import software_versions
    from turingbox.gpus.inventory import read_inventory
    from turingbox.plan.command import PLAN_SETTINGS
    from turingbox.plan.planner import make_plan

    if not model_dir:
        return Check("plan", WARN, "no MODEL given; pass a model directory to see the plan")
    try:
        inventory = read_inventory(None)        # the process environment's CUDA/NVIDIA_VISIBLE_DEVICES
        gpus = getattr(inventory, "gpus", inventory)
        values = settings.resolve(PLAN_SETTINGS, None)
        plan = make_plan(gpus, load_model_config(model_dir), values, software_versions())
    except Exception as exc:  # the planner's own errors are one sentence already
        return Check("plan", FAIL, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return Check("plan", PASS, f"TP {plan.tensor_parallel_size}, MTP {plan.num_speculative_tokens}, "
                               f"KV {plan.kv_cache_dtype}, KV pool {plan.memory.get('kv_cache_gib')} GiB/rank, "
                               f"max_model_len {plan.max_model_len}")
