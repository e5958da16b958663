"""`turingbox cache show|verify|seed`: the compile-cache entries (cache/report.py lists and checks them; turingbox_warmup/seed.py seeds)."""
from __future__ import annotations

import argparse

from turingbox import config
from turingbox.cache.report import show, verify
from turingbox.cli import warmup as warmup_cli

ROOTS = ("cache_dir", "baked_cache_dir")


def register(sub: argparse._SubParsersAction) -> None:
    cache_p = sub.add_parser("cache", help="show, verify or seed the compile-cache entries")
    csub = cache_p.add_subparsers(dest="cache_command", metavar="ACTION")
    show = csub.add_parser("show", help="list entries: key, complete?, created, sizes, hits")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    config.add_arguments(show, ROOTS)
    show.set_defaults(func=run_show)
    verify = csub.add_parser("verify", help="check manifests and files; exit 1 if an entry is corrupt")
    verify.add_argument("keys", nargs="*", metavar="KEY", help="entries to check (default: all)")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument("--baked", action="store_true", help="check the entries baked into the image instead")
    config.add_arguments(verify, ROOTS)
    verify.set_defaults(func=run_verify)
    seed = csub.add_parser("seed", help="same as `turingbox warmup --seed-only`")
    seed.add_argument("--plan-json", metavar="FILE", help="use a saved plan instead of planning")
    config.add_arguments(seed, warmup_cli.FLAGS)
    seed.set_defaults(func=warmup_cli.run, seed_only=True)
    cache_p.set_defaults(func=lambda args: (cache_p.print_help(), 2)[1])


def run_show(args: argparse.Namespace) -> int:
    return show(config.load(args, groups=("cache",)).cache, bool(args.json))


def run_verify(args: argparse.Namespace) -> int:
    return verify(config.load(args, groups=("cache",)).cache, args.keys, bool(getattr(args, "baked", False)),
                  bool(args.json))
