"""Shared fixtures for the GDN kernel CPU tests."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "plugin" / "build_gdn.sh"


@pytest.fixture(scope="session")
def gdn_library(tmp_path_factory) -> Path:
    """libturingbox_gdn.so built for sm_75 only (fast) into a temp dir; skips without nvcc."""
    from turingbox_plugin.gdn.compile import find_tool

    nvcc = find_tool("nvcc")
    if not nvcc:
        pytest.skip("nvcc is not installed")
    out = tmp_path_factory.mktemp("gdnlib") / "libturingbox_gdn.so"
    env = dict(os.environ, ARCHS="75", GDN_LIB_OUT=str(out), NVCC=nvcc)
    subprocess.run(["bash", str(BUILD)], check=True, env=env, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="session")
def sm75_report():
    from turingbox_plugin.gdn import compile_report
    from turingbox_plugin.gdn.compile import find_tool

    if not find_tool("nvcc"):
        pytest.skip("nvcc is not installed")
    return compile_report("7.5")


def has_tool(name: str) -> bool:
    from turingbox_plugin.gdn.compile import find_tool

    return find_tool(name) is not None or shutil.which(name) is not None
