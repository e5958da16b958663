"""docs/architecture.md matches the tree: one line per module, no line for a module that is gone, and its picture
is drawn from the tree (tools/draw_architecture.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "architecture.md")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import draw_architecture  # noqa: E402  (a script in tools/, not a package)

# the shipped packages' folders: module paths in the doc are relative to these
PACKAGE_DIRS = {os.path.join(ROOT, base, name)
                for base in draw_architecture.SOURCE_DIRS if os.path.isdir(os.path.join(ROOT, base))
                for name in os.listdir(os.path.join(ROOT, base))
                if os.path.isfile(os.path.join(ROOT, base, name, "__init__.py"))}


def shipped_modules() -> list[str]:
    """Every module file of the shipped packages, as '<package>/<path>.py' relative to its package folder's parent."""
    found = []
    for pkg in sorted(PACKAGE_DIRS):
        for dirpath, dirnames, filenames in os.walk(pkg):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".py") and f != "__init__.py":
                    found.append(os.path.relpath(os.path.join(dirpath, f), os.path.dirname(pkg)))
    return sorted(found)


def doc_text() -> str:
    with open(DOC) as f:
        return f.read()


def test_every_module_has_its_line():
    text = doc_text()
    missing = []
    for rel in shipped_modules():
        inside = rel.split(os.sep, 1)[1]          # the path inside its package, as the doc writes it
        if f"`{inside}`" not in text and f"`{rel}`" not in text:
            missing.append(rel)
    assert not missing, f"docs/architecture.md has no line for {missing}"


def test_every_module_the_doc_names_exists():
    named = set(re.findall(r"`([\w/]+\.py)`", doc_text()))
    modules = shipped_modules()
    gone = [n for n in sorted(named)
            if not any(m == n or m.endswith(os.sep + n) for m in modules)
            and not os.path.exists(os.path.join(ROOT, n))]
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def test_picture_is_drawn_from_the_tree(tmp_path):
    out = tmp_path / "architecture.png"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "draw_architecture.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000
    assert os.path.exists(os.path.join(ROOT, "docs", "img", "architecture.png"))
    # every layer of the layers contract resolves to code on disk
    for layer in draw_architecture.layers():
        for module in layer:
            assert draw_architecture.package_dir(module), f"layers contract names {module}, which is not on disk"
