"""`turingbox jit-report --url`: finds the workers' compile logs through a running serve's plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.sidecar_harness import REPO

pytestmark = pytest.mark.timeout(60)


def test_jit_report_reads_the_runtime_dir_from_the_plan(serve_factory):
    s = serve_factory()
    s.wait_ready()
    runtime_dir = s.get("/turingbox/plan").json()["env"]["TBPLUGIN_RUNTIME_DIR"]
    assert os.path.isdir(runtime_dir)
    with open(os.path.join(runtime_dir, "jit-keys-rank0.jsonl"), "w") as f:
        f.write(json.dumps({"kernel": "_causal_conv1d_fwd_kernel", "phase": "warmup",
                            "params": {"seqlen": "i32"}}) + "\n")
        f.write(json.dumps({"kernel": "_causal_conv1d_fwd_kernel", "phase": "after_ready",
                            "params": {"seqlen": "i32=1"}}) + "\n")
    r = subprocess.run([sys.executable, "-m", "turingbox", "jit-report", "--url", s.url], capture_output=True,
                       text=True, cwd=REPO, timeout=30)
    assert r.returncode == 1, r.stderr                 # something compiled after ready
    assert "_causal_conv1d_fwd_kernel rank 0: seqlen=i32=1 (warmup had: i32)" in r.stdout
