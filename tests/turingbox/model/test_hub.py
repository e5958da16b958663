"""Models by Hugging Face id (turingbox.model.hub): real huggingface_hub code against a real HTTP server that answers
as the hub does (tests/support/hub_server.py), laying out a real hub cache; then `turingbox plan` on it. No request leaves
the machine: every call names the stand-in's endpoint, and the subprocesses get it as HF_ENDPOINT."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import huggingface_hub
from huggingface_hub import constants as hf_constants
import pytest

from tests.support.hub_server import FakeHub
from turingbox.errors import UsageError
from turingbox.model import hub

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIG = os.path.join(REPO, "tests", "fixtures", "serve", "qwen36-27b", "config.json")
H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")
MODEL = "test-org/tiny-qwen"
MiB = 1 << 20


@pytest.fixture(autouse=True)
def online(monkeypatch, tmp_path):
    """The developer's HF_* settings stay out: online, no token (nor a saved one), unless a test sets them."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


@pytest.fixture
def fake():
    with open(CONFIG, "rb") as f:
        config = f.read()
    h = FakeHub().start()
    h.weights = os.urandom(24 * MiB)             # larger than huggingface_hub's 10 MiB write chunk
    h.files = {"config.json": config, "tokenizer_config.json": b'{"model_max_length": 262144}',
               "model.safetensors": h.weights, "pytorch_model.bin": b"\0" * 4096}
    h.commit = h.add_repo(MODEL, h.files, lfs=("model.safetensors", "pytorch_model.bin"))
    yield h
    h.close()


def models(tmp_path) -> str:
    return str(tmp_path / "models")


def blobs(tmp_path) -> str:
    return os.path.join(hub.storage_dir(hub.hub_cache(models(tmp_path)), MODEL), "blobs")


def incomplete(tmp_path) -> list[str]:
    d = blobs(tmp_path)
    return sorted(n for n in os.listdir(d) if n.endswith(".incomplete")) if os.path.isdir(d) else []


def download(fake, tmp_path, progress=None) -> str:
    source = hub.model_config(MODEL, None, models(tmp_path), write=True, endpoint=fake.url)
    return hub.ensure_snapshot(source.path, progress=progress, endpoint=fake.url)


def test_serve_side_download_is_huggingface_hubs_own_cache_with_progress(fake, tmp_path):
    seen: list[hub.Progress] = []
    path = download(fake, tmp_path, seen.append)
    cache = hub.hub_cache(models(tmp_path))
    assert path == hub.snapshot_dir(cache, MODEL, fake.commit)
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        with open(os.path.join(path, name), "rb") as f:
            assert f.read() == fake.files[name], name
    # safetensors are there, so vLLM never loads the .bin: it is not fetched
    assert not os.path.exists(os.path.join(path, "pytorch_model.bin")) and not fake.gets("pytorch_model.bin")
    assert incomplete(tmp_path) == []
    # huggingface_hub itself reads the layout back: refs/main, the snapshot, every file, without a request
    assert huggingface_hub.snapshot_download(MODEL, cache_dir=cache, local_files_only=True) == path
    assert huggingface_hub.try_to_load_from_cache(MODEL, "model.safetensors", cache_dir=cache) == \
        os.path.join(path, "model.safetensors")
    info = {r.repo_id: r for r in huggingface_hub.scan_cache_dir(cache).repos}[MODEL]
    (revision,) = info.revisions
    assert revision.commit_hash == fake.commit and revision.refs == frozenset({"main"}) and revision.nb_files == 3
    # progress: from config.json alone (fetched for the plan) up to every byte and file, never backwards
    total = sum(len(fake.files[n]) for n in ("config.json", "tokenizer_config.json", "model.safetensors"))
    assert seen[0].bytes_done == len(fake.files["config.json"]) and seen[0].files_done == 1
    assert seen[-1].bytes_done == seen[-1].bytes_total == total and seen[-1].files_done == seen[-1].files_total == 3
    assert all(a.bytes_done <= b.bytes_done and a.files_done <= b.files_done for a, b in zip(seen, seen[1:]))
    assert seen[-1].to_dict()["percent"] == 100.0 and seen[-1].bytes_per_s
    # complete: a second call needs no request at all
    before = len(fake.requests)
    assert hub.is_complete(path) and hub.ensure_snapshot(path, endpoint=fake.url) == path
    assert len(fake.requests) == before


