"""`turingbox serve [plan flags] [serve flags] [-- vllm args]`: the container's main job."""
from __future__ import annotations

import argparse

from turingbox import config
from turingbox.plan.from_settings import plan_from_settings
from turingbox.plan.types import Plan, load_saved_plan


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve", help="plan, start vLLM and serve it through the sidecar (the container's main job)",
        description="Plan for this machine's GPUs, prepare the compile caches, start vLLM on a loopback "
                    "port and serve it through the sidecar on the public port. Arguments after -- go to "
                    "vLLM last and win over the plan.")
    plan_names = config.PLAN_SETTINGS
    config.add_arguments(parser, plan_names)
    config.add_arguments(parser, [n for n in config.SERVE_SETTINGS if n not in plan_names])
    parser.set_defaults(func=run)


def load_plan_file(path: str) -> Plan:
    return load_saved_plan(path, "--plan-file")


def run(args: argparse.Namespace) -> int:
    # local: every command builds this parser; serve's FastAPI/uvicorn stack only when serving (315 ms)
    from turingbox.serve.controller import serve

    loaded = config.load(args, groups=("serve", "cache"))
    options = loaded.serve
    if options.plan_file:
        plan = load_plan_file(options.plan_file)
        runtime_dir = config.given_value("runtime_dir", args)

        def plan_fn() -> Plan:
            return plan
    else:
        # Bad values end serve now (exit 2, one sentence) instead of leaving a sidecar that is never ready.
        planning = config.load(args, groups=("plan", "demo"))
        runtime_dir = planning.plan.runtime_dir if "runtime_dir" in planning.plan.given else None

        def plan_fn() -> Plan:
            return plan_from_settings(planning.plan, planning.demo)
    return serve(options, loaded.cache, plan_fn, list(getattr(args, "vllm_passthrough", []) or []), runtime_dir)
