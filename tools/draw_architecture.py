#!/usr/bin/env python3
"""docs/img/architecture.png: the appliance's data path, drawn from the tree and the layers contract.

The boxes are the layers of pyproject.toml's import-linter "layers" contract (top: entry points, bottom: what
everything may import), each listing the modules on disk under it; the plugin sits beside them, reached only
through its contract module. Nothing is typed by hand here, so the picture cannot drift from the code:
tests/project/test_architecture_doc.py redraws it into a temporary file and checks the modules it names.

  python tools/draw_architecture.py [--out docs/img/architecture.png]
"""
from __future__ import annotations

import argparse
import os
import sys

try:
    import tomllib
except ModuleNotFoundError:            # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# where each root package lives (pyproject's [tool.setuptools.packages.find] and the plugin's own project)
SOURCE_DIRS = ("entrypoint", "warmup", "plugin")


def package_dir(module: str) -> str | None:
    """The folder (or .py file) of a dotted module name under one of SOURCE_DIRS."""
    rel = module.replace(".", os.sep)
    for base in SOURCE_DIRS:
        for cand in (os.path.join(ROOT, base, rel), os.path.join(ROOT, base, rel + ".py")):
            if os.path.exists(cand):
                return cand
    return None


def modules_under(module: str) -> list[str]:
    """Every module of a package (dotted, relative to it), or [module's last part] for a plain module."""
    where = package_dir(module)
    if where is None:
        return []
    if where.endswith(".py"):
        return [module.rsplit(".", 1)[-1]]
    found = []
    for dirpath, dirnames, filenames in os.walk(where):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") and f != "__init__.py":
                rel = os.path.relpath(os.path.join(dirpath, f), where)[:-3]
                found.append(rel.replace(os.sep, "."))
    return found


def layers(pyproject: str = os.path.join(ROOT, "pyproject.toml")) -> list[list[str]]:
    """The layers contract's layers, top first, each a list of its module names."""
    with open(pyproject, "rb") as f:
        cfg = tomllib.load(f)
    for contract in cfg["tool"]["importlinter"]["contracts"]:
        if contract.get("type") == "layers":
            return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]
    raise SystemExit("pyproject.toml has no import-linter layers contract")


def draw(out: str) -> list[str]:
    """Draw the picture into `out`; return every module it names (dotted, full)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    stack = layers()
    named: list[str] = []
    fig, ax = plt.subplots(figsize=(15, 1.9 * len(stack) + 1))
    ax.set_xlim(0, 15)
    ax.set_ylim(0, 1.9 * len(stack) + 0.6)
    ax.axis("off")
    ax.set_title("turingbox: the data path (arrows: what each layer hands on; a layer imports only those below it)",
                 fontsize=11)
    for i, layer in enumerate(stack):
        y = 1.9 * (len(stack) - 1 - i) + 0.3
        width = 10.6 / len(layer)
        for j, module in enumerate(layer):
            x = 0.2 + j * width
            ax.add_patch(FancyBboxPatch((x, y), width - 0.25, 1.5, boxstyle="round,pad=0.02",
                                        fc="#e8f0fb" if "plugin" not in module else "#fbeee8", ec="#345"))
            mods = modules_under(module)
            named += [f"{module}.{m}" if package_dir(module) and not package_dir(module).endswith(".py")
                      else module for m in mods]
            ax.text(x + 0.1, y + 1.3, module, fontsize=9.5, weight="bold", va="top")
            per_line = max(1, int(width * 2.2))
            text = "\n".join(", ".join(mods[k:k + per_line]) for k in range(0, len(mods), per_line))
            ax.text(x + 0.1, y + 1.0, text, fontsize=6.5, va="top", family="monospace")
        if i < len(stack) - 1:
            ax.annotate("", xy=(5.4, y - 0.35), xytext=(5.4, y + 0.0),
                        arrowprops=dict(arrowstyle="<-", color="#345"))
    # the plugin: beside the engine, reached only through its contract
    plugin_mods = modules_under("turingbox_plugin")
    named += [f"turingbox_plugin.{m}" for m in plugin_mods]
    ax.add_patch(FancyBboxPatch((11.1, 0.3), 3.7, 1.9 * len(stack) - 0.4, boxstyle="round,pad=0.02",
                                fc="#fbeee8", ec="#734"))
    ax.text(11.2, 1.9 * len(stack) - 0.2, "turingbox_plugin (in vLLM's processes)", fontsize=9.5, weight="bold",
            va="top")
    ax.text(11.2, 1.9 * len(stack) - 0.6, "\n".join(plugin_mods), fontsize=6.5, va="top", family="monospace")
    ax.text(11.2, 0.45, "contract.py: additional_config keys,\nstatus files, ModelConfig", fontsize=7.5)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return named


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "architecture.png"))
    a = p.parse_args(argv)
    named = draw(a.out)
    print(f"{a.out}: {len(named)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