def test_an_interrupted_download_resumes_where_it_stopped(fake, tmp_path):
    fake.cut["model.safetensors"] = 15 * MiB          # sends 15 MiB, drops the connection, then answers 500
    with pytest.raises(hub.HubUnavailable) as broke:
        download(fake, tmp_path)
    message = str(broke.value)
    assert broke.value.exit_code == 1 and "\n" not in message and "model.safetensors" in message, message
    (part,) = incomplete(tmp_path)                    # what arrived stays, under huggingface_hub's old name
    kept = os.path.getsize(os.path.join(blobs(tmp_path), part))
    assert 0 < kept <= 15 * MiB
    assert part == hashlib.sha256(fake.weights).hexdigest() + ".incomplete"
    snapshot = hub.snapshot_dir(hub.hub_cache(models(tmp_path)), MODEL, fake.commit)
    assert not os.path.exists(os.path.join(snapshot, "model.safetensors")) and not hub.is_complete(snapshot)

    fake.cut.clear()
    first_get = len(fake.gets("model.safetensors"))
    assert hub.ensure_snapshot(snapshot, endpoint=fake.url) == snapshot
    resumed = fake.gets("model.safetensors")[first_get:]
    assert [r.headers.get("range") for r in resumed] == [f"bytes={kept}-"]     # one request, for the rest only
    with open(os.path.join(snapshot, "model.safetensors"), "rb") as f:
        assert f.read() == fake.weights
    assert incomplete(tmp_path) == [] and hub.is_complete(snapshot)


def test_a_download_that_does_not_match_the_listing_is_deleted_not_linked(fake, tmp_path):
    fake.corrupt.add("model.safetensors")
    with pytest.raises(hub.HubUnavailable, match=r"model\.safetensors of test-org/tiny-qwen as downloaded has "
                                                 r"sha256 [0-9a-f]{64}, not the [0-9a-f]{64} the hub lists"):
        download(fake, tmp_path)
    snapshot = hub.snapshot_dir(hub.hub_cache(models(tmp_path)), MODEL, fake.commit)
    assert incomplete(tmp_path) == [] and not os.path.exists(os.path.join(snapshot, "model.safetensors"))
    assert hashlib.sha256(fake.weights).hexdigest() not in os.listdir(blobs(tmp_path))
    fake.corrupt.clear()
    assert hub.ensure_snapshot(snapshot, endpoint=fake.url) == snapshot and hub.is_complete(snapshot)


def test_a_small_file_is_checked_against_its_git_blob_id(fake, tmp_path):
    fake.corrupt.add("config.json")
    with pytest.raises(hub.HubUnavailable, match="git blob id"):
        hub.model_config(MODEL, None, models(tmp_path), write=False, endpoint=fake.url)     # into memory
    with pytest.raises(hub.HubUnavailable, match="git blob id"):
        hub.model_config(MODEL, None, models(tmp_path), write=True, endpoint=fake.url)      # into the volume
    assert incomplete(tmp_path) == []


OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_offline_serves_the_volume_and_names_what_is_missing(fake, tmp_path):
    path = download(fake, tmp_path)
    before = len(fake.requests)
    source = hub.model_config(MODEL, None, models(tmp_path), write=False, env=OFFLINE)
    assert source.path == path and source.missing == () and "all 3 files" in source.note
    assert hub.ensure_snapshot(path, env=OFFLINE) == path
    assert len(fake.requests) == before                       # not one request

    os.unlink(os.path.join(path, "model.safetensors"))        # the volume lost the weights
    with pytest.raises(UsageError) as missing:
        hub.ensure_snapshot(path, env=OFFLINE)
    sentence = str(missing.value)
    assert missing.value.exit_code == 2 and "\n" not in sentence
    assert sentence.startswith("--model/TURINGBOX_MODEL test-org/tiny-qwen is incomplete in the models volume: "
                               "1 of its 3 files are missing (model.safetensors, 0.02 GiB) and HF_HUB_OFFLINE is set; ")
    assert f"`hf download {MODEL} --cache-dir {hub.hub_cache(models(tmp_path))}`" in sentence
    assert "serve cannot start" in hub.model_config(MODEL, None, models(tmp_path), write=False, env=OFFLINE).note
    assert len(fake.requests) == before


