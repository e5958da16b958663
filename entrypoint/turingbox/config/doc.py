"""What `turingbox settings [--json | --markdown]` prints (cli/settings.py): every setting of the one table (turingbox.config.SETTINGS) with
its flag, variable, default, the commands that read it and its meaning.

README.md's Configuration table is `turingbox settings --markdown`, pasted between marker comments
(tests/turingbox/config/test_doc.py fails when the two differ). READERS below says which commands read which
settings; the same test checks it against the commands' parsers, and cli/__init__.py refuses a mistyped TURINGBOX_*
variable (exit 2, the closest name) before any of these commands runs.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from turingbox import config as S

# (command as typed, settings it takes as flags, settings it reads from their variable only). A command
# that resolves any setting is listed here; cli/__init__.py refuses unknown TURINGBOX_* variables for exactly these.
_LAUNCHER = S.LAUNCHER_SETTINGS      # warmup starts vLLM as serve does
_WARMUP_FLAGS = S.PLAN_SETTINGS + S.CACHE_SETTINGS + S.WARMUP_SETTINGS
READERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("plan", S.PLAN_SETTINGS, ()),
    # the cache store resolves the cache settings from serve's environment; serve has no flags for them
    ("serve", S.PLAN_SETTINGS + S.SERVE_SETTINGS, S.CACHE_SETTINGS),
    ("warmup", _WARMUP_FLAGS, _LAUNCHER),
    ("cache seed", _WARMUP_FLAGS, _LAUNCHER),
    ("cache show", ("cache_dir", "baked_cache_dir"), ()),
    ("cache verify", ("cache_dir", "baked_cache_dir"), ()),
    ("demo-model", S.DEMO_SETTINGS, ()),          # as --models-dir, --awq and --layers
    # its plan line plans as `plan` does: cli/doctor_check.py's DOCTOR_FLAGS (--gpus-json) as flags, which the
    # plugin's cli.py adds through doctor.add_arguments, the other plan settings from their variables
    ("doctor", ("gpus_json",), tuple(n for n in S.PLAN_SETTINGS if n != "gpus_json")),
    # not the plugin's benches (bench decode|prefill): they read no setting of the appliance, their --api-key
    # default is the plugin's own TBPLUGIN_API_KEY (turingbox_plugin.contract)
)
READING_COMMANDS = frozenset(c for c, _, _ in READERS)
assert all(n in S.REGISTRY for _, flags, env_only in READERS for n in flags + env_only), "READERS names no setting"


def command_of(args: argparse.Namespace) -> str:
    """The command as READERS spells it ("plan", "cache show") from parsed arguments."""
    command = getattr(args, "command", None) or ""
    # a command with actions keeps the action in <command>_command (cache_command, bench_command)
    action = getattr(args, f"{command.replace('-', '_')}_command", None) if command else None
    return f"{command} {action}" if action else command


def readers(name: str) -> list[tuple[str, str]]:
    """[(command, "flag" | "variable")] for one setting, in READERS order."""
    out = []
    for command, flags, env_only in READERS:
        if name in flags:
            out.append((command, "flag"))
        elif name in env_only:
            out.append((command, "variable"))
    return out


def shown_default(setting: S.Setting) -> str:
    """The default as a person writes the variable; "" when unset (automatic or off, the meaning says which).
    Paths under the home or temporary directory are shown as ~ and $TMPDIR, so the listing is the same on
    every machine (the README holds it)."""
    value = setting.default_value()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return format(value, "g")
    text = str(value)
    prefixes = sorted(((os.path.expanduser("~"), "~"), (tempfile.gettempdir(), "$TMPDIR")),
                      key=lambda p: len(p[0]), reverse=True)
    for prefix, shown in prefixes:       # the longer prefix first: a TMPDIR inside the home stays $TMPDIR
        if prefix not in ("", os.sep) and (text == prefix or text.startswith(prefix + os.sep)):
            return shown + text[len(prefix):]
    return text


def _read_by(name: str) -> str:
    return ", ".join(c if how == "flag" else f"{c} (variable)" for c, how in readers(name))


def rows() -> list[dict[str, Any]]:
    """One dict per setting, in the table's order (the JSON of `turingbox settings --json`)."""
    out = []
    for s in S.SETTINGS:
        out.append({"name": s.name, "variable": s.env_name, "flag": s.flag_name,
                    "default": None if s.secret else s.default_value(), "default_shown": shown_default(s),
                    "read_by": [{"command": c, "as": how} for c, how in readers(s.name)],
                    "meaning": s.help, "secret": s.secret})
    return out


def _cell(text: str) -> str:
    # a table cell is one line; <owner>/<name> would be read as an HTML tag
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def markdown() -> str:
    """The README's Configuration table."""
    lines = ["| variable | flag | default | read by | meaning |", "|---|---|---|---|---|"]
    for s in S.SETTINGS:
        default = shown_default(s)
        lines.append(f"| `{s.env_name}` | `{s.flag_name}` | {f'`{_cell(default)}`' if default else '–'} | "
                     f"{_cell(_read_by(s.name))} | {_cell(s.help)} |")
    return "\n".join(lines) + "\n"


def text() -> str:
    out = []
    for s in S.SETTINGS:
        default = shown_default(s)
        out += [f"{s.env_name}  {s.flag_name}  (default: {default or 'unset'})", f"    {s.help}",
                f"    read by: {_read_by(s.name)}"]
    out += ["", "The flag wins, then the variable, then the default; an empty variable counts as unset. "
            "\"(variable)\": that command reads the variable but has no flag for it.",
            "Other TURINGBOX_* names, not settings: " + ", ".join(S.OTHER_VARIABLES) + "."]
    return "\n".join(out) + "\n"
