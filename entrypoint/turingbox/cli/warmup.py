"""`turingbox warmup [--seed-only]` (and `turingbox cache seed`, the same with --seed-only): fill the cache entry
for this plan (turingbox_warmup/seed.py does the work)."""
from __future__ import annotations

import argparse

from turingbox import config
from turingbox.plan.from_settings import plan_from_settings
from turingbox.plan.types import Plan, load_saved_plan

# the table's groups are disjoint (config/table.py checks each name is declared once): one flag per setting
FLAGS = config.PLAN_SETTINGS + config.CACHE_SETTINGS + config.WARMUP_SETTINGS


def register(sub: argparse._SubParsersAction) -> None:
    warm = sub.add_parser("warmup", help="start the engine with the plan, warm every cache, stop (seeds the cache)",
                          description="Fill the cache entry for this plan. Without --seed-only an entry that is "
                                      "already complete is left alone (exit 0 without starting the engine).")
    warm.add_argument("--seed-only", action="store_true",
                      help="always start the engine, warm (strict + active warmup) and stop, even on a complete entry")
    warm.add_argument("--plan-json", metavar="FILE", help="use a saved plan (turingbox plan --json) instead of planning")
    config.add_arguments(warm, FLAGS)
    warm.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # local: every command builds this parser; the engine start and active warmup only when warming (126 ms)
    from turingbox_warmup.seed import warmup

    # every setting this command reads, loaded once, before any work (bad input first)
    planning = () if getattr(args, "plan_json", None) else ("plan", "demo")
    settings = config.load(args, groups=("cache", "warmup", "launcher") + planning)

    def make_plan() -> Plan:
        if not planning:
            return load_saved_plan(args.plan_json, "--plan-json")
        return plan_from_settings(settings.plan, settings.demo)

    return warmup(make_plan, settings.cache, settings.warmup, settings.launcher,
                  bool(getattr(args, "seed_only", False)), list(getattr(args, "vllm_passthrough", []) or []))
