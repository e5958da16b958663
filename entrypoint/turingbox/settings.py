"""Every setting declared once: a CLI flag and a TURINGBOX_* environment variable.

Feature modules declare their settings with `declare(...)` at import time; a command adds the
flags it uses with `add_arguments(parser, names)` and resolves them once with `resolve(args)`.
Precedence: CLI flag > TURINGBOX_* env > default. A bad value raises UsageError naming the
setting, the variable and the value.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from turingbox.errors import UsageError


@dataclass(frozen=True)
class Setting:
    name: str                      # python name, e.g. "max_model_len"
    help: str
    parse: Callable[[str], Any] = str   # str -> value; raise ValueError with a short reason
    default: Any = None
    flag: str = ""                 # defaults to --max-model-len
    env: str = ""                  # defaults to TURINGBOX_MAX_MODEL_LEN
    secret: bool = False           # never logged nor shown in /turingbox/plan
    choices: tuple = field(default=())

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env_name(self) -> str:
        return self.env or "TURINGBOX_" + self.name.upper()


REGISTRY: dict[str, Setting] = {}


def declare(setting: Setting) -> Setting:
    if setting.name in REGISTRY and REGISTRY[setting.name] != setting:
        raise RuntimeError(f"setting {setting.name} declared twice")
    REGISTRY[setting.name] = setting
    return setting


# ---- value parsers: each raises ValueError with a short reason ----------------------------

MAX_INT = 2**31 - 1  # beyond any count vLLM takes; keeps float maths in the planner finite


def positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value <= 0:
        raise ValueError("must be a positive whole number")
    if value > MAX_INT:
        raise ValueError(f"must be at most {MAX_INT}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value < 0:
        raise ValueError("must be zero or a positive whole number")
    if value > MAX_INT:
        raise ValueError(f"must be at most {MAX_INT}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number between 0 and 1") from None
    if not 0.0 < value < 1.0 or value != value:
        raise ValueError("must be a number between 0 and 1 (exclusive)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number")
    return value


def boolean(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise ValueError("must be a TCP port between 0 and 65535")
    return value


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = str(text).strip().lower()
        if t not in options:
            raise ValueError("must be one of " + ", ".join(options))
        return t
    return parse


def _validate(setting: Setting, raw: str, source: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as exc:
        shown = "***" if setting.secret else repr(raw)
        raise UsageError(f"{source} {shown} is invalid: {exc}.") from None


def add_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add the flags of the named settings; values stay raw strings until resolve()."""
    for name in names:
        s = REGISTRY[name]
        if s.parse is boolean:
            parser.add_argument(s.flag_name, dest=name, nargs="?", const="1", default=None,
                                help=f"{s.help} [env {s.env_name}]")
        else:
            parser.add_argument(s.flag_name, dest=name, default=None, metavar="VALUE",
                                help=f"{s.help} [env {s.env_name}]")


def resolve(names: Iterable[str], args: argparse.Namespace | None = None,
            env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Resolve each named setting once: flag > env > default; invalid -> UsageError."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for name in names:
        s = REGISTRY[name]
        raw_flag = getattr(args, name, None) if args is not None else None
        if raw_flag is not None:
            out[name] = _validate(s, raw_flag, f"{s.flag_name}")
        elif env.get(s.env_name, "") != "":
            out[name] = _validate(s, env[s.env_name], f"{s.env_name}")
        else:
            out[name] = s.default
    return out


def redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved settings safe to log: secrets replaced by whether they are set."""
    out = {}
    for k, v in values.items():
        s = REGISTRY.get(k)
        out[k] = ("set" if v else "unset") if (s and s.secret) else v
    return out
