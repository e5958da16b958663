"""tests/conftest.py's skip policy, on a throwaway test tree that uses it: under CI=true a skip for a missing set-up
step fails (a test's at once, a module's at collection by failing the session), a hardware skip stays a skip;
every run ends with the skip count by reason. Real pytest in a child process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFTEST = os.path.join(REPO, "tests", "conftest.py")

TESTS = '''
import pytest

def test_passes():
    pass

def test_missing_tool():
    pytest.skip("hadolint is not installed here")

def test_no_gpu():
    pytest.skip("no NVIDIA GPU found")

@pytest.mark.gpu
def test_marked_gpu():
    pytest.skip("vLLM is not installed here")

@pytest.fixture
def source():
    pytest.skip("vLLM 0.21.0's source not found")

def test_fixture_skips(source):
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False
'''
MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_package_here")\n\ndef test_never():\n    pass\n'


@pytest.fixture
def tree(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\naddopts = -ra --strict-markers\n")
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    return tmp_path


def run(tree, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    # the conftest's plugin (tests.support.docker_image) is imported from the checkout
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (REPO, env.get("PYTHONPATH"))))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tree)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "false", "0"])
def test_outside_ci_skips_are_skips_and_are_counted(tree, ci):
    r = run(tree, ci)
    assert r.returncode == 0, r.stdout
    assert "1 passed, 5 skipped, 1 xfailed" in r.stdout
    assert "skips: 5, by reason:" in r.stdout
    for reason in ("hadolint is not installed here", "no NVIDIA GPU found", "vLLM is not installed here",
                   "vLLM 0.21.0's source not found", "could not import 'no_such_package_here'"):
        assert f"     1  {reason}" in r.stdout, r.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_only_hardware_skips_stay(tree, ci):
    r = run(tree, ci)
    assert r.returncode == 1, r.stdout
    out = r.stdout
    # the module's skip still counts as a skip (pytest cannot fail a collection without stopping the run) ...
    assert "1 failed, 1 passed, 3 skipped, 1 xfailed, 1 error" in out
    assert f"skipped under CI={ci}, where only hardware skips are allowed: hadolint is not installed here" in out
    assert "FAILED test_cases.py::test_missing_tool" in out
    assert "ERROR test_cases.py::test_fixture_skips" in out          # skipped in its fixture: a setup error
    assert ("skips: 3 (and 2 failed under CI for skipping without a hardware reason), by reason:"
            in out)                                                   # the GPU ones and the module
    assert "     1  no NVIDIA GPU found" in out and "     1  vLLM is not installed here" in out
    # ... and fails the session, named
    assert "1 module(s) skipped at collection under CI, which fails this run:" in out
    assert "test_module_skip.py: skipped under CI" in out


def test_under_ci_a_run_of_only_hardware_skips_passes(tree):
    (tree / "test_module_skip.py").unlink()
    (tree / "test_cases.py").write_text('import pytest\n\ndef test_no_gpu():\n    pytest.skip("no GPU here")\n')
    r = run(tree, "true")
    assert r.returncode == 0, r.stdout
    assert "skips: 1, by reason:" in r.stdout