def test_offline_with_nothing_in_the_volume_says_so_in_one_sentence(tmp_path):
    with pytest.raises(UsageError) as err:
        hub.model_config(MODEL, "v2", models(tmp_path), write=True, env=OFFLINE)
    cache = hub.hub_cache(models(tmp_path))
    assert str(err.value) == (
        f"--model/TURINGBOX_MODEL {MODEL} (revision v2) is not in the models volume ({cache}) and HF_HUB_OFFLINE is "
        f"set, so it cannot be downloaded; start once with network access (HF_HUB_OFFLINE unset) to download it, or "
        f"fill the volume with `hf download {MODEL} --revision v2 --cache-dir {cache}`.")
    assert not os.path.exists(models(tmp_path))               # nothing written


def test_hub_errors_name_the_setting(fake, tmp_path, monkeypatch):
    def refusal(repo, revision=None) -> UsageError:
        with pytest.raises(UsageError) as err:
            hub.model_config(repo, revision, models(tmp_path), write=False, endpoint=fake.url)
        assert "\n" not in str(err.value)
        return err.value

    assert str(refusal("test-org/nope")).startswith(
        f"--model/TURINGBOX_MODEL test-org/nope is not a model on the Hugging Face hub ({fake.url}), or it is private "
        "and HF_TOKEN is not set")
    assert str(refusal(MODEL, "v9")) == (f"--model-revision/TURINGBOX_MODEL_REVISION v9 is not a branch, tag or commit "
                                         f"of {MODEL} on the Hugging Face hub ({fake.url}).")
    fake.add_repo("test-org/private", {"config.json": fake.files["config.json"]}, token="hf_secret")
    assert "HF_TOKEN is not set" in str(refusal("test-org/private"))
    # HF_TOKEN is honoured (huggingface_hub reads it itself) on the listing and on every file
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    before = len(fake.requests)
    source = hub.model_config("test-org/private", None, models(tmp_path), write=True, endpoint=fake.url)
    assert source.config["model_type"] and hub.ensure_snapshot(source.path, endpoint=fake.url) == source.path
    private = fake.requests[before:]
    assert private and all(r.headers.get("authorization") == "Bearer hf_secret" for r in private)


def test_an_unreachable_hub_is_exit_1_unless_the_volume_has_the_model(fake, tmp_path):
    with pytest.raises(hub.HubUnavailable) as err:
        hub.model_config(MODEL, None, models(tmp_path), write=True, endpoint=closed_port_url())
    assert err.value.exit_code == 1 and "cannot be reached" in str(err.value) and "HF_HUB_OFFLINE=1" in str(err.value)
    path = download(fake, tmp_path)
    source = hub.model_config(MODEL, None, models(tmp_path), write=True, endpoint=closed_port_url())
    assert source.path == path and "the hub could not be reached" in source.note


def closed_port_url() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_snapshot_paths_name_their_repo_and_commit():
    commit = "0123456789abcdef0123456789abcdef01234567"
    path = hub.snapshot_dir("/m/huggingface/hub", "Qwen/Qwen3.6-27B-AWQ", commit)
    assert path == f"/m/huggingface/hub/models--Qwen--Qwen3.6-27B-AWQ/snapshots/{commit}"
    assert hub.parse_snapshot_dir(path) == ("/m/huggingface/hub", "Qwen/Qwen3.6-27B-AWQ", commit)
    for other in ("/models/qwen", f"/m/models--Qwen--Qwen3/snapshots/{commit[:12]}",
                  f"/m/datasets--a--b/snapshots/{commit}"):
        assert hub.parse_snapshot_dir(other) is None, other
    assert hub.is_complete(path) is False


