"""A start that never reached a real engine must not leave a "complete" cache entry (issue 34 part 4): real
`turingbox serve`, `warmup` and `cache show|verify` subprocesses on one cache root, with the stand-in vLLM
(tests/support/fake_vllm.py: it answers, and its workers' status files say warm, but it compiles nothing into
the entry) against the seeding stand-in (tests/support/engine_filling_caches.py, which writes artefacts where
the cache environment points it, as vLLM does) as the control. And on the same stand-ins, the KV cache size a
start that loaded its graphs measured, recorded in the entry and given to the next start (issue 35)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

import turingbox
from turingbox.cache import store
from turingbox_warmup.seed_protocol import RESULT_PREFIX, STAGE_PREFIX
from tests.support.cache_helpers import make_plan
from tests.support.waiting import wait_until
from tests.support.plan_factory import cache_settings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
FAKE_VLLM = os.path.join(REPO, "tests", "support", "fake_vllm.py")
FILLING_ENGINE = os.path.join(REPO, "tests", "support", "engine_filling_caches.py")
H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")
QWEN36_CONFIG = os.path.join(os.path.dirname(turingbox.__file__), "data", "qwen3.6-27b.json")


@pytest.fixture
def box(tmp_path, private_tmpdir):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(QWEN36_CONFIG, model / "config.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "FAKE_VLLM_"))}
    env.update({
        "TURINGBOX_CACHE_DIR": str(tmp_path / "cache"),
        "TURINGBOX_RUNTIME_DIR": str(tmp_path / "runtime"),
        "TURINGBOX_MODELS_DIR": str(tmp_path / "models"),
        "TURINGBOX_GPUS_JSON": H200,
        "TURINGBOX_MODEL": str(model),
        "TURINGBOX_ACTIVE_WARMUP": "0",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": private_tmpdir,
    })
    return {"tmp": tmp_path, "env": env, "root": str(tmp_path / "cache")}


def engine(path: str) -> dict:
    return {"TURINGBOX_VLLM_COMMAND": f"{sys.executable} {path}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_until_ready_then_stop(box, extra_env: dict, expect_ready: bool = True) -> str:
    """One real `turingbox serve`: wait for /health/ready, wait for the cache entry's verdict, SIGTERM; its log.
    expect_ready=False: a start whose vLLM dies; wait for serve to exit on its own."""
    port = free_port()
    log_path = box["tmp"] / f"serve-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "turingbox", "serve", "--port", str(port), "--host", "127.0.0.1"],
                                env={**box["env"], **extra_env}, stdout=log, stderr=log, start_new_session=True)
    if not expect_ready:
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode != 0, log_path.read_text()[-3000:]
        return log_path.read_text()
    try:
        deadline = time.monotonic() + 60

        def ready() -> bool:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False
        try:
            wait_until(ready, 60, interval=0.1, what="readiness")
            # serve finishes the entry right after ready, off its event loop: wait for the verdict line
            wait_until(lambda: any(s in log_path.read_text() for s in (" complete: ", "left incomplete")),
                       deadline - time.monotonic(), interval=0.1, what="the cache verdict")
        except AssertionError as e:
            raise AssertionError(f"{e}:\n" + log_path.read_text()[-3000:]) from None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    return log_path.read_text()


def turingbox_cli(box, *args, extra_env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turingbox", *args], env={**box["env"], **(extra_env or {})},
                          capture_output=True, text=True, timeout=120)


def shown(box) -> list[dict]:
    r = turingbox_cli(box, "cache", "show", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["entries"]


def stages(stdout: str) -> list[str]:
    return [line[len(STAGE_PREFIX):].split()[0] for line in stdout.splitlines() if line.startswith(STAGE_PREFIX)]


def test_serve_on_the_stand_in_leaves_no_entry_a_later_warmup_hits(box):
    out = serve_until_ready_then_stop(box, engine(FAKE_VLLM))
    assert "the engine wrote no compile artefacts into it" in out
    [row] = shown(box)
    assert row["complete"] is False and row["completed"] is None
    text = turingbox_cli(box, "cache", "show")
    assert f"{row['key']:<18}no " in text.stdout
    # `turingbox warmup` (no --seed-only) would report "entry already complete; nothing to do" on a hit: it
    # must find a miss and start the engine; on the stand-in that seed fails, saying why, and stays a miss
    r = turingbox_cli(box, "warmup", extra_env=engine(FAKE_VLLM))
    assert "entry already complete" not in r.stdout and "engine-start" in stages(r.stdout)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (f"Seeding cache entry {row['key']} left it incomplete: the engine wrote no compile artefacts into "
            f"{store.entry_dir(box['root'], row['key'])} (TURINGBOX_VLLM_COMMAND names a stand-in rather than "
            "vLLM?).") in r.stderr
    assert shown(box)[0]["complete"] is False


def test_serve_on_an_engine_that_compiles_completes_the_entry_and_warmup_hits_it(box):
    # the control: the same serve, with an engine that writes into the cache environment
    out = serve_until_ready_then_stop(box, engine(FILLING_ENGINE))
    assert "engine_filling_caches: wrote" in out and "left incomplete" not in out
    [row] = shown(box)
    assert row["complete"] is True and row["sizes"]["triton"]["files"] >= 1
    r = turingbox_cli(box, "warmup", extra_env=engine(FAKE_VLLM))
    assert r.returncode == 0, r.stderr
    assert stages(r.stdout) == ["plan", "cache", "complete"] and "entry already complete" in r.stdout
    result = json.loads([x for x in r.stdout.splitlines() if x.startswith(RESULT_PREFIX)][0][len(RESULT_PREFIX):])
    assert result["result"] == "hit"


def test_an_entry_completed_empty_by_an_older_turingbox_is_a_miss_not_a_hit(box):
    # what a stand-in start left before this fix: a completed manifest over caches no engine wrote to
    plan = json.loads(turingbox_cli(box, "plan", "--json").stdout)
    entry = store.entry_dir(box["root"], plan["cache_key"])
    for sub, _var in store.CACHES.values():
        os.makedirs(os.path.join(entry, sub))
    manifest = {**store.new_manifest(plan["cache_key"], plan["cache_inputs"], "seeded"), "completed": store.utc_now()}
    store.write_json_atomic(os.path.join(entry, store.MANIFEST), manifest)
    store.write_json_atomic(os.path.join(entry, store.INDEX), {})
    [row] = shown(box)
    assert row["complete"] is False and row["empty"] is True
    assert f"{row['key']:<18}empty " in turingbox_cli(box, "cache", "show").stdout
    verify = turingbox_cli(box, "cache", "verify", "--json")
    assert verify.returncode == 0, verify.stdout              # a miss, not corruption
    assert json.loads(verify.stdout)["entries"][row["key"]]["problems"] == [store.NO_ARTEFACTS]
    # the next start treats it as a miss and fills it; once the engine wrote artefacts it is complete
    r = turingbox_cli(box, "warmup", extra_env=engine(FILLING_ENGINE))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "was completed by a start that wrote no compile artefacts" in r.stdout
    assert "engine-start" in stages(r.stdout) and shown(box)[0]["complete"] is True


def test_what_turingbox_seeded_is_not_engine_work_and_an_empty_entry_is_never_quarantined(tmp_path):
    plan, root = make_plan(), str(tmp_path / "vol")
    (tmp_path / "aot" / "HASHA").mkdir(parents=True)
    (tmp_path / "aot" / "HASHA" / "k.cubin").write_bytes(b"aot kernel")
    env = {"TURINGBOX_AOT_TRITON_DIR": str(tmp_path / "aot")}
    for attempt in (1, 2, 3):        # more failed-to-fill starts than MAX_INCOMPLETE_ATTEMPTS
        s = store.prepare_cache(plan, cache_settings(root, env))
        assert s.status["result"] == "miss" and s.status["quarantined"] is None
        assert store.read_manifest(s.entry)["attempts"] == attempt
        assert "triton/HASHA/k.cubin" in store.read_manifest(s.entry)["seeded_files"]
        s.finish(True)               # warm, by the engine's account, yet only the AOT kernel is there
        assert s.status["completed"] is False and store.read_manifest(s.entry)["completed"] is None
        assert store.entry_problems(s.entry, plan["cache_key"]) == [store.INCOMPLETE]
    s = store.prepare_cache(plan, cache_settings(root, env))
    with open(os.path.join(s.env["TRITON_CACHE_DIR"], "HASHA", "k.cubin"), "wb") as f:
        f.write(b"the engine's own build of it")      # a seeded file rewritten is the engine's work
    s.finish(True)
    assert s.status["completed"] is True
    hit = store.prepare_cache(plan, cache_settings(root, env))
    assert hit.status["result"] == "hit"
    hit.finish(True)


def started_argvs(events) -> list[list[str]]:
    """The argv of every stand-in vLLM start, as it received it (its "started" events)."""
    return [e["argv"] for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "started"]


def test_a_start_that_loads_records_its_kv_size_and_the_next_start_skips_the_profile(box):
    events, kv_bytes = box["tmp"] / "events.jsonl", 87_177_098_690        # 81.19 GiB, as on an H200
    env = {**engine(FILLING_ENGINE), "FAKE_VLLM_EVENTS": str(events), "FAKE_VLLM_KV_CACHE_BYTES": str(kv_bytes),
           "TURINGBOX_KV_SIZE_FROM_CACHE": "1"}
    # an empty entry: vLLM compiles its graphs, which peaks higher and sizes less KV than a start that loads them
    first = serve_until_ready_then_stop(box, env)
    assert "(no size recorded in the cache entry for this plan and these arguments yet)" in first
    [row] = shown(box)
    entry = store.entry_dir(box["root"], row["key"])
    assert row["complete"] is True and "kv_cache" not in store.read_manifest(entry)
    # a hit: it loads them, profiles memory and records what it measured before completing the entry
    second = serve_until_ready_then_stop(box, env)
    assert "Available KV cache memory: 81.19 GiB" in second
    assert f"cache entry {row['key']}: recorded the KV cache size vLLM profiled, 81.19 GiB" in second
    recorded = store.read_manifest(entry)["kv_cache"]
    assert [r["bytes"] for r in recorded.values()] == [kv_bytes]
    # the next start is given it and skips the profile; it measured nothing, so the record stays as it was
    third = serve_until_ready_then_stop(box, env)
    assert (f"KV cache size from the cache entry: 81.19 GiB (--kv-cache-memory-bytes {kv_bytes}): vLLM skips its "
            "CUDA-graph memory profile") in third
    assert "as specified by kv_cache_memory_bytes config and skipped memory profiling" in third
    assert "recorded the KV cache size" not in third and store.read_manifest(entry)["kv_cache"] == recorded
    # off (the default): vLLM profiles at every start
    off = serve_until_ready_then_stop(box, {**env, "TURINGBOX_KV_SIZE_FROM_CACHE": "0"})
    assert "KV cache size: vLLM profiles memory at this start (kv_size_from_cache is off)" in off
    # a start given the size that fails (vLLM dies while it allocates the KV cache) drops it: the next profiles
    failed = serve_until_ready_then_stop(box, {**env, "FAKE_VLLM_FAIL_AT": "capturing"}, expect_ready=False)
    assert "dropped the recorded KV cache size after a start given it failed" in failed
    assert store.read_manifest(entry)["kv_cache"] == {}
    again = serve_until_ready_then_stop(box, env)
    assert "(no size recorded in the cache entry for this plan and these arguments yet)" in again
    given = [argv[argv.index("--kv-cache-memory-bytes") + 1] if "--kv-cache-memory-bytes" in argv else None
             for argv in started_argvs(events)]
    assert given == [None, None, str(kv_bytes), None, str(kv_bytes), None]


def test_a_start_without_the_plugins_compile_key_fix_records_no_size(box):
    """Given the size, such a start would recompile every graph (vllm#47356): nothing is recorded for it."""
    env = {**engine(FILLING_ENGINE), "TURINGBOX_KV_SIZE_FROM_CACHE": "1",
           "FAKE_VLLM_KV_KEY_FIX": "skipped: vllm.config.cache.CacheConfig.compute_hash is not vLLM 0.21.0's"}
    serve_until_ready_then_stop(box, env)
    second = serve_until_ready_then_stop(box, env)
    assert "recorded the KV cache size" not in second
    [row] = shown(box)
    assert "kv_cache" not in store.read_manifest(store.entry_dir(box["root"], row["key"]))
