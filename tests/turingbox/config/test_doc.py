"""`turingbox settings`: the listing is the one table, README.md's Configuration table is its --markdown output,
and READERS (who reads which setting) is what the commands' parsers take."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from turingbox import config as S
from turingbox.config import doc as D

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BEGIN = "<!-- BEGIN: `turingbox settings --markdown`"
END = "<!-- END: `turingbox settings --markdown` -->"


def cli(*argv, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "turingbox", *argv], capture_output=True, text=True, env=full,
                          cwd=REPO, timeout=60)


def readme_table() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md needs one pair of settings markers"
    start = text.index("\n", text.index(BEGIN)) + 1
    return text[start:text.index(END)]


def test_readme_configuration_table_is_the_generated_one():
    r = cli("settings", "--markdown")
    assert r.returncode == 0, r.stderr
    assert r.stdout == readme_table(), ("README.md's Configuration table differs from `turingbox settings "
                                        "--markdown`: paste that command's output between the markers")
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| `")]
    assert [re.match(r"\| `([A-Z0-9_]+)`", ln).group(1) for ln in rows] == [s.env_name for s in S.SETTINGS]


def test_markdown_is_the_same_on_every_machine(tmp_path):
    """The README holds it: home and temporary-directory defaults are written as ~ and $TMPDIR."""
    a = cli("settings", "--markdown")
    b = cli("settings", "--markdown", env={"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)})
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    assert "`$TMPDIR/turingbox-runtime`" in a.stdout and "`~/.cache/turingbox/models`" in a.stdout


def test_json_lists_every_setting_with_its_readers():
    r = cli("settings", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by_name = {row["name"]: row for row in doc["settings"]}
    assert list(by_name) == [s.name for s in S.SETTINGS]
    for s in S.SETTINGS:
        row = by_name[s.name]
        assert (row["variable"], row["flag"], row["meaning"]) == (s.env_name, s.flag_name, s.help)
        assert row["read_by"], f"{s.env_name}: no command reads it (settings_doc.READERS)"
        assert row["default"] == (None if s.secret else s.default_value())
    assert by_name["max_model_len"]["read_by"][:2] == [{"command": "plan", "as": "flag"},
                                                       {"command": "serve", "as": "flag"}]
    assert {"command": "serve", "as": "variable"} in by_name["cache_dir"]["read_by"]
    assert doc["other_variables"] == S.OTHER_VARIABLES


def test_text_listing_names_every_variable_flag_and_default():
    r = cli("settings")
    assert r.returncode == 0, r.stderr
    for s in S.SETTINGS:
        head = next((ln for ln in r.stdout.splitlines() if ln.startswith(s.env_name + "  ")), None)
        assert head == f"{s.env_name}  {s.flag_name}  (default: {D.shown_default(s) or 'unset'})", head


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by the command as typed: "plan", "cache show"."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = sub
                out.update({f"{name} {k}": v for k, v in _subparsers(sub).items()})
    return out


def _setting_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The settings a parser takes as flags: an option whose help names the setting's variable ([env ...])."""
    return {a.dest for a in parser._actions if a.dest in S.REGISTRY and a.option_strings
            and f"[env {S.REGISTRY[a.dest].env_name}]" in (a.help or "")}


def test_readers_are_what_the_parsers_take():
    from turingbox.cli import build_parser
    parsers = _subparsers(build_parser())
    declared = {command: (set(flags), set(env_only)) for command, flags, env_only in D.READERS}
    for command, (flags, env_only) in declared.items():
        assert command in parsers, f"settings_doc.READERS names {command!r}, which is no command"
        taken = _setting_flags(parsers[command])
        assert taken == flags, (f"settings_doc.READERS is not what `turingbox {command}` takes: mend READERS and "
                                f"paste `turingbox settings --markdown` into README.md", command,
                                "not declared:", sorted(taken - flags), "not taken:", sorted(flags - taken))
        assert not env_only & taken, (command, sorted(env_only & taken))
    # and no other command takes a setting's flag without being listed (cli.py refuses typos for exactly these)
    unlisted = {c: sorted(_setting_flags(p)) for c, p in parsers.items() if c not in declared and _setting_flags(p)
                and not any(k.startswith(c + " ") for k in declared)}
    assert not unlisted, unlisted


def test_harness_variables_are_the_ones_the_harness_reads():
    """settings.HARNESS_VARIABLES (accepted beside the settings, so the tests' own variables are no typo) is
    exactly the TURINGBOX_* names that tests, tools and GPU scripts read from the environment."""
    files = subprocess.run(["git", "ls-files", "tests", "tools", "bench", ".ci", "Makefile"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    read = re.compile(r"""(?:environ(?:\.get)?\(?\[?\s*["']|\$\{?|export\s+)(TURINGBOX_[A-Z0-9_]+)""")
    names: set[str] = set()
    for rel in files:
        path = os.path.join(REPO, rel)
        if os.path.isfile(path) and rel.endswith((".py", ".sh", "Makefile", "run")):
            with open(path, errors="replace") as f:
                names.update(read.findall(f.read()))
    known = {s.env_name for s in S.SETTINGS} | set(S.OTHER_VARIABLES)
    harness = {n for n in names - known if not n.startswith(S.HARNESS_PREFIX)}
    assert harness == set(S.HARNESS_VARIABLES), (sorted(harness - set(S.HARNESS_VARIABLES)),
                                                 sorted(set(S.HARNESS_VARIABLES) - harness))
