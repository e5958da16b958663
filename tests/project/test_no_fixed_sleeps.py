"""No test waits by sleeping a fixed time: a test waits on its condition (tests/support/waiting.py's wait_until, an Event,
a line or file appearing). Every `sleep(` in tests/ (tests/bench/gpu/ included) says on its line why it
is not such a wait:
  `# behaviour:`  the pause is what is under test (a stand-in that answers slowly, a client that stalls);
  `# poll:`       the pause between two checks of a condition, inside a loop bounded by a deadline.
"""
from __future__ import annotations

import ast
import os
import re

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLEEP = re.compile(r"\bsleep\(")
MARKERS = ("# behaviour:", "# poll:")


def python_files() -> list[str]:
    found = []
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.join(root, f) for f in files if f.endswith(".py")]
    return sorted(p for p in found if p != os.path.abspath(__file__))      # this file's samples are not waits


def unmarked_sleeps(path: str) -> list[str]:
    with open(path) as f:
        lines = f.read().splitlines()
    return [f"{os.path.relpath(path, TESTS)}:{n}: {line.strip()}" for n, line in enumerate(lines, 1)
            if SLEEP.search(line) and not any(m in line for m in MARKERS)]


def polls_without_deadline(path: str) -> list[str]:
    """`# poll:` lines that are not inside a while loop that watches a deadline."""
    with open(path) as f:
        source = f.read()
    lines = source.splitlines()
    polls = [n for n, line in enumerate(lines, 1) if SLEEP.search(line) and "# poll:" in line]
    if not polls:
        return []
    loops = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.While)]
    bad = []
    for n in polls:
        bounded = any(loop.lineno <= n <= loop.end_lineno and re.search(
            r"deadline|monotonic", "\n".join(lines[loop.lineno - 1:loop.end_lineno])) for loop in loops)
        if not bounded:
            bad.append(f"{os.path.relpath(path, TESTS)}:{n}: {lines[n - 1].strip()}")
    return bad


def test_every_sleep_in_the_tests_says_why_it_is_not_a_wait():
    unmarked = [hit for path in python_files() for hit in unmarked_sleeps(path)]
    assert unmarked == [], ("a fixed sleep used to wait for something: wait on the condition instead "
                            "(tests/support/waiting.py wait_until), or mark a pause that is the behaviour under test "
                            "with `# behaviour: why`:\n" + "\n".join(unmarked))


def test_every_poll_is_bounded_by_a_deadline():
    unbounded = [hit for path in python_files() for hit in polls_without_deadline(path)]
    assert unbounded == [], "`# poll:` outside a loop with a deadline:\n" + "\n".join(unbounded)


def test_the_check_finds_a_bare_sleep(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("import time\n\ntime.sleep(1)\nawait_it = 'asyncio.sleep(0.2)'\n"
                      "time.sleep(0.1)  # behaviour: a slow client\n"
                      "while True:\n    time.sleep(0.1)  # poll: never bounded\n")
    assert [hit.split(":", 2)[1] for hit in unmarked_sleeps(str(sample))] == ["3", "4"]
    assert [hit.split(":", 2)[1] for hit in polls_without_deadline(str(sample))] == ["7"]
