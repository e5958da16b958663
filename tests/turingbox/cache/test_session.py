"""prepare_cache decisions on a real filesystem: hit/miss, incomplete, corrupt, baked, unusable volumes."""
import json
import logging
import os
import subprocess

import pytest

from turingbox.cache import store
from tests.support.cache_helpers import SOFTWARE, make_plan, turingbox_temporaries
from tests.support.plan_factory import cache_settings


def seed(plan, root, files=None):
    """Run a session as a seeding engine would: write into the caches, then finish."""
    s = store.prepare_cache(plan, cache_settings(str(root)))
    for rel, data in (files or {"triton/abc/kernel.cubin": b"\x7fELF" * 64,
                                "triton/abc/__grp__kernel.json": b'{"child_paths": {}}',
                                "vllm/torch_compile_cache/h/rank_0_0/backbone/artifact": b"x" * 100}).items():
        path = os.path.join(s.entry, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    s.finish(True)
    return s


def engine_wrote(s):
    """What a real engine leaves behind: a compile artefact in the entry (finish(True) completes only then)."""
    path = os.path.join(s.entry, "triton", "ENGINEHASH", "kernel.cubin")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\x7fELF")


def test_env_points_every_cache_into_the_entry(tmp_path, plan):
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    entry = os.path.join(str(tmp_path), "entries", plan["cache_key"])
    assert s.entry == entry
    for var in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        assert s.env[var].startswith(entry + os.sep) and os.path.isdir(s.env[var])
    assert "TRITON_CACHE_AUTOTUNING" not in s.env     # the plan's env sets it (planner.py), once
    s.finish(False)


def test_miss_then_complete_then_hit_counts_hits_and_sizes(tmp_path, plan):
    first = seed(plan, tmp_path)
    assert first.status["result"] == "miss" and first.status["caches"]["triton"] == "miss"
    manifest = json.load(open(os.path.join(first.entry, "manifest.json")))
    assert manifest["completed"] and manifest["sizes"]["triton"] == {"files": 2, "bytes": 256 + 19}
    assert manifest["tools"]["turingbox"] and manifest["inputs"] == plan["cache_inputs"]
    second = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    assert second.status["result"] == "hit" and second.status["source"] == "volume"
    assert second.status["caches"] == {"vllm": "hit", "triton": "hit", "inductor": "empty", "flashinfer": "empty"}
    second.finish(True)
    third = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    third.finish(True)
    assert json.load(open(os.path.join(first.entry, "manifest.json")))["hits"] == 2


def test_incomplete_entry_is_a_miss_and_resumed_then_quarantined_after_repeated_failures(tmp_path, plan):
    s1 = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    open(os.path.join(s1.entry, "triton", "partial.cubin"), "wb").write(b"ok")
    s1.finish(False)
    s2 = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    assert s2.status["result"] == "miss" and s2.status["quarantined"] is None
    assert os.path.exists(os.path.join(s2.entry, "triton", "partial.cubin"))  # resumed, not thrown away
    s2.finish(False)
    s3 = store.prepare_cache(plan, cache_settings(str(tmp_path)))  # two failed attempts: start clean, keep evidence
    assert s3.status["result"] == "miss" and s3.status["quarantined"]
    assert os.path.exists(os.path.join(s3.status["quarantined"], "triton", "partial.cubin"))
    assert not os.path.exists(os.path.join(s3.entry, "triton", "partial.cubin"))
    engine_wrote(s3)
    s3.finish(True)
    assert store.prepare_cache(plan, cache_settings(str(tmp_path))).status["result"] == "hit"


@pytest.mark.parametrize("damage", ["truncated-manifest", "wrong-key", "missing-file", "bad-triton-json-is-verify-only"])
def test_corrupt_entry_is_quarantined_rebuilt_and_the_next_start_is_healthy(tmp_path, plan, damage, caplog):
    s = seed(plan, tmp_path)
    manifest_path = os.path.join(s.entry, "manifest.json")
    if damage == "truncated-manifest":
        open(manifest_path, "w").write('{"format": 1, "key": ')
    elif damage == "wrong-key":
        m = json.load(open(manifest_path))
        m["inputs"]["plan"]["num_speculative_tokens"] = 4
        json.dump(m, open(manifest_path, "w"))
    elif damage == "missing-file":
        os.unlink(os.path.join(s.entry, "triton", "abc", "kernel.cubin"))
    else:
        open(os.path.join(s.entry, "triton", "abc", "__grp__kernel.json"), "w").write("{")
    caplog.set_level(logging.INFO, logger="turingbox.cache")
    again = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    if damage == "bad-triton-json-is-verify-only":
        # The cheap start-up check does not parse every JSON file; `cache verify` does (CLI test).
        assert again.status["result"] == "hit"
        again.finish(True)
        return
    assert again.status["result"] == "miss"
    qdir = again.status["quarantined"]
    assert qdir and os.path.basename(qdir).startswith(plan["cache_key"] + "-")
    assert os.path.dirname(qdir) == os.path.join(str(tmp_path), "quarantine")
    assert "quarantined" in caplog.text
    assert open(os.path.join(qdir, "QUARANTINED.txt")).read().strip()
    engine_wrote(again)
    again.finish(True)
    healthy = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    assert healthy.status["result"] == "hit" and healthy.status["quarantined"] is None
    healthy.finish(True)


def test_manifest_without_directory_contents_is_rebuilt(tmp_path, plan):
    entry = os.path.join(str(tmp_path), "entries", plan["cache_key"])
    os.makedirs(os.path.join(entry, "triton"))  # a directory with no manifest at all
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    assert s.status["result"] == "miss" and s.status["quarantined"]
    s.finish(True)


def test_miss_logs_which_input_differs_from_the_nearest_entry(tmp_path, caplog):
    seed(make_plan(tensor_parallel_size=4), tmp_path)
    seed(make_plan(), tmp_path)
    caplog.set_level(logging.INFO, logger="turingbox.cache")
    s = store.prepare_cache(make_plan(max_num_seqs=64), cache_settings(str(tmp_path)))
    assert s.status["nearest"] == {"key": make_plan()["cache_key"], "differences": ["plan.max_num_seqs: 16 != 64"]}
    assert "nearest entry" in caplog.text and "plan.max_num_seqs: 16 != 64" in caplog.text
    s.finish(False)


def _baked(tmp_path, plan):
    baked = tmp_path / "baked"
    seed(plan, baked)
    subprocess.run(["chmod", "-R", "a-w", str(baked)], check=True)
    return str(baked)


def test_matching_baked_entry_is_copied_into_the_volume(tmp_path, plan):
    baked = _baked(tmp_path, plan)
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol"), baked_cache_dir=baked))
    assert s.status["result"] == "hit" and s.status["source"] == "baked"
    assert s.entry.startswith(str(tmp_path / "vol"))
    assert open(os.path.join(s.entry, "triton", "abc", "kernel.cubin"), "rb").read() == b"\x7fELF" * 64
    open(os.path.join(s.entry, "triton", "new.cubin"), "wb").write(b"written by the engine")  # copy is writable
    s.finish(True)
    assert json.load(open(os.path.join(s.entry, "manifest.json")))["source"].startswith("baked:")
    assert not os.path.exists(os.path.join(baked, "entries", plan["cache_key"], "triton", "new.cubin"))


def test_mismatched_baked_entry_is_ignored_with_the_reason(tmp_path, caplog):
    baked = _baked(tmp_path, make_plan(num_speculative_tokens=3))
    caplog.set_level(logging.INFO, logger="turingbox.cache")
    s = store.prepare_cache(make_plan(num_speculative_tokens=4), cache_settings(str(tmp_path / "vol"), baked_cache_dir=baked))
    assert s.status["result"] == "miss" and s.status["source"] is None
    assert "baked entry" in caplog.text and "plan.num_speculative_tokens: 3 != 4" in caplog.text
    s.finish(False)


@pytest.fixture
def readonly_dir(tmp_path):
    """A really read-only directory: a read-only tmpfs when we are root (root ignores modes)."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield str(d)
        d.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "turingbox-test", str(d)],
                      capture_output=True).returncode != 0:
        pytest.skip("running as root and cannot mount a read-only tmpfs")
    try:
        yield str(d)
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_read_only_volume_runs_cold_in_a_temp_dir_with_a_warning(readonly_dir, plan, caplog):
    caplog.set_level(logging.WARNING, logger="turingbox.cache")
    s = store.prepare_cache(plan, cache_settings(readonly_dir))
    assert s.mode == "cold" and s.status["result"] == "miss"
    assert not s.entry.startswith(readonly_dir) and os.path.isdir(s.entry)
    assert "not writable" in caplog.text
    assert os.access(s.env["TRITON_CACHE_DIR"].rsplit(os.sep, 1)[0], os.W_OK)
    s.finish(True)  # nothing to complete, must not raise
    s.close()


def test_close_removes_the_cold_copy_and_leaves_the_volume_and_baked_layer_alone(readonly_dir, tmp_path, plan,
                                                                                  private_tmpdir):
    baked = _baked(tmp_path, plan)                       # read-only files (0444): the copy must still go
    before = {d: sorted(os.walk(d)) for d in (readonly_dir, baked)}
    s = store.prepare_cache(plan, cache_settings(readonly_dir, baked_cache_dir=baked))
    assert s.mode == "cold" and s.status["result"] == "hit"
    assert turingbox_temporaries(private_tmpdir) == [os.path.basename(os.path.dirname(s.entry))]
    open(os.path.join(s.env["TRITON_CACHE_DIR"], "jit.cubin"), "wb").write(b"compiled after the copy")
    s.finish(True)
    assert os.path.isdir(s.entry)                        # finish keeps it: the engine runs from it until exit
    s.close()
    assert turingbox_temporaries(private_tmpdir) == []
    assert {d: sorted(os.walk(d)) for d in (readonly_dir, baked)} == before
    s.close()                                            # idempotent


def test_close_never_deletes_the_shared_entry_and_releases_its_lock(tmp_path, plan, private_tmpdir):
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol")))
    assert s.mode == "shared" and s.temp_dir is None
    s.close()                                            # never finished: failed start, entry stays incomplete
    assert store.read_manifest(s.entry)["completed"] is None
    again = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol"), cache_lock_wait=0.5))
    assert again.mode == "shared" and again.status["result"] == "miss"
    engine_wrote(again)
    again.finish(True)
    again.close()
    assert store.entry_problems(again.entry, plan["cache_key"]) == []
    assert turingbox_temporaries(private_tmpdir) == []


def test_full_volume_runs_cold(tmp_path, plan, caplog):
    caplog.set_level(logging.WARNING, logger="turingbox.cache")
    free = __import__("shutil").disk_usage(str(tmp_path)).free
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)), min_free_bytes=free * 2)
    assert s.mode == "cold" and "MiB free" in caplog.text
    s.finish(True)
    s.close()


def test_a_really_full_tmpfs_runs_cold(tmp_path, plan):
    d = tmp_path / "full"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "turingbox-test", str(d)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        with open(d / "filler", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        s = store.prepare_cache(plan, cache_settings(str(d)), min_free_bytes=0)
        assert s.mode == "cold" and "not writable" in " ".join(s.status["events"])
        s.finish(True)
        s.close()
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_plan_without_cache_inputs_is_bad_input(tmp_path):
    from turingbox.errors import UsageError
    with pytest.raises(UsageError, match="cache_inputs"):
        store.prepare_cache({"cache_key": "x"}, cache_settings(str(tmp_path)))


def test_a_new_entry_starts_with_the_ahead_of_time_kernels(tmp_path, plan):
    aot_dir = tmp_path / "aot"
    for h in ("HASHA", "HASHB"):
        (aot_dir / h).mkdir(parents=True)
        (aot_dir / h / "k.cubin").write_bytes(b"aot " + h.encode())
        (aot_dir / h / "k.cubin").chmod(0o444)
    env = {"TURINGBOX_AOT_TRITON_DIR": str(aot_dir)}
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol"), env))
    assert s.status["result"] == "miss" and s.status["aot_kernels"] == 2
    triton_dir = s.env["TRITON_CACHE_DIR"]
    assert open(os.path.join(triton_dir, "HASHB", "k.cubin"), "rb").read() == b"aot HASHB"
    assert os.stat(os.path.join(triton_dir, "HASHB", "k.cubin")).st_mode & 0o200
    # What the engine compiled in the same folder name wins (same content address): never overwritten.
    open(os.path.join(triton_dir, "HASHA", "k.cubin"), "wb").write(b"engine")
    s.finish(True)
    hit = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol"), env))
    assert hit.status["result"] == "hit" and "aot_kernels" not in hit.status
    assert open(os.path.join(triton_dir, "HASHA", "k.cubin"), "rb").read() == b"engine"
    hit.finish(True)


INFO = '{"hash": "%s", "modelinfo": {"is_hybrid": true}}'


def test_a_new_entry_starts_with_vllms_model_infos(tmp_path, plan, caplog, monkeypatch):
    """vLLM imports each model class in a fresh interpreter when VLLM_CACHE_ROOT has no model info for it
    (44-66 s per empty-cache start on the H200): a new entry gets the image's files and those of any other
    completed entry made with the same vLLM, never a malformed file or one from an interrupted entry."""
    monkeypatch.delenv("TURINGBOX_AOT_MODELINFOS_DIR", raising=False)     # seed() below reads the environment
    image = tmp_path / "image" / "modelinfos"
    image.mkdir(parents=True)
    (image / "qwen3_5-Qwen3_5ForConditionalGeneration.json").write_text(INFO % "image")
    (image / "qwen3_5_mtp-Qwen3_5MTP.json").write_text(INFO % "image-mtp")
    (image / "truncated-Arch.json").write_text('{"hash": "x", "model')
    (image / "other-shape.json").write_text('{"hash": 3, "modelinfo": {}}')
    vol = tmp_path / "vol"
    other = seed(make_plan(tensor_parallel_size=4), vol, {"vllm/modelinfos/other-Arch.json": (INFO % "other").encode(),
                                                          "vllm/modelinfos/qwen3_5_mtp-Qwen3_5MTP.json": b"{}",
                                                          "triton/o/k.cubin": b"o"})
    older = seed(make_plan(software={**SOFTWARE, "vllm": "0.20.0"}), vol,
                 {"vllm/modelinfos/older-Arch.json": (INFO % "older vLLM").encode(), "triton/o/k.cubin": b"o"})
    crashed = store.prepare_cache(make_plan(max_num_seqs=64), cache_settings(str(vol)))          # never finished: incomplete
    os.makedirs(os.path.join(crashed.entry, "vllm", "modelinfos"), exist_ok=True)   # it got other's files
    open(os.path.join(crashed.entry, "vllm", "modelinfos", "crashed-Arch.json"), "w").write(INFO % "crashed")
    crashed.close()
    env = {"TURINGBOX_AOT_MODELINFOS_DIR": str(image.parent)}
    caplog.set_level(logging.INFO, logger="turingbox.cache")
    s = store.prepare_cache(plan, cache_settings(str(vol), env))
    infos = os.path.join(s.env["VLLM_CACHE_ROOT"], "modelinfos")
    assert s.status["result"] == "miss" and s.status["modelinfos"] == 3
    assert sorted(os.listdir(infos)) == ["other-Arch.json", "qwen3_5-Qwen3_5ForConditionalGeneration.json",
                                         "qwen3_5_mtp-Qwen3_5MTP.json"]
    assert json.load(open(os.path.join(infos, "qwen3_5_mtp-Qwen3_5MTP.json")))["hash"] == "image-mtp"   # image first
    assert "3 vLLM model-info files" in caplog.text
    # vLLM rewrites a stale file in the entry; a later seeding never overwrites what the entry has
    open(os.path.join(infos, "qwen3_5_mtp-Qwen3_5MTP.json"), "w").write(INFO % "vllm")
    assert store.seed_modelinfos([str(image)], s.env["VLLM_CACHE_ROOT"]) == {}
    assert json.load(open(os.path.join(infos, "qwen3_5_mtp-Qwen3_5MTP.json")))["hash"] == "vllm"
    engine_wrote(s)
    s.finish(True)
    assert not store.entry_problems(s.entry, plan["cache_key"], deep=True)
    hit = store.prepare_cache(plan, cache_settings(str(vol), env))
    assert hit.status["result"] == "hit" and "modelinfos" not in hit.status
    hit.finish(True)
    assert other.status["modelinfos"] == 0 and older.status["modelinfos"] == 0   # nothing usable before them


def test_an_unreadable_model_info_source_is_skipped_with_a_warning(tmp_path, caplog):
    good = tmp_path / "good"
    good.mkdir()
    (good / "a.json").write_text("{}")
    (good / "notes.txt").write_text("not vLLM's")
    caplog.set_level(logging.WARNING, logger="turingbox.cache")
    (good / "a.json").write_text(INFO % "good")
    assert store.seed_modelinfos([str(tmp_path / "gone"), str(good)], str(tmp_path / "entry" / "vllm")) == {str(good): 1}
    assert os.listdir(tmp_path / "entry" / "vllm" / "modelinfos") == ["a.json"]
    assert "unreadable" in caplog.text and "gone" in caplog.text


def test_the_kv_size_a_start_measured_is_kept_in_the_manifest_for_the_same_signature(tmp_path, plan, caplog):
    caplog.set_level(logging.INFO, logger="turingbox.cache")
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    assert s.kv_size("sig-a") is None                                   # a new entry: nothing recorded
    assert s.record_kv_size(87_177_098_690, "sig-a") is True
    assert s.kv_size("sig-a") == 87_177_098_690 and s.kv_size("sig-b") is None
    assert "recorded the KV cache size vLLM profiled, 81.19 GiB" in caplog.text
    engine_wrote(s)
    s.finish(True)
    assert s.record_kv_size(1, "sig-a") is False        # finished: the writer lock is no longer this session's
    kv = store.read_manifest(s.entry)["kv_cache"]
    assert kv["sig-a"]["bytes"] == 87_177_098_690 and kv["sig-a"]["recorded"].endswith("Z")
    assert store.entry_problems(s.entry, plan["cache_key"], deep=True) == []
    hit = store.prepare_cache(plan, cache_settings(str(tmp_path)))      # a hit rewrites the manifest, keeping it
    assert hit.status["result"] == "hit" and hit.kv_size("sig-a") == 87_177_098_690
    # starts with other `--` args or environments share the entry: each keeps its own size
    assert hit.record_kv_size(80 << 30, "sig-b") and hit.kv_size("sig-a") == 87_177_098_690
    assert hit.kv_size("sig-b") == 80 << 30
    hit.finish(True)
    assert set(store.read_manifest(s.entry)["kv_cache"]) == {"sig-a", "sig-b"}


def test_a_start_given_the_size_that_failed_drops_it_and_old_signatures_make_room(tmp_path, plan, caplog):
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    for i in range(store.KV_SIZE_RECORDS + 2):
        assert s.record_kv_size((i + 1) << 30, f"sig-{i}")
    kv = store.read_manifest(s.entry)["kv_cache"]
    assert len(kv) == store.KV_SIZE_RECORDS and "sig-0" not in kv and f"sig-{store.KV_SIZE_RECORDS + 1}" in kv
    assert s.forget_kv_size("sig-5") and s.kv_size("sig-5") is None and s.kv_size("sig-6") == 7 << 30
    assert "dropped the recorded KV cache size after a start given it failed" in s.status["events"][-1]
    s.close()


@pytest.mark.parametrize("kv", [{"s": {"bytes": "80"}}, {"s": {"bytes": True}}, {"s": {"bytes": 0}}, {"s": {}},
                                {"s": 80}, {"bytes": 80, "signature": "s"}, "80", None])
def test_a_malformed_kv_size_record_is_none(tmp_path, plan, kv):
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    store.write_json_atomic(os.path.join(s.entry, "manifest.json"), {**store.read_manifest(s.entry), "kv_cache": kv})
    assert s.kv_size("s") is None
    assert s.record_kv_size(5 << 30, "t") and s.kv_size("t") == 5 << 30      # a malformed record is replaced
    s.close()


def test_recording_the_kv_size_never_raises(tmp_path, plan, monkeypatch):
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))

    def full(path, data):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(store, "write_json_atomic", full)
        assert s.record_kv_size(5 << 30, "s") is False
    assert "could not record the KV cache size: [Errno 28] No space left on device" in s.status["events"][-1]
    assert s.kv_size("s") is None
    s.close()
