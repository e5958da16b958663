"""The GPU machine's shell scripts (bench/gpu/*.sh) on CPU: each parses (`bash -n`), session.sh's header lists
exactly the phases its `case` has a branch for (a phase missing from either costs a GPU session: an unknown phase
only logs "unknown phase"), and soak_gate.sh passes on its peer's marker and gives up at its limit."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU = os.path.join(REPO, "bench", "gpu")
SESSION = os.path.join(GPU, "session.sh")
BASH = shutil.which("bash")
SCRIPTS = sorted(glob.glob(os.path.join(GPU, "*.sh")))

pytestmark = pytest.mark.skipif(BASH is None, reason="no bash on PATH")


def header_phases(text: str) -> list[str]:
    """The phases of the header comment's list: the lines `#   name[, name...]: what it does` after `# Phases`
    (continuation lines are indented further), up to the first line that is not part of the list."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Phases"))
    names: list[str] = []
    for line in lines[start + 1:]:
        if not line.startswith("#   "):
            break
        m = re.match(r"#   ([a-z0-9-]+(?:, [a-z0-9-]+)*):", line)
        if m:
            names += m.group(1).split(", ")
    return names


def case_phases(text: str) -> list[str]:
    """The patterns of the branches of `case $phase in ... esac` (the catch-all `*` aside)."""
    block = re.search(r"^\s*case \$phase in\n(.*?)^\s*esac\b", text, re.M | re.S)
    assert block, "no `case $phase in ... esac` in session.sh"
    names: list[str] = []
    for m in re.finditer(r"^ {4}([a-z0-9*|-]+)\)", block.group(1), re.M):
        names += [p for p in m.group(1).split("|") if p != "*"]
    return names


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_every_gpu_script_parses(script):
    p = subprocess.run([BASH, "-n", script], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_the_parse_check_covers_the_session_scripts():
    assert {"session.sh", "poll.sh", "soak_gate.sh", "bootstrap.sh"} <= {os.path.basename(s) for s in SCRIPTS}


def test_bash_n_catches_a_broken_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("case $x in\n  a) echo a ;;\n")          # no esac
    assert subprocess.run([BASH, "-n", str(bad)], capture_output=True, timeout=30).returncode != 0


def test_session_header_lists_exactly_the_case_branches():
    text = open(SESSION).read()
    header, branches = header_phases(text), case_phases(text)
    assert len(header) > 20 and len(branches) > 20, (header, branches)       # the parsers found the lists at all
    assert len(set(header)) == len(header), "a phase listed twice in the header"
    assert len(set(branches)) == len(branches), "a phase with two case branches"
    assert sorted(set(header) - set(branches)) == [], "in session.sh's header, no case branch"
    assert sorted(set(branches) - set(header)) == [], "a case branch session.sh's header does not list"


def test_the_parsers_see_a_missing_branch_and_a_missing_header_line():
    text = ("#!/usr/bin/env bash\n# Phases, one branch each:\n#   smoke, cold: a\n#     b\n#   hostile: c\n"
            "# Two lanes at once\nfor phase in \"$@\"; do\n  case $phase in\n"
            "    smoke)    echo ;;\n    cold|warm) echo ;;\n    *)        echo unknown ;;\n  esac\ndone\n")
    assert header_phases(text) == ["smoke", "cold", "hostile"]
    assert case_phases(text) == ["smoke", "cold", "warm"]


# ---- soak_gate.sh: the two lanes' turns (markers in /tmp/session, as session.sh writes them) ------------------

@pytest.fixture
def peer():
    """A phase name no session uses, and its markers removed afterwards."""
    name = f"pytest-{uuid.uuid4().hex[:12]}"
    os.makedirs("/tmp/session", exist_ok=True)
    yield name
    for suffix in ("serving", "done"):
        try:
            os.remove(f"/tmp/session/{name}.{suffix}")
        except FileNotFoundError:
            pass


def _gate(name: str, what: str, limit: int) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, os.path.join(GPU, "soak_gate.sh"), name, what, str(limit)],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("marker", ["serving", "done"])
def test_soak_gate_passes_on_the_peers_marker(peer, marker):
    open(f"/tmp/session/{peer}.{marker}", "w").close()
    p = _gate(peer, "serving", 20)
    assert p.returncode == 0
    assert re.search(rf"gate: {peer}\.serving after \d+ s$", p.stdout.strip()), p.stdout


def test_soak_gate_gives_up_at_its_limit(peer):
    p = _gate(peer, "serving", 0)
    assert f"gave up waiting for {peer}.serving after 0 s" in p.stdout, p.stdout
