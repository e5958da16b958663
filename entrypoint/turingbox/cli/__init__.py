"""`turingbox` console script: one module per command in this package (the edge of the appliance).

Each command module exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`; `func`
loads its settings once (turingbox.config.load) and makes one call into the core. Bad input anywhere ends in one
sentence on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from turingbox import __version__, config
from turingbox.config.doc import READING_COMMANDS, command_of
from turingbox.errors import UsageError
from turingbox_plugin.errors import ToolError

# Where each group of subcommands lives; the order is the order of `turingbox --help`.
COMMAND_MODULES = (
    "turingbox.cli.plan",              # plan
    "turingbox.cli.settings",          # settings
    "turingbox.cli.serve",             # serve
    "turingbox.cli.demo_model",        # demo-model
    "turingbox.cli.warmup",            # warmup
    "turingbox.cli.cache",             # cache show / verify / seed
    "turingbox_plugin.cli",            # doctor, verify, check-model, bench (usable without the appliance)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turingbox", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"turingbox {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


def _usage_errors() -> tuple[type[BaseException], ...]:
    # the plugin keeps its own error type so it installs without the appliance (the appliance requires the plugin)
    return (UsageError, ToolError)


def _refuse_mistyped_settings(args: argparse.Namespace) -> None:
    """A command that reads settings stops before any work at a TURINGBOX_* name that is no setting: a typo
    (MAX_MODEL_LENGTH for MAX_MODEL_LEN) would otherwise be ignored and the default served without a word."""
    if command_of(args) in READING_COMMANDS:
        config.refuse_unknown_variables()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` goes to vLLM untouched and wins over the plan.
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    errors = _usage_errors()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.vllm_passthrough = passthrough
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        _refuse_mistyped_settings(args)
        return int(args.func(args) or 0)
    except errors as exc:
        # One line whatever the input held: a path or value with a line break must not split it.
        print("turingbox: " + " ".join(str(exc).split()), file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
