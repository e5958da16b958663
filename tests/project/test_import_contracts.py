"""Imports flow down the data path (the contracts in pyproject.toml's [tool.importlinter]): the plugin stays
installable alone, and within the appliance no module imports a later stage of the data path."""
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    r = subprocess.run([exe, "--config", os.path.join(REPO, "pyproject.toml")], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
