"""bench/gpu/hostile.py (issue 37's hostile request on the GPU) on CPU, before it costs device time: its verdict
(refused with 400, the other clients' median TTFT within MAX_RATIO of unloaded) on records shaped like the GPU run's,
then the whole script against the fake vLLM, once behind the real sidecar (which refuses n=1000) and once alone
(which answers it: the script must say so and exit 1)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import urllib.request

import pytest

from tests.support import sidecar_harness as H

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU = os.path.join(REPO, "bench", "gpu")
SCRIPT = os.path.join(GPU, "hostile.py")
sys.path.insert(0, GPU)
import hostile  # noqa: E402

# what the sidecar answered in the GPU run (status, seconds, body as the script keeps them)
REFUSED = {"status": 400, "seconds": 0.0031,
           "body": '{"error":{"message":"n is 1000; this server allows at most 8","type":"BadRequestError",'
                   '"param":"n","code":400}}'}
ANSWERED = {"status": 200, "seconds": 41.7, "body": '{"id":"chatcmpl-1","choices":[...]}'}
UNLOADED = [0.081, 0.079, 0.083, 0.080, 0.082, 0.078, 0.084, 0.080]


@pytest.mark.parametrize("answer, loaded, refused, ok", [
    (REFUSED, [0.085, 0.083, 0.088, 0.084, 0.086, 0.082, 0.087, 0.085], True, True),      # ratio 1.05
    (REFUSED, [0.19, 0.21, 0.20, 0.22, 0.18, 0.20, 0.21, 0.19], True, False),             # refused, clients slowed 2.5x
    (ANSWERED, UNLOADED, False, False),                                                   # answered: not refused at all
    ({}, UNLOADED, False, False),                                                         # the hostile thread failed
    ({"status": 429, "seconds": 0.002, "body": "{}"}, UNLOADED, False, False),            # only 400 is the refusal
])
def test_verdict(answer, loaded, refused, ok):
    v = hostile.verdict(answer, UNLOADED, loaded)
    assert v["refused"] is refused and v["ok"] is ok
    assert v["unloaded_median_s"] == 0.0805
    assert v["ratio"] == pytest.approx(statistics.median(loaded) / statistics.median(UNLOADED), abs=1e-3)


def test_verdict_ratio_bound_is_inclusive():
    assert hostile.verdict(REFUSED, [1.0], [hostile.MAX_RATIO])["ok"] is True
    assert hostile.verdict(REFUSED, [1.0], [hostile.MAX_RATIO + 0.001])["ok"] is False


def _run(url: str, out: str) -> tuple[subprocess.CompletedProcess, dict]:
    p = subprocess.run([sys.executable, SCRIPT, "--url", url, "--clients", "2", "--rounds", "2", "--out", out],
                       capture_output=True, text=True, timeout=120)
    assert os.path.exists(out), p.stdout[-3000:] + p.stderr[-3000:]
    with open(out) as f:
        return p, json.load(f)


def test_behind_the_sidecar_the_hostile_request_is_refused(tmp_path):
    serve = H.Serve(str(tmp_path / "serve"))
    try:
        serve.wait_ready(60)
        p, rec = _run(serve.url, str(tmp_path / "hostile.json"))
    finally:
        serve.close()
    assert rec["hostile_answer"]["status"] == 400 and rec["refused"] is True
    assert json.loads(rec["hostile_answer"]["body"])["error"]["param"] == "n"
    # the stand-in's TTFTs are milliseconds, so the ratio is noise here: the exit code must follow the record
    assert len(rec["unloaded_ttft_s"]) == len(rec["loaded_ttft_s"]) == 4
    assert rec["ok"] is (rec["ratio"] <= hostile.MAX_RATIO)
    assert p.returncode == (0 if rec["ok"] else 1), p.stdout + p.stderr
    assert any(l.startswith("turingbox_admission_refused") and 'reason="n"' in l and not l.endswith(" 0.0")
               for l in rec["metrics_after"]), rec["metrics_after"]


def test_without_the_sidecar_the_answer_is_not_a_refusal(tmp_path):
    port = H.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM_")}
    fake = subprocess.Popen([sys.executable, H.FAKE_VLLM, "serve", "demo", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        H.wait_until(lambda: _up(port), 30, what="the fake vLLM's /v1/models")
        p, rec = _run(f"http://127.0.0.1:{port}", str(tmp_path / "hostile.json"))
    finally:
        fake.kill()
        fake.wait(10)
    assert rec["hostile_answer"]["status"] == 200, rec["hostile_answer"]      # plain vLLM queues n=1000
    assert rec["refused"] is False and rec["ok"] is False
    assert p.returncode == 1
    assert not any(l.startswith("turingbox_admission") for l in rec["metrics_after"])


def _up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
        return True
    except OSError:
        return False
