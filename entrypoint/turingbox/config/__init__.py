"""The appliance's edge: every setting declared once (config/table.py), loaded once per process into typed
groups (config/types.py), and the appliance's only reads of the environment.

A command adds the flags it takes with `add_arguments(parser, names)` and calls `load(args, groups=...)` once;
the core takes the typed groups it needs (PlanSettings, ServeSettings, CacheSettings, WarmupSettings, ...).
Precedence: CLI flag > TURINGBOX_* variable > default. A bad value raises UsageError naming the setting, the
variable and the value.
"""
from __future__ import annotations

import argparse
from typing import Any, Iterable, Mapping

from turingbox.config import envs
from turingbox.config.table import *  # noqa: F401,F403  (the table, its vocabulary and parsers)
from turingbox.config.table import REGISTRY, _validate
from turingbox.config.types import (GROUPS, CacheSettings, DemoSettings, LauncherSettings, PlanSettings,
                                    ServeSettings, Settings, WarmupSettings)

__all__ = ["load", "load_group", "resolve", "given_value", "Settings", "PlanSettings", "DemoSettings", "ServeSettings", "CacheSettings",
           "WarmupSettings", "LauncherSettings", "GROUPS", "ALL_GROUPS"]

ALL_GROUPS = ("plan", "demo", "serve", "cache", "warmup")    # launcher: serve's rows again, for warmup


def _environment(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return envs.process_environment() if environ is None else environ


def resolve(names: Iterable[str], args: argparse.Namespace | None = None,
            environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Named settings, untyped: each from its flag (when args has it), else its variable, else its default;
    invalid -> UsageError. For the image-build tools that read one setting; commands use load()."""
    return _resolve(names, args, _environment(environ))[0]


def _resolve(names: Iterable[str], args: argparse.Namespace | None,
             env: Mapping[str, str]) -> tuple[dict[str, Any], set[str]]:
    values: dict[str, Any] = {}
    given: set[str] = set()
    for name in names:
        s = REGISTRY[name]
        raw_flag = getattr(args, name, None) if args is not None else None
        if raw_flag is not None:
            values[name] = _validate(s, raw_flag, s.flag_name)
            given.add(name)
        elif env.get(s.env_name, "") != "":
            values[name] = _validate(s, env[s.env_name], s.env_name)
            given.add(name)
        else:
            values[name] = s.default_value()
    return values, given


def given_value(name: str, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """One setting's value when it was given (a flag or a non-empty variable), else None: for serve's saved plan,
    which needs only the runtime_dir an operator set."""
    values, given = _resolve((name,), args, _environment(environ))
    return values[name] if name in given else None


def load_group(group: str, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None):
    """One group of settings, typed (see resolve for where each value comes from)."""
    env = _environment(environ)
    cls, names = GROUPS[group]
    values, given = _resolve(names, args, env)
    empty = {name for name in names if env.get(REGISTRY[name].env_name) == ""}
    return cls(**values, given=frozenset(given), empty_variables=frozenset(empty))


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
         groups: Iterable[str] = ALL_GROUPS) -> Settings:
    """The groups a command reads, each resolved once, in the order given (the first bad value is reported)."""
    return Settings(**{group: load_group(group, args, environ) for group in groups})
