"""The scripts that only run on the GPU machine (bench/, bench/gpu/ among them) and the build files name turingbox modules,
their functions and CLI subcommands. A rename that misses one costs a GPU session, so every such name must
resolve here, on CPU, without importing the heavy modules (names are looked up in the module's source)."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLACES = ["bench", "tools", "deploy", "Makefile", "Dockerfile", "compose.yaml", ".ci/run"]
# any module whose name starts with turingbox (an old package name must be caught, not skipped)
FROM_IMPORT = re.compile(r"\bfrom\s+(turingbox\w*(?:\.\w+)*)\s+import\s+([\w, ]+)")
IMPORT = re.compile(r"^\s*import\s+(turingbox\w*(?:\.\w+)*)", re.M)
RUN_MODULE = re.compile(r"-m\s+(turingbox\w*(?:\.\w+)*)(?:\s+([a-z][a-z-]*))?")


def _files() -> list[str]:
    out = []
    for place in PLACES:
        path = os.path.join(REPO, place)
        if os.path.isfile(path):
            out.append(path)
        for root, _, names in os.walk(path):
            out += [os.path.join(root, n) for n in names if n.endswith((".py", ".sh", ".yaml", ".yml"))]
    return sorted(out)


def _references() -> list[tuple[str, str, str | None, str | None]]:
    """(file, module, name imported from it | None, CLI subcommand | None)."""
    refs = []
    for path in _files():
        text = open(path, encoding="utf-8", errors="replace").read()
        rel = os.path.relpath(path, REPO)
        for mod, names in FROM_IMPORT.findall(text):
            for name in (n.strip() for n in names.split(",")):
                if name and name != "as":
                    refs.append((rel, mod, name.split()[0], None))
        refs += [(rel, mod, None, None) for mod in IMPORT.findall(text)]
        refs += [(rel, mod, None, sub if mod == "turingbox" and sub else None) for mod, sub in RUN_MODULE.findall(text)]
    return refs


def _top_level_names(origin: str) -> set[str]:
    tree = ast.parse(open(origin, encoding="utf-8").read())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _subcommands() -> set[str]:
    from turingbox import cli
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_gpu_scripts_name_turingbox_code_that_exists():
    refs = _references()
    assert len(refs) > 20, refs          # the scan found the scripts' imports at all
    commands = _subcommands()
    missing = []
    for rel, mod, name, sub in refs:
        spec = importlib.util.find_spec(mod)
        if spec is None:
            missing.append(f"{rel}: module {mod}")
            continue
        if name:
            sub_spec = importlib.util.find_spec(f"{mod}.{name}") if spec.submodule_search_locations else None
            if sub_spec is None and name not in _top_level_names(spec.origin):
                missing.append(f"{rel}: {mod}.{name}")
        if sub and sub not in commands:
            missing.append(f"{rel}: turingbox {sub}")
    assert not missing, missing


@pytest.mark.parametrize("text, expected", [
    ("    from turingbox_warmup import bake, seed_volume\n",
     [("turingbox_warmup", "bake"), ("turingbox_warmup", "seed_volume")]),
    ("python3 -m turingbox.build.bake --image x", []),
])
def test_the_scan_reads_imports(text, expected):
    assert [(m, n.strip()) for m, names in FROM_IMPORT.findall(text) for n in names.split(",")] == expected
    if "turingbox.build" in text:       # an old module name is read whole and resolves to nothing
        assert RUN_MODULE.search(text).group(1) == "turingbox.build.bake"
        assert importlib.util.find_spec("turingbox.build") is None