# ---- `turingbox plan` on a hub id ---------------------------------------------------------------------

def plan_cli(tmp_path, hub_url: str | None, *args: str, offline: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "HF_"))}
    env.update({"TURINGBOX_MODEL": MODEL, "TURINGBOX_MODELS_DIR": models(tmp_path),
                "TURINGBOX_CACHE_DIR": str(tmp_path / "cache"), "HF_ENDPOINT": hub_url or closed_port_url(),
                "HF_HOME": str(tmp_path / "hf-home")})
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "turingbox", "plan", "--gpus-json", H200, *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_plan_plans_from_the_hubs_config_and_writes_nothing(fake, tmp_path):
    r = plan_cli(tmp_path, fake.url, "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    snapshot = hub.snapshot_dir(hub.hub_cache(models(tmp_path)), MODEL, fake.commit)
    assert plan["model"] == snapshot and plan["served_model_name"] == MODEL
    argv = plan["vllm_args"]
    assert argv[:2] == ["serve", snapshot] and argv[argv.index("--served-model-name") + 1] == MODEL
    assert plan["reasons"][0] == (
        f"model: {MODEL} from the Hugging Face hub (revision main, commit {fake.commit[:12]}): serve would download "
        f"3 of its 3 files (0.02 GiB) into {snapshot} before it starts vLLM; `turingbox plan` read only config.json "
        "from the hub and wrote nothing.")
    assert not os.path.exists(models(tmp_path))                       # the contract: plan writes nothing
    assert not fake.gets("model.safetensors") and len(fake.gets("config.json")) == 1

    # the same numbers as a plan of the same config.json in a plain directory
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_bytes(fake.files["config.json"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "HF_"))}
    r2 = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--gpus-json", H200, "--json",
                         "--model", str(local)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0, r2.stderr
    other = json.loads(r2.stdout)
    for key in ("tensor_parallel_size", "max_model_len", "max_num_seqs", "gpu_memory_utilization", "memory",
                "num_speculative_tokens", "kv_cache_dtype", "attention_backend", "dtype"):
        assert plan[key] == other[key], key

    # once serve downloaded it, plan reads the volume, and offline too (no request then)
    download(fake, tmp_path)
    r3 = plan_cli(tmp_path, None, offline=True)
    assert r3.returncode == 0, r3.stderr
    assert f"model: {MODEL} from the models volume at {snapshot} (revision main, HF_HUB_OFFLINE is set): all 3 " \
           "files (0.02 GiB) are there." in r3.stdout
    assert re.search(rf"\n  served as +{re.escape(MODEL)}\n", r3.stdout), r3.stdout


def test_a_hub_model_with_only_pytorch_weights_plans_vllms_own_auto_load_format(fake, tmp_path):
    """runai_streamer and safetensors read only *.safetensors: the hub's listing says none are there."""
    fake.add_repo(MODEL, {"config.json": fake.files["config.json"], "pytorch_model.bin": b"\0" * 4096},
                  lfs=("pytorch_model.bin",))
    plan = json.loads(plan_cli(tmp_path, fake.url, "--json").stdout)
    assert plan["load_format"] == "auto"
    argv = plan["vllm_args"]
    assert argv[argv.index("--load-format") + 1] == "auto"
    fake.add_repo(MODEL, fake.files, lfs=("model.safetensors", "pytorch_model.bin"))   # safetensors beside it
    assert json.loads(plan_cli(tmp_path, fake.url, "--json").stdout)["load_format"] != "auto"


def test_plan_offline_with_nothing_in_the_volume_exits_2_with_one_sentence(tmp_path):
    r = plan_cli(tmp_path, None, offline=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"turingbox: --model/TURINGBOX_MODEL {MODEL} (revision main) is not in the models volume")
    assert "HF_HUB_OFFLINE is set" in line and f"`hf download {MODEL} --cache-dir" in line
    assert not os.path.exists(models(tmp_path))
