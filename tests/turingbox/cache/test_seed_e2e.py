"""`turingbox warmup --seed-only` end to end on CPU: the real CLI, the real planner (GPU inventory
from a fixture, the Qwen3.6-27B config), serve's launcher and supervisor, and a real HTTP engine
process (tests/support/fake_vllm.py behind engine_filling_caches.py, which writes cache artefacts
where the environment points it, as vLLM would)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import turingbox
from turingbox.cache import store
from turingbox_warmup.seed_protocol import RESULT_PREFIX, STAGE_PREFIX, STAGES
from tests.support.cache_helpers import turingbox_temporaries
from tests.support.waiting import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
ENGINE = os.path.join(REPO, "tests", "support", "engine_filling_caches.py")
H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")
# The real architecture (shipped as package data: entrypoint/turingbox/data/qwen3.6-27b.json).
QWEN36_CONFIG = os.path.join(os.path.dirname(turingbox.__file__), "data", "qwen3.6-27b.json")
ARTEFACTS = ("triton/KERNELHASH/_zero_kv_blocks_kernel.cubin", "triton/KERNELHASH/chunk_fwd.autotune.json",
             "vllm/torch_compile_cache/abc123/rank_0_0/backbone/artifact_shape_None_subgraph_0",
             "inductor/fxgraph/xy/entry")


@pytest.fixture
def box(tmp_path, private_tmpdir):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(QWEN36_CONFIG, model / "config.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "FAKE_VLLM_", "ENGINE_FAIL_"))}
    env.update({
        "TURINGBOX_VLLM_COMMAND": f"{sys.executable} {ENGINE}",
        "TURINGBOX_CACHE_DIR": str(tmp_path / "cache"),
        "TURINGBOX_RUNTIME_DIR": str(tmp_path / "runtime"),
        "TURINGBOX_MODELS_DIR": str(tmp_path / "models"),
        "TURINGBOX_GPUS_JSON": H200,
        "TURINGBOX_MODEL": str(model),
        "FAKE_VLLM_EVENTS": str(tmp_path / "events.jsonl"),
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": private_tmpdir,       # where warmup's own runtime dir and private copies go
    })
    return {"tmp": tmp_path, "env": env, "root": str(tmp_path / "cache"), "tmpdir": private_tmpdir}


def warmup(box, *args, extra_env=None, popen=False):
    cmd = [sys.executable, "-m", "turingbox", "warmup", *args]
    env = {**box["env"], **(extra_env or {})}
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)


def expected_plan(box):
    from tests.support.plan_factory import plan_from_env
    return plan_from_env(box["env"])


def stages_of(stdout):
    return [l[len(STAGE_PREFIX):].split()[0] for l in stdout.splitlines() if l.startswith(STAGE_PREFIX)]


def result_of(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None


def engine_pids(box):
    path = box["tmp"] / "events.jsonl"
    if not path.exists():
        return []
    return [e["pid"] for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "started"]


def engine_argvs(box):
    path = box["tmp"] / "events.jsonl"
    return [e["argv"] for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "started"]


def dead(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is dead all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def gone(pid, timeout=5.0) -> bool:
    try:
        return wait_until(lambda: dead(pid), timeout, what=f"pid {pid} to exit")
    except AssertionError:
        return False


def assert_incomplete(box, key):
    entry = store.entry_dir(box["root"], key)
    manifest = json.load(open(os.path.join(entry, "manifest.json")))
    assert manifest["completed"] is None and manifest["key"] == key
    assert not os.path.exists(os.path.join(entry, "index.json"))
    assert store.entry_problems(entry, key) == ["entry is incomplete (its manifest was never completed)"]
    return manifest


def test_seed_only_leaves_a_complete_verified_entry_that_serve_then_hits(box):
    plan = expected_plan(box)
    key = plan.cache_key
    r = warmup(box, "--seed-only")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # The engine compiled its graphs (an empty entry), so the seed starts it once more, loading them as serve will.
    engine_stages = ["engine-start", "engine-ready", "strict-warmup", "active-warmup", "engine-stop"]
    assert stages_of(r.stdout) == ["plan", "cache", *engine_stages, "loading-start", *engine_stages, "complete"]
    assert set(stages_of(r.stdout)) == set(STAGES) - {"download"}   # download: hub ids only
    assert "vLLM compiled 2 graph(s); starting it once more" in r.stdout
    assert r.stdout.count("engine_filling_caches: wrote") == 2   # the engine really ran, twice
    assert 'found []' in r.stdout and 'found ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"]' in r.stdout
    assert len(engine_pids(box)) == 2
    # Neither start was given a KV size (kv_size_from_cache is off by default); the second, loading, records what it
    # profiled all the same, which the next start of this plan is given with the setting on (issue 35).
    assert r.stdout.count("KV cache size: vLLM profiles memory at this start (kv_size_from_cache is off)") == 2
    assert not any("--kv-cache-memory-bytes" in argv for argv in engine_argvs(box))
    assert r.stdout.count("recorded the KV cache size vLLM profiled, 10.00 GiB") == 1
    result = result_of(r.stdout)
    assert result["cache_key"] == key and result["mode"] == "shared" and result["result"] == "miss"
    assert result["gpu_name"] == "NVIDIA H200" and result["num_speculative_tokens"] == plan.num_speculative_tokens

    entry = store.entry_dir(box["root"], key)
    manifest = json.load(open(os.path.join(entry, "manifest.json")))
    assert manifest["completed"] and manifest["inputs"] == plan.cache_inputs and manifest["source"] == "seeded"
    [record] = manifest["kv_cache"].values()              # one signature: the seed's argv and environment
    assert record["bytes"] == 10 << 30                    # the stand-in's "profiled" size
    assert manifest["sizes"]["triton"]["files"] == 2 and manifest["sizes"]["vllm"] == {"files": 1, "bytes": 512}
    index = json.load(open(os.path.join(entry, "index.json")))
    assert set(ARTEFACTS) <= set(index)                          # what the engine wrote, under the entry
    assert store.entry_problems(entry, key, deep=True) == []
    verify = subprocess.run([sys.executable, "-m", "turingbox", "cache", "verify", "--json"], env=box["env"],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and json.loads(verify.stdout)["entries"][key]["ok"]
    assert all(gone(pid) for pid in engine_pids(box))           # the engine was stopped
    assert turingbox_temporaries(box["tmpdir"]) == []           # its mkdtemp runtime dir went with it

    # What serve does next: the same plan finds a hit for every cache the engine filled.
    from tests.support.plan_factory import cache_settings
    session = store.prepare_cache(plan, cache_settings(box["root"]))
    assert session.status["result"] == "hit" and session.status["caches"]["triton"] == "hit"
    assert session.status["caches"]["vllm"] == "hit"
    session.finish(True)

    # Without --seed-only a complete entry is reported and no engine is started.
    again = warmup(box)
    assert again.returncode == 0 and stages_of(again.stdout) == ["plan", "cache", "complete"]
    assert "engine_filling_caches" not in again.stdout and result_of(again.stdout)["result"] == "hit"

    # --seed-only warms the complete entry again: one start, which loads, given the recorded KV size as serve is
    # with the setting on
    reseed = warmup(box, "--seed-only", "--kv-size-from-cache", "1")
    assert reseed.returncode == 0, reseed.stdout[-2000:] + reseed.stderr[-2000:]
    assert "KV cache size from the cache entry: 10.00 GiB (--kv-cache-memory-bytes 10737418240)" in reseed.stdout
    argv = engine_argvs(box)[-1]
    assert len(engine_argvs(box)) == 3 and argv[argv.index("--kv-cache-memory-bytes") + 1] == str(10 << 30)
    assert "recorded the KV cache size" not in reseed.stdout      # given it: nothing measured


@pytest.mark.parametrize("fault, value, sentence", [
    ("fail-at", "compiling", "vLLM exited before it was ready (exit code 3)"),
    ("plugin", "fail", "Strict warmup did not pass: worker 0 warmup failed: fake warmup failure"),
    ("jit-after-ready", "rejection_greedy_sample_kernel=2",
     "Strict warmup did not pass: worker 0 compiled after ready: rejection_greedy_sample_kernel"),
])
def test_a_failed_seed_leaves_the_entry_incomplete_and_says_why(box, fault, value, sentence):
    key = expected_plan(box).cache_key
    r = warmup(box, "--seed-only", extra_env={"FAKE_VLLM_" + fault.upper().replace("-", "_"): value})
    assert r.returncode == 1
    errors = [l for l in r.stderr.splitlines() if l.startswith("turingbox: ")]
    assert len(errors) == 1 and sentence in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert "complete" not in stages_of(r.stdout) and result_of(r.stdout) is None
    manifest = assert_incomplete(box, key)
    assert manifest["attempts"] == 1
    # What the engine compiled before failing is kept for the next attempt.
    assert os.path.exists(os.path.join(store.entry_dir(box["root"], key), ARTEFACTS[0]))
    assert all(gone(pid) for pid in engine_pids(box))
    assert turingbox_temporaries(box["tmpdir"]) == []


def test_a_failed_second_start_leaves_the_entry_incomplete_and_says_which_start(box):
    key = expected_plan(box).cache_key
    r = warmup(box, "--seed-only", extra_env={"ENGINE_FAIL_WHEN_LOADED": "capturing"})
    assert r.returncode == 1
    assert stages_of(r.stdout)[:8] == ["plan", "cache", "engine-start", "engine-ready", "strict-warmup",
                                       "active-warmup", "engine-stop", "loading-start"]
    errors = [l for l in r.stderr.splitlines() if l.startswith("turingbox: ")]
    assert len(errors) == 1 and "The seed's second (loading) start failed: vLLM exited before it was ready" in errors[0]
    assert "Traceback" not in r.stderr and result_of(r.stdout) is None
    assert_incomplete(box, key)
    assert len(engine_pids(box)) == 2 and all(gone(pid) for pid in engine_pids(box))
    assert turingbox_temporaries(box["tmpdir"]) == []            # both starts' runtime folders are gone


def test_a_seed_after_a_failed_one_resumes_and_completes_the_same_entry(box):
    key = expected_plan(box).cache_key
    assert warmup(box, "--seed-only", extra_env={"FAKE_VLLM_FAIL_AT": "capturing"}).returncode == 1
    assert_incomplete(box, key)
    r = warmup(box, "--seed-only")
    assert r.returncode == 0, r.stderr
    assert "incomplete (attempt 2)" in r.stdout
    # The failed attempt left the compiled graphs: this start loaded them, so one start is enough.
    assert "loading-start" not in stages_of(r.stdout) and len(engine_pids(box)) == 2
    manifest = json.load(open(os.path.join(store.entry_dir(box["root"], key), "manifest.json")))
    assert manifest["completed"] and manifest["attempts"] == 2


def test_sigterm_during_a_seed_stops_the_engine_and_leaves_the_entry_incomplete(box):
    key = expected_plan(box).cache_key
    proc = warmup(box, "--seed-only", extra_env={"FAKE_VLLM_STARTUP_SECONDS": "60"}, popen=True)
    try:
        wait_until(lambda: engine_pids(box) or proc.poll() is not None, 30, what="the engine to start")
        pids = engine_pids(box)
        assert pids, "the engine never started"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    assert f"Seeding cache entry {key} was interrupted by SIGTERM; the entry stays incomplete." in err
    assert "Traceback" not in err
    assert stages_of(out)[-1] == "engine-stop"
    assert gone(pids[0])
    assert_incomplete(box, key)
    assert turingbox_temporaries(box["tmpdir"]) == []


def test_a_seed_in_a_private_copy_removes_the_copy_when_it_exits(box):
    """Another process holds the entry: warmup seeds a private copy in TMPDIR, cannot publish it, says so,
    and leaves nothing behind in TMPDIR (a restarting job would otherwise pile copies up)."""
    import filelock
    key = expected_plan(box).cache_key
    os.makedirs(os.path.join(box["root"], "locks"))
    with filelock.FileLock(os.path.join(box["root"], "locks", f"{key}.lock")):
        r = warmup(box, "--seed-only", extra_env={"TURINGBOX_CACHE_LOCK_WAIT": "0.2"})
    assert r.returncode == 1, r.stderr
    result = result_of(r.stdout)
    assert result["mode"] == "private" and result["entry"].startswith(box["tmpdir"] + os.sep)
    assert "engine_filling_caches: wrote" in r.stdout           # the engine really filled the private copy
    assert turingbox_temporaries(box["tmpdir"]) == []
    assert "warmed in private mode in a temporary copy" in r.stderr
    assert not os.path.exists(store.entry_dir(box["root"], key))   # the busy shared entry was never touched


def test_warmup_of_a_hub_id_downloads_it_first_then_seeds_the_snapshot(box):
    """TURINGBOX_MODEL=<owner>/<name>: warmup (make warmup-cache, the Kubernetes Job) fetches the model into the
    models volume from the hub (tests/support/hub_server.py, a real HTTP server answering as the hub does) in its
    `download` stage, as serve does, before the engine starts on the snapshot directory; offline with the volume
    filled it makes no request."""
    from tests.support.hub_server import FakeHub
    from turingbox.model import hub

    repo = "test-org/qwen36-config"
    with open(QWEN36_CONFIG, "rb") as f:
        files = {"config.json": f.read(), "model.safetensors": os.urandom(3 << 20)}
    fake = FakeHub().start()
    try:
        commit = fake.add_repo(repo, files, lfs=("model.safetensors",))
        models = str(box["tmp"] / "models")
        env = {"TURINGBOX_MODEL": repo, "HF_ENDPOINT": fake.url, "HF_HOME": str(box["tmp"] / "hf-home"),
               "HF_HUB_OFFLINE": "", "HF_TOKEN": ""}
        r = warmup(box, "--seed-only", extra_env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        snapshot = hub.snapshot_dir(hub.hub_cache(models), repo, commit)
        assert stages_of(r.stdout)[:3] == ["plan", "download", "cache"]
        assert f"turingbox: downloading {repo}: 100% (" in r.stdout, r.stdout[-3000:]
        with open(os.path.join(snapshot, "model.safetensors"), "rb") as f:
            assert f.read() == files["model.safetensors"]
        started = [json.loads(l) for l in (box["tmp"] / "events.jsonl").read_text().splitlines()]
        argvs = [e["argv"] for e in started if e["event"] == "started"]
        assert argvs and all(a[1] == snapshot for a in argvs), argvs
        result = result_of(r.stdout)
        assert result["result"] == "miss" and store.entry_problems(result["entry"], result["cache_key"]) == []

        fake.requests.clear()
        again = warmup(box, extra_env={**env, "HF_HUB_OFFLINE": "1"})
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert stages_of(again.stdout) == ["plan", "download", "cache", "complete"] and fake.requests == []
    finally:
        fake.close()
