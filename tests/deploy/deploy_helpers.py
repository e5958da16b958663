"""Shared by tests/deploy (a uniquely named module, not conftest: other test folders have their own conftest)."""
from __future__ import annotations

import os
import re
import shutil
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "ci"))

import k8s_validate  # noqa: E402  (tools/ci, on the path just above)

K8S = k8s_validate.K8S
FIXTURE = os.path.join(REPO, "tests", "fixtures", "vllm-0.21.0-metrics.txt")
METRICS_PY = os.path.join(REPO, "entrypoint", "turingbox", "serve", "metrics.py")


def need(tool: str) -> str:
    """A command-line tool: CI must have it (.ci/run installs it); elsewhere its tests skip."""
    path = shutil.which(tool) or shutil.which(tool, path=os.path.dirname(sys.executable))
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed (.ci/run installs it)")
        pytest.skip(f"{tool} is not installed here")
    return path


def need_module(name: str):
    try:
        return __import__(name)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"python package {name} is not installed (.ci/run installs it)")
        pytest.skip(f"python package {name} is not installed here")


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


# ---- series names: what /metrics serves

def turingbox_series() -> set[str]:
    """Sample names turingbox exposes, read from metrics.py's metric declarations."""
    src = open(METRICS_PY).read()
    names: set[str] = set()
    for kind, name in re.findall(r'\b(Counter|Gauge|Histogram|CounterMetricFamily|GaugeMetricFamily)\(\s*"([a-z_:]+)"', src):
        if kind in ("Counter", "CounterMetricFamily"):
            names |= {name + "_total", name + "_created"}
        elif kind == "Histogram":
            names |= {name + "_bucket", name + "_count", name + "_sum", name + "_created"}
        else:
            names.add(name)
    return names


def vllm_series() -> set[str]:
    """Sample names on the recorded vLLM 0.21 page."""
    with open(FIXTURE) as f:
        return {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0) for line in f if line.strip() and line[0] != "#"}


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan", "le"}


def promql_series(expr: str) -> set[str]:
    """Metric names an expression reads (label matchers, groupings, ranges, strings and functions removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                   # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                                 # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                                # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)                                     # Grafana variables
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue                                                # a function or a keyword
        names.add(m.group(0))
    return names
