"""Function-local imports of the project's own modules are few and each says why.

An import inside a function hides a dependency from the reader and from the import contracts' layer order, so
the shipped packages keep at most BUDGET of them, and each carries a one-line reason on its line or the line
above: `# local: <why> (<measured ms, or the circle>)`, e.g. `# local: pulls Triton (53 ms)`. A circle between
two modules of one package is no reason: the acyclic_siblings contracts in pyproject.toml forbid it.

Shipped code is every source folder of pyproject's [tool.setuptools.packages.find] `where` list plus plugin/;
own modules are the top-level packages found there, and any relative import. `importlib.import_module` with a
literal own name counts as an import too.
"""
from __future__ import annotations

import ast
import os
import re
import textwrap
import tomllib
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUDGET = 10
LOCAL = re.compile(r"#\s*local:")
REASON = re.compile(r"#\s*local:\s*\S.*\((?P<measure>[^()]*)\)")
MEASURE = re.compile(r"\d\s*ms\b|\bcircle\b")


@dataclass(frozen=True)
class LocalImport:
    path: str
    line: int
    statement: str
    reason: str | None     # the comment from `local:` on, or None

    @property
    def measured(self) -> bool:
        """The reason ends in a parenthesis that names a measured cost (`N ms`) or the circle."""
        m = self.reason and REASON.search("# " + self.reason)
        return bool(m and MEASURE.search(m["measure"]))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.statement}" + (f"  # {self.reason}" if self.reason else "")


def source_roots() -> list[str]:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        where = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["where"]
    return sorted({os.path.normpath(w) for w in where} | {"plugin"})


def own_packages(roots: list[str]) -> set[str]:
    return {name for root in roots for name in os.listdir(os.path.join(REPO, root))
            if os.path.isfile(os.path.join(REPO, root, name, "__init__.py"))}


def python_files(roots: list[str]) -> list[str]:
    out = []
    for root in roots:
        for folder, dirs, files in os.walk(os.path.join(REPO, root)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            out += [os.path.relpath(os.path.join(folder, f), REPO) for f in sorted(files) if f.endswith(".py")]
    return out


def _imports_own_module(node: ast.AST, own: set[str]) -> bool:
    """An import statement, or an import_module call with a literal name, of an own (or relative) module."""
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] in own
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in own for a in node.names)
    if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        name = node.args[0].value
        return name.startswith(".") or name.split(".")[0] in own
    return False


def _reason(lines: list[str], node: ast.AST) -> str | None:
    """The `# local:` comment on the statement's lines or on the line just above it."""
    candidates = lines[node.lineno - 1:node.end_lineno]
    above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
    if above.startswith("#"):
        candidates = [above] + candidates
    for text in candidates:
        m = LOCAL.search(text)
        if m:
            return text[m.start() + 1:].strip()
    return None


def local_imports_in(source: str, path: str, own: set[str]) -> list[LocalImport]:
    lines = source.splitlines()
    found: list[LocalImport] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and _imports_own_module(child, own):
                found.append(LocalImport(path, child.lineno, ast.unparse(child), _reason(lines, child)))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source, path), False)
    return found


def shipped_local_imports() -> list[LocalImport]:
    roots = source_roots()
    own = own_packages(roots)
    found = []
    for rel in python_files(roots):
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            found += local_imports_in(f.read(), rel, own)
    return found


def _listing(imports: list[LocalImport]) -> str:
    return "\n".join(f"  {i}" for i in imports)


def test_every_local_import_of_an_own_module_gives_its_reason():
    missing = [i for i in shipped_local_imports() if not i.measured]
    assert not missing, ("function-local imports of own modules without `# local: <why> (<N ms, or the circle>)`; "
                         f"hoist them to the module's top, or give the measured reason:\n{_listing(missing)}")


def test_local_imports_of_own_modules_stay_within_budget():
    found = shipped_local_imports()
    print(f"{len(found)} function-local imports of own modules:\n{_listing(found)}")
    assert len(found) <= BUDGET, f"{len(found)} function-local imports of own modules, budget {BUDGET}:\n{_listing(found)}"


def test_the_walk_finds_every_kind_of_local_import():
    """The walker itself: functions, methods, nested functions and lambdas count; module level, class bodies
    and other packages do not; relative imports and a literal import_module count; the reason may sit above."""
    source = textwrap.dedent('''
        import turingbox_plugin.errors
        from . import top_level_relative
        import json

        class Holder:
            from turingbox import errors as class_body

            def method(self):
                from turingbox.plan import planner  # local: pulls torch (812 ms)
                import json

        def outer():
            def inner():
                # local: launch reads the plan (circle plan <-> engine)
                from ..engine import launch
            return lambda: importlib.import_module("turingbox_plugin.kernels")

        def no_reason():
            import turingbox_plugin.cli, httpx
            importlib.import_module(name_from_a_table)
            from turingbox_plugin import (
                verify)  # local: a reason (without a measure)
    ''')
    found = local_imports_in(source, "x.py", {"turingbox", "turingbox_plugin"})
    assert [(i.line, i.statement) for i in found] == [
        (10, "from turingbox.plan import planner"), (16, "from ..engine import launch"),
        (17, "importlib.import_module('turingbox_plugin.kernels')"), (20, "import turingbox_plugin.cli, httpx"),
        (22, "from turingbox_plugin import verify")]
    reasons = {i.line: i.reason for i in found}
    assert reasons[10] == "local: pulls torch (812 ms)" and reasons[16].endswith("(circle plan <-> engine)")
    assert reasons[17] is None and reasons[20] is None and reasons[22] == "local: a reason (without a measure)"
    assert [i.line for i in found if i.measured] == [10, 16]


def test_the_walk_reads_the_source_folders_from_pyproject():
    roots = source_roots()
    assert "plugin" in roots and "entrypoint" in roots
    assert {"turingbox", "turingbox_plugin"} <= own_packages(roots)
    assert any(p.endswith(os.path.join("turingbox_plugin", "cli.py")) for p in python_files(roots))
