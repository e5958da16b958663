"""`turingbox serve --model <owner>/<name>`: a real serve process downloads the model from a stand-in hub (a real HTTP
server answering as the Hugging Face hub does, tests/support/hub_server.py) in its `downloading` stage, shown with progress in
/health/ready, then starts the stand-in vLLM on the snapshot directory under the hub id. Offline it serves what the
models volume holds, and with nothing there it exits 2 with one sentence."""
from __future__ import annotations

import os
import re
import threading

import pytest

from tests.support.hub_server import FakeHub
from tests.support.sidecar_harness import MODEL_CONFIG
from tests.support.waiting import wait_until
from turingbox.model import hub

MODEL = "test-org/tiny-qwen"
MiB = 1 << 20


@pytest.fixture
def fake():
    with open(MODEL_CONFIG, "rb") as f:
        config = f.read()
    h = FakeHub().start()
    h.weights = os.urandom(24 * MiB)
    h.files = {"config.json": config, "tokenizer_config.json": b"{}", "model.safetensors": h.weights}
    h.commit = h.add_repo(MODEL, h.files, lfs=("model.safetensors",))
    yield h
    h.close()


def hub_env(models_dir: str, endpoint: str | None, offline: bool = False) -> dict:
    return {"TURINGBOX_MODELS_DIR": models_dir, "HF_ENDPOINT": endpoint or "http://127.0.0.1:9",
            "HF_HUB_OFFLINE": "1" if offline else None, "TRANSFORMERS_OFFLINE": None, "HF_TOKEN": None,
            "HF_HOME": os.path.join(models_dir, "..", "hf-home")}


def test_serve_downloads_with_progress_then_serves_the_snapshot_under_the_hub_id(fake, serve_factory, tmp_path):
    models = str(tmp_path / "models")
    release = threading.Event()
    fake.gate["model.safetensors"] = (12 * MiB, release)      # half the weights, then wait for the test
    s = serve_factory(args=["--model", MODEL], env=hub_env(models, fake.url))

    def downloading():
        if s.proc.poll() is not None:
            raise AssertionError(f"serve exited with {s.proc.returncode}:\n{s.output()}")
        try:
            body = s.get("/health/ready", timeout=1.0).json()
        except Exception:
            return None
        p = body.get("progress") or {}
        small = len(fake.files["config.json"]) + len(fake.files["tokenizer_config.json"])
        arriving = small < p.get("bytes", 0) < p.get("total_bytes", 0)
        return body if body.get("stage") == "downloading" and arriving else None

    body = wait_until(downloading, 30, what="the downloading stage with the weights' bytes arriving")
    total = sum(len(v) for v in fake.files.values())
    p = body["progress"]
    assert p["model"] == MODEL and p["total_bytes"] == total and p["total_files"] == 3
    assert 1 <= p["files"] < 3 and 0 < p["percent"] < 100
    assert body["reason"].startswith(f"turingbox is downloading {MODEL} from the Hugging Face hub into the models "
                                     f"volume: {p['percent']:.0f}% (")
    assert body["estimate_s"] is not None
    release.set()
    s.wait_ready(30)

    snapshot = hub.snapshot_dir(hub.hub_cache(models), MODEL, fake.commit)
    (started,) = s.events("started")
    argv = started["argv"]
    assert argv[1] == snapshot and argv[argv.index("--served-model-name") + 1] == MODEL
    assert [m["id"] for m in s.get("/v1/models").json()["data"]] == [MODEL]
    log = s.output()
    assert "stage: planning -> downloading" in log and "stage: downloading -> starting" in log
    assert re.search(rf"turingbox\.hub: downloading {re.escape(MODEL)}: (\d+)% \(", log), log
    assert f"turingbox.hub: downloaded {MODEL}: 3 files" in log
    assert "Traceback" not in log and "HTTP Request:" not in log
    assert 'turingbox_startup_stage_seconds{stage="downloading"}' in s.metrics()
    with open(os.path.join(snapshot, "model.safetensors"), "rb") as f:
        assert f.read() == fake.weights

    # the next start finds the model complete in the volume: no downloading stage, and offline no request at all
    s.signal(15)
    assert s.wait_exit(30) == 0
    fake.requests.clear()
    again = serve_factory(args=["--model", MODEL], env=hub_env(models, fake.url, offline=True))
    again.wait_ready(30)
    assert "downloading" not in again.output() and fake.requests == []
    assert again.events("started")[0]["argv"][1] == snapshot


def test_serve_offline_with_nothing_in_the_volume_exits_2_with_one_sentence(serve_factory, tmp_path):
    models = str(tmp_path / "models")
    s = serve_factory(args=["--model", MODEL], env=hub_env(models, None, offline=True))
    assert s.wait_exit(30) == 2
    out = s.output()
    lines = [line for line in out.splitlines() if line.startswith("turingbox: ")]
    assert lines == [f"turingbox: --model/TURINGBOX_MODEL {MODEL} (revision main) is not in the models volume "
                     f"({hub.hub_cache(models)}) and HF_HUB_OFFLINE is set, so it cannot be downloaded; start once "
                     f"with network access (HF_HUB_OFFLINE unset) to download it, or fill the volume with `hf download "
                     f"{MODEL} --cache-dir {hub.hub_cache(models)}`."], out
    assert "Traceback" not in out and not s.events("started")
