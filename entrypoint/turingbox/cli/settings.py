"""`turingbox settings [--json | --markdown]`: every setting of the one table (config/doc.py formats it)."""
from __future__ import annotations

import argparse
import json
import sys

from turingbox import config
from turingbox.config import doc


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("settings", help="list every setting: flag, variable, default, the commands that read it",
                       description="Every TURINGBOX_* setting with its flag, default, the commands that read it "
                                   "and what it means.")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true", help="print the settings as JSON")
    how.add_argument("--markdown", action="store_true", help="print the README's Configuration table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        listing = {"settings": doc.rows(), "other_variables": dict(config.OTHER_VARIABLES)}
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    else:
        sys.stdout.write(doc.markdown() if args.markdown else doc.text())
    return 0
