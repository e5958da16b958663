"""`turingbox serve [plan flags] [serve flags] [-- vllm args]`: the container's main job."""
from __future__ import annotations

import argparse
import logging

from turingbox import settings
from turingbox.plan.types import Plan, load_saved_plan
from turingbox.serve.options import SERVE_SETTINGS, ServeOptions

log = logging.getLogger("turingbox.serve")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve", help="plan, start vLLM and serve it through the sidecar (the container's main job)",
        description="Plan for this machine's GPUs, prepare the compile caches, start vLLM on a loopback "
                    "port and serve it through the sidecar on the public port. Arguments after -- go to "
                    "vLLM last and win over the plan.")
    plan_names = settings.PLAN_SETTINGS
    settings.add_arguments(parser, plan_names)
    settings.add_arguments(parser, [n for n in SERVE_SETTINGS if n not in plan_names])
    parser.set_defaults(func=run)


def load_plan_file(path: str) -> Plan:
    return load_saved_plan(path, "--plan-file")


def run(args: argparse.Namespace) -> int:
    from turingbox.serve.controller import serve

    options = ServeOptions.from_settings(settings.resolve(SERVE_SETTINGS + settings.CACHE_SETTINGS, args))
    if options.plan_file:
        plan = load_plan_file(options.plan_file)

        def plan_fn() -> Plan:
            return plan
    else:
        # Bad values end serve now (exit 2, one sentence) instead of leaving a sidecar that is never ready.
        settings.resolve(settings.PLAN_SETTINGS, args)

        def plan_fn() -> Plan:
            from turingbox.plan.command import plan_from_args
            return plan_from_args(args)
    return serve(options, plan_fn, list(getattr(args, "vllm_passthrough", []) or []))
