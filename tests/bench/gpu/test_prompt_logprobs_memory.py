"""bench/gpu/prompt_logprobs_memory.py (the GPU check of the plugin's prompt-logprobs slices) on CPU, before it
costs device time: against the fake vLLM HTTP process, with an nvidia-smi stand-in on PATH that prints the used
memory a file holds (what the real one prints for --query-gpu=memory.used --format=csv,noheader,nounits)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

from tests.support.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "bench", "gpu", "prompt_logprobs_memory.py")
FAKE_VLLM = os.path.join(REPO, "tests", "support", "fake_vllm.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, growth_mib: int):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM_")}
    vllm = subprocess.Popen([sys.executable, FAKE_VLLM, "serve", "demo", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                return True
            except OSError:
                return False
        wait_until(answers, 30, interval=0.1, what="the fake vLLM's /v1/models")
        # nvidia-smi stand-in: prints the number in `used`, then adds growth_mib to it (the request's growth)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        used = tmp_path / "used"
        used.write_text("20000")
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nv=$(cat {used}); echo $v; echo $((v + {growth_mib})) > {used}\n")
        smi.chmod(0o755)
        out_json = tmp_path / "result.json"
        r = subprocess.run([sys.executable, SCRIPT, "--url", f"http://127.0.0.1:{port}", "--tokens", "400",
                            "--json", str(out_json)], env={**env, "PATH": f"{bin_dir}:{env['PATH']}"},
                           capture_output=True, text=True, timeout=60)
        return r, json.loads(out_json.read_text())
    finally:
        vllm.terminate()
        vllm.wait(timeout=10)


def test_a_request_within_budget_passes(tmp_path):
    r, res = _run(tmp_path, growth_mib=128)
    assert r.returncode == 0, r.stderr
    assert res["status"] == 200 and res["prompt_logprobs"] == 400 and res["prompt_tokens"] == 400
    assert res["growth_gib"] == 0.125 and res["ok"] is True


def test_vllms_whole_chunk_peak_fails_the_check(tmp_path):
    r, res = _run(tmp_path, growth_mib=8 * 1024)
    assert r.returncode == 1 and res["ok"] is False and res["growth_gib"] == 8.0
