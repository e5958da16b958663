"""doctor's gpus line and the planner's refusal for a GPU below compute capability 7.5: one sentence that names
the GPU, its capability and the minimum (issue 34: "... has compute capability 7.0 is below 7.5" was not one)."""
from __future__ import annotations

import os
import subprocess
import sys

from turingbox_plugin.doctor import FAIL, PASS, WARN, check_gpus

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
V100 = {"index": 0, "name": "Tesla V100-SXM2-32GB", "compute_capability": "7.0", "memory_total_mib": 32768}
T4 = {"index": 0, "name": "Tesla T4", "compute_capability": "7.5", "memory_total_mib": 15360}


def test_one_gpu_below_the_minimum():
    c = check_gpus([V100])
    assert c.status == FAIL
    assert c.detail == ("GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0 (sm_70), below the minimum of 7.5 "
                        "(sm_75) that FlashInfer and vLLM 0.21's AWQ-Marlin need.")


def test_several_gpus_below_the_minimum_are_named_once_each():
    c = check_gpus([V100, {**V100, "index": 1}])
    assert c.status == FAIL and c.detail.startswith("GPUs 0, 1 (Tesla V100-SXM2-32GB) have compute capability 7.0 (sm_70), ")


def test_supported_and_mixed_gpus_are_not_refused():
    assert check_gpus([T4]).status == PASS
    # capabilities compare as numbers: 10.0 is not below 7.5
    assert check_gpus([{**T4, "name": "NVIDIA B200", "compute_capability": "10.0"}]).status == PASS
    assert check_gpus([T4, {**V100, "index": 1}]).status == WARN


def test_the_planner_refuses_a_v100_in_one_sentence():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    r = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--gpus-json",
                        os.path.join(REPO, "tests", "fixtures", "gpus", "1xv100.json")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "is below" not in line
    assert line.endswith("no usable GPU: Tesla V100-SXM2-32GB has compute capability 7.0 (sm_70), below the minimum "
                         "of 7.5 (sm_75) that FlashInfer and vLLM 0.21's AWQ-Marlin need."), line
