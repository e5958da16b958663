"""Two serves on one host with the same TURINGBOX_RUNTIME_DIR (the planner's default is one shared path) keep
their workers' status files apart: each engine writes into a directory of its own instance, removed at exit.
Issue 15's GPU soak lost a JIT-after-ready count and its compile key this way: a second serve on the machine
rewrote worker-0.json and jit-keys-rank0.jsonl of the first."""
from __future__ import annotations

import os
import re
import signal

import pytest

pytestmark = pytest.mark.timeout(90)


def jit_total(s) -> float:
    m = re.search(r"^turingbox_jit_after_ready_total (\S+)$", s.metrics(), re.M)
    return float(m.group(1)) if m else -1.0


def test_a_second_serve_does_not_overwrite_the_first_ones_worker_status(serve_factory, tmp_path):
    shared = str(tmp_path / "runtime")
    a = serve_factory(env={"TURINGBOX_RUNTIME_DIR": shared, "FAKE_VLLM_JIT_AFTER_READY": "_kernel_a=1"})
    a.wait_ready()
    assert jit_total(a) == 1.0
    a_dir = a.get("/turingbox/plan").json()["env"]["TBPLUGIN_RUNTIME_DIR"]
    assert os.path.dirname(a_dir) == shared and os.path.isfile(os.path.join(a_dir, "worker-0.json"))

    b = serve_factory(env={"TURINGBOX_RUNTIME_DIR": shared})
    b.wait_ready()
    b_dir = b.get("/turingbox/plan").json()["env"]["TBPLUGIN_RUNTIME_DIR"]
    assert b_dir != a_dir and os.path.dirname(b_dir) == shared
    assert jit_total(b) == 0.0
    assert jit_total(a) == 1.0, "serve B's workers overwrote serve A's status"
    assert 'turingbox_jit_after_ready_by_kernel_total{kernel="_kernel_a",rank="0"} 1.0' in a.metrics()

    b.signal(signal.SIGTERM)
    assert b.wait_exit() == 0
    assert not os.path.exists(b_dir) and os.path.isdir(a_dir)       # B removed its own directory only
