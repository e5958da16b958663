"""bench/startup.py's mechanics on CPU: every phase in order against a stand-in engine (real HTTP
processes: fake vLLM behind engine_filling_caches.py, and the real `turingbox serve` / `warmup`).
The numbers mean nothing here; what is checked is that each phase runs what it claims on the
caches it claims, and that the JSON and the chart come out. The real run is `make bench-startup`
on a GPU host."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.cache_fixtures import plan, private_tmpdir  # noqa: F401  (the cache tests' fixtures, by import)
from tests.turingbox.cache.test_seed_e2e import H200, QWEN36_CONFIG

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = os.path.join(REPO, "tests", "support", "engine_filling_caches.py")


def bench(tmp_path, phase, *extra, pythonpath=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TURINGBOX_", "FAKE_VLLM_")) and k != "VLLM_WORKER_MULTIPROC_METHOD"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    env.update(FAKE_VLLM_STAGE_SECONDS="0.1", TURINGBOX_ACTIVE_WARMUP="0")
    return subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup.py"), "--phase", phase,
                           "--model", str(tmp_path / "model"), "--gpus", "0,1", "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "out"), "--budget-s", "60",
                           "--vllm-command", f"{sys.executable} {ENGINE}", "--turingbox-args", f"--gpus-json {H200}", *extra],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


def test_all_phases_run_on_the_caches_they_claim_and_write_json_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    seeded_before = None
    for phase in ("empty", "seed", "seeded", "warm"):
        r = bench(tmp_path, phase)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        if phase == "seed":
            seeded_before = sorted(os.listdir(tmp_path / "work" / "seed-root" / "entries"))
    results = json.load(open(tmp_path / "out" / "startup.json"))
    phases = results["phases"]
    assert set(phases) == {"empty", "seed", "seeded", "warm"}
    assert phases["seed"]["turingbox"]["exit"] == 0
    # the seed's engine compiled (an empty entry), so it started vLLM a second time, loading the graphs
    assert 0 < phases["seed"]["turingbox"]["loading_start_s"] < phases["seed"]["turingbox"]["seconds"]
    key = phases["seed"]["turingbox"]["result"]["cache_key"]
    assert key == results["plan"]["cache_key"] and seeded_before == [key]
    for phase in ("empty", "seeded", "warm"):
        assert phases[phase]["parallel"] is True
        for server in ("plain", "turingbox"):
            res = phases[phase][server]
            assert res["ready_s"] > 0 and res["first_ttft_s"] > 0, (phase, server, res)
            stages = res["stages_s"]
            # FAKE_VLLM_STAGE_SECONDS (0.1 s); a line read late under load shortens the stage after it
            assert stages["weights"] >= 0.05 and stages["compile + profile"] >= 0.05
            assert abs(sum(stages.values()) - res["ready_s"]) < 0.05          # the breakdown adds up
    logs = tmp_path / "work" / "logs"
    # turingbox: a miss on empty caches, a hit on the copied seed, a hit again when warm.
    assert f"cache miss for {key}" in (logs / "empty-turingbox.log").read_text()
    seeded_log = (logs / "seeded-turingbox.log").read_text()
    assert f"cache hit for {key}" in seeded_log and str(tmp_path / "work" / "tb-seeded-root") in seeded_log
    assert f"cache hit for {key}" in (logs / "warm-turingbox.log").read_text()
    # The seed itself stays untouched (the copy took the hits); plain vLLM ran on its copied HOME.
    seed_manifest = json.load(open(tmp_path / "work" / "seed-root" / "entries" / key / "manifest.json"))
    copy_manifest = json.load(open(tmp_path / "work" / "tb-seeded-root" / "entries" / key / "manifest.json"))
    assert seed_manifest["hits"] == 0 and copy_manifest["hits"] == 2
    assert "--worker-cls" not in (logs / "empty-plain.log").read_text()
    # Plain vLLM keeps one HOME, as a user does: seeded is the empty run's caches copied back under it (vLLM 0.21's
    # compile key hashes two folders under HOME); the empty run started with nothing, seeded and warm found them.
    plain_home, both = str(tmp_path / "work" / "plain-home"), \
            '["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"]'   # the careful settings name all three
    for phase, found in (("empty", "[]"), ("seeded", both), ("warm", both)):
        assert f"engine_filling_caches: HOME {plain_home}, found {found}" in (logs / f"{phase}-plain.log").read_text()
    assert os.path.isdir(tmp_path / "work" / "plain-empty-home")     # the empty run's caches, kept for reruns
    # turingbox's HOME is new every start, and its caches are found anyway (the cache entry, not HOME, holds them).
    assert (f"HOME {tmp_path / 'work' / 'home' / 'turingbox-seeded'}, "
            f'found ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"]') in seeded_log
    assert set(results["criteria"]) >= {"seeded_over_warm", "seeded_over_empty", "seeded_no_compile_autotune_jit",
                                        "seeded_le_45s", "seeded_turingbox_over_plain", "seeded_le_1.0x_plain",
                                        "warm_turingbox_over_plain", "seeded_first_le_1.2x_later"}
    c = results["criteria"]
    assert c["seeded_turingbox_over_plain"] == round(phases["seeded"]["turingbox"]["ready_s"]
                                                     / phases["seeded"]["plain"]["ready_s"], 3)
    with open(tmp_path / "out" / "startup.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_phases_out_of_order_say_what_to_run_first(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    r = bench(tmp_path, "seeded")
    assert r.returncode != 0 and "run the seed phase first" in r.stderr


def test_a_variant_reaches_both_servers_vllm(tmp_path):
    # issue 18's A/B: the same vLLM flag for plain vLLM and for turingbox (after --), the same environment
    # (here the stand-in's event file, so that the environment shows it arrived)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    events = tmp_path / "events.jsonl"
    r = bench(tmp_path, "empty", "--vllm-args=--language-model-only", "--env", f"FAKE_VLLM_EVENTS={events}",
              "--label", "lmo")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    phases = json.load(open(tmp_path / "out" / "startup.json"))["phases"]
    assert list(phases) == ["empty+lmo"]                       # kept beside the baseline's "empty", not over it
    phase = phases["empty+lmo"]
    assert phase["variant"] == {"vllm_args": ["--language-model-only"], "env": {"FAKE_VLLM_EVENTS": str(events)}}
    started = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "started"]
    assert len(started) == 2                                   # plain vLLM and turingbox's vLLM
    assert all(e["argv"][-1] == "--language-model-only" for e in started)
    assert sum("--worker-cls" in e["argv"] for e in started) == 1


def test_a_malformed_env_is_one_sentence(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    r = bench(tmp_path, "empty", "--env", "VLLM_WORKER_MULTIPROC_METHOD")
    assert r.returncode != 0 and "--env takes KEY=VALUE, got 'VLLM_WORKER_MULTIPROC_METHOD'." in r.stderr
    assert "Traceback" not in r.stderr


def test_turingbox_only_environment_reaches_turingboxs_vllm_and_not_plain_vllm(tmp_path):
    # issue 18's cheap A/B: --language-model-only for both (one argv), a forked engine core for turingbox only
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    events = tmp_path / "events.jsonl"
    r = bench(tmp_path, "empty", "--vllm-args=--language-model-only", "--env", f"FAKE_VLLM_EVENTS={events}",
              "--tb-env", "VLLM_WORKER_MULTIPROC_METHOD=fork", "--label", "lmo-fork")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    phase = json.load(open(tmp_path / "out" / "startup.json"))["phases"]["empty+lmo-fork"]
    assert phase["variant"]["turingbox_env"] == {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    started = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "started"]
    by_server = {("turingbox" if "--worker-cls" in e["argv"] else "plain"): e for e in started}
    assert by_server["turingbox"]["multiproc_method"] == "fork"
    assert by_server["plain"]["multiproc_method"] is None
    assert all(e["argv"][-1] == "--language-model-only" for e in started)
    r = bench(tmp_path, "empty", "--tb-env", "fork")
    assert r.returncode != 0 and "--tb-env takes KEY=VALUE, got 'fork'." in r.stderr


def test_a_wrapped_turingbox_is_stopped_itself_and_the_wrapper_ends_with_it(tmp_path):
    # --tb-wrap: a profiler around turingbox serve (py-spy on the GPU). py-spy SIGKILLs its child when interrupted, so
    # the bench stops turingbox itself (SIGTERM: it drains and stops vLLM) and the profiler ends when its child does.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    record = tmp_path / "profile.json"
    wrapper = f"{sys.executable} {os.path.join(REPO, 'tests', 'bench', 'profiler_stand_in.py')} -o {record} --"
    r = bench(tmp_path, "empty", "--only", "turingbox", f"--tb-wrap={wrapper}", "--label", "profiled")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    phase = json.load(open(tmp_path / "out" / "startup.json"))["phases"]["empty+profiled"]
    assert phase["variant"]["turingbox_wrap"] == wrapper and phase["turingbox"]["ready_s"] > 0
    assert json.loads(record.read_text()) == {"stopped_by": "child exit", "child_exit": 0}
    log = (tmp_path / "work" / "logs" / "empty+profiled-turingbox.log").read_text()   # its own log
    assert "SIGTERM received: draining" in log and "vLLM stopped (exit code 0)" in log


def test_an_empty_run_of_one_server_keeps_the_other_servers_caches(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    for d in ("plain-home", "plain-empty-home", "tb-empty-root"):
        (tmp_path / "work" / d).mkdir(parents=True)
        (tmp_path / "work" / d / "kept").write_text("x")
    r = bench(tmp_path, "empty", "--only", "turingbox", "--label", "tb-only")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "work" / "plain-home" / "kept").exists()              # plain vLLM's, for its seeded run
    assert (tmp_path / "work" / "plain-empty-home" / "kept").exists()
    assert not (tmp_path / "work" / "tb-empty-root" / "kept").exists()      # turingbox's own: emptied


def test_a_phase_run_one_server_at_a_time_keeps_both_results_and_each_servers_caches(tmp_path):
    # bench/gpu/README.md: the GPU A/B runs in calls that each fit the machine's 10-minute window, so the seeded pair
    # may come as two one-server runs. The second must neither drop the first's result nor re-copy its caches.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    for phase, extra in (("empty", ["--only", "plain"]), ("seed", []), ("seeded", ["--only", "turingbox"])):
        r = bench(tmp_path, phase, *extra)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    key = json.load(open(tmp_path / "out" / "startup.json"))["plan"]["cache_key"]
    manifest = tmp_path / "work" / "tb-seeded-root" / "entries" / key / "manifest.json"
    assert json.load(open(manifest))["hits"] == 1
    r = bench(tmp_path, "seeded", "--only", "plain")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.load(open(tmp_path / "out" / "startup.json"))
    seeded = results["phases"]["seeded"]
    assert seeded["turingbox"]["ready_s"] > 0 and seeded["plain"]["ready_s"] > 0
    assert results["criteria"]["seeded_turingbox_over_plain"] == round(
        seeded["turingbox"]["ready_s"] / seeded["plain"]["ready_s"], 3)
    assert json.load(open(manifest))["hits"] == 1          # turingbox's seeded copy was left as its run left it
    both = '["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"]'
    assert f"found {both}" in (tmp_path / "work" / "logs" / "seeded-plain.log").read_text()


def test_fair_ab_names_every_start_and_compares_against_plain_at_its_best(tmp_path):
    """Issue 35's A/B, one server at a time as on one GPU: plain vLLM's empty start and two restarts in the unchanged
    HOME with the careful cache settings, then its default restart; turingbox's seed, seeded and warm starts. Every
    record says which start of which server it is, and the ratios pick plain's empty start (fresh node) and its
    third careful start (restart)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    steps = [("empty", "--only", "plain"), ("warm", "--only", "plain", "--label", "start2"),
             ("warm", "--only", "plain", "--label", "start3"), ("seed",), ("seeded", "--only", "turingbox"),
             ("warm", "--only", "turingbox"), ("warm", "--only", "plain", "--label", "default", "--plain-caches",
                                                "default")]
    for phase, *flags in steps:
        r = bench(tmp_path, phase, "--gpus", "0", *flags)
        assert r.returncode == 0, (phase, flags, r.stdout[-3000:] + r.stderr[-3000:])
    results = json.load(open(tmp_path / "out" / "startup.json"))
    phases = results["phases"]
    starts = {(row["record"], row["server"]): row["start"] for row in results["starts"]}
    assert starts[("empty", "plain")] == {"server": "plain", "n": 1, "caches_at": "plain-home", "caches": "empty",
                                          "cache_settings": "careful"}
    assert starts[("warm+start2", "plain")]["n"] == 2 and starts[("warm+start3", "plain")]["n"] == 3
    assert starts[("warm+start3", "plain")]["caches"] == "unchanged"
    assert starts[("warm+default", "plain")] == {"server": "plain", "n": 4, "caches_at": "plain-home",
                                                 "caches": "unchanged", "cache_settings": "default"}
    assert starts[("seeded", "turingbox")]["n"] == 1 and starts[("seeded", "turingbox")]["caches"] == "copied"
    assert starts[("warm", "turingbox")] == {"server": "turingbox", "n": 2, "caches_at": "tb-seeded-root",
                                             "caches": "unchanged"}
    # the careful settings reach plain vLLM: its Triton cache under HOME got the stand-in's kernel and autotune result
    # at the first start, and nothing new at the restarts
    assert phases["empty"]["plain"]["compiled"]["during_start"] == 1
    assert phases["warm+start3"]["plain"]["compiled"]["during_start"] == 0
    assert (tmp_path / "work" / "plain-home" / ".triton" / "cache" / "KERNELHASH" / "chunk_fwd.autotune.json").exists()
    fair = results["fair_ab"]
    assert fair["fresh_node"]["plain"].startswith("empty (start 1")
    assert fair["restart"]["plain"].startswith("warm+start3 (start 3, unchanged caches, careful")
    assert fair["restart"]["turingbox"] == "warm (start 2)"
    assert fair["restart"]["ratio"] == round(phases["warm"]["turingbox"]["ready_s"]
                                             / phases["warm+start3"]["plain"]["ready_s"], 3)
    assert fair["plain_default_restart"]["start"] == 4 and "restart_note" not in fair
    # and against plain's fastest restart on record, whichever start and settings it was
    restarts = {k: phases[k]["plain"]["ready_s"] for k in ("warm+start2", "warm+start3", "warm+default")}
    best = min(restarts, key=restarts.get)
    assert fair["restart_vs_plain_best"]["plain"].startswith(f"{best} (start ")
    assert fair["restart_vs_plain_best"]["plain_restarts_s"] == sorted(restarts.values())
    assert fair["restart_vs_plain_best"]["ratio"] == round(phases["warm"]["turingbox"]["ready_s"] / restarts[best], 3)
    # the labelled runs keep their own logs beside the baseline's
    logs = tmp_path / "work" / "logs"
    assert (logs / "warm+start3-plain.log").exists() and (logs / "warm+default-plain.log").exists()


def test_the_breakdown_ends_the_profile_stage_at_either_kv_line():
    """vLLM 0.21 says "Available KV cache memory" after profiling, or, given --kv-cache-memory-bytes, that it
    reserved that size and skipped the profile (gpu_worker.py); either ends the compile + profile stage."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import startup

    def run_of(lines):
        run = startup.Run.__new__(startup.Run)
        run.lines = list(enumerate(lines, start=1))
        return run
    head = ["INFO vLLM server version 0.21.0", "INFO Starting to load model /m", "INFO Model loading took 51 GiB"]
    tail = ["INFO init engine (profile, create kv cache, warmup model) took 9.1 seconds"]
    profiled = startup.breakdown(run_of(head + ["INFO Available KV cache memory: 81.19 GiB"] + tail), 6, 7)
    given = startup.breakdown(run_of(head + [
        "INFO Initial free memory 139.1 GiB, reserved 81.19 GiB memory for KV Cache as specified by "
        "kv_cache_memory_bytes config and skipped memory profiling."] + tail), 6, 7)
    assert profiled == given == {"process start + import": 1, "engine process start": 1, "weights": 1,
                                 "compile + profile": 1, "KV cache + CUDA graphs": 1, "API server start": 1,
                                 "turingbox warmup + checks": 1}
    log_line = "reserved 81.19 GiB memory for KV Cache as specified by kv_cache_memory_bytes config"
    assert re.search(startup.SIGNALS["kv_size_given"], log_line)


def baked_flashinfer_layout(base, uri="sampling", arch="90a", version="0.6.8.post1"):
    """The layout turingbox_warmup.image.flashinfer_aot build writes (and TURINGBOX_AOT_FLASHINFER_DIR names)."""
    mod = base / ".cache" / "flashinfer" / version / arch / "cached_ops" / uri
    mod.mkdir(parents=True)
    (mod / f"{uri}.so").write_bytes(b"\x7fELF" + b"\0" * 60)
    (mod / "turingbox-prebuilt.json").write_text(json.dumps(
        {"module": uri, "uri": uri, "arch": arch, "workspace_arch": arch, "args": [], "generator": "gen_sampling_module",
         "flashinfer_version": version}))
    return mod


def test_plain_vllm_gets_flashinfers_prebuilt_modules_the_way_flashinfer_jit_cache_gives_them(tmp_path):
    """Session 28: a fair cold A/B gives plain vLLM the modules the image bakes, as a user who installs FlashInfer's
    flashinfer-jit-cache has them. The stand-in reaches plain vLLM only (PYTHONPATH), its start says so, and real
    FlashInfer, importing it, loads the sampling module from the baked file instead of building it."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    module = baked_flashinfer_layout(tmp_path / "fi-aot")
    events = tmp_path / "events.jsonl"
    same_env = ("--env", f"FAKE_VLLM_EVENTS={events}", "--env", "FAKE_FLASHINFER_ARCH=90a")
    r = bench(tmp_path, "empty", "--gpus", "0", "--plain-flashinfer-prebuilt", str(tmp_path / "fi-aot"),
              *same_env, "--tb-env", f"TURINGBOX_AOT_FLASHINFER_DIR={tmp_path / 'fi-aot'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.load(open(tmp_path / "out" / "startup.json"))
    prebuilt = results["phases"]["empty"]["variant"]["plain_flashinfer_prebuilt"]
    assert prebuilt["modules"] == ["sampling"] and prebuilt["cache_dir"] == str(module.parent)
    starts = {row["server"]: row["start"] for row in results["starts"]}
    # both servers start with the module, each the way it gets it in production (turingbox: the image's setting,
    # which copies it into the new entry's FlashInfer workspace)
    assert starts["plain"]["flashinfer_prebuilt"] is True and starts["turingbox"]["flashinfer_prebuilt"] is True
    key = results["plan"]["cache_key"]
    entry_ops = tmp_path / "work" / "tb-empty-root" / "entries" / key / "flashinfer" / module.relative_to(
        tmp_path / "fi-aot")
    assert (entry_ops / "sampling.so").read_bytes() == (module / "sampling.so").read_bytes()
    cold = results["fair_ab"]["cold"]["empty"]
    assert cold["plain"] == "empty" and cold["plain_start"]["flashinfer_prebuilt"] is True
    assert cold["turingbox"]["flashinfer_prebuilt"] is True
    # neither built the module: the stand-in engine found it where real FlashInfer looks (the stand-in package for
    # plain vLLM, the entry's workspace for turingbox), and the bench counts builds on disk
    assert cold["turingbox"]["flashinfer_builds"] == 0 and cold["plain_start"]["flashinfer_builds"] == 0
    logs = tmp_path / "work" / "logs"
    assert "FlashInfer sampling module prebuilt " in (logs / "empty-plain.log").read_text()
    assert "FlashInfer sampling module loaded " in (logs / "empty-turingbox.log").read_text()
    assert cold["ratio"] == round(
        results["phases"]["empty"]["turingbox"]["ready_s"] / results["phases"]["empty"]["plain"]["ready_s"], 3)
    # a plain start of another variant (other vLLM flags) is no baseline for it
    r = bench(tmp_path, "empty", "--gpus", "0", "--only", "plain", "--label", "lmo", "--vllm-args=--language-model-only")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cold = json.load(open(tmp_path / "out" / "startup.json"))["fair_ab"]["cold"]
    assert set(cold) == {"empty"} and set(cold["empty"]["plain_empty_starts"]) == {"empty"}
    # plain vLLM as pip installs it, same variant: it builds the module (nvcc) into its HOME, and the record says so
    r = bench(tmp_path, "empty", "--gpus", "0", "--only", "plain", "--label", "installed", *same_env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.load(open(tmp_path / "out" / "startup.json"))
    installed = results["fair_ab"]["cold"]["empty"]["plain_empty_starts"]["empty+installed"]
    assert installed["flashinfer_prebuilt"] is False and installed["flashinfer_builds"] == 1
    assert results["phases"]["empty+installed"]["plain"]["flashinfer_built"]["during_start"] == 1
    assert (tmp_path / "work" / "plain-home" / ".cache" / "flashinfer" / "0.6.8.post1" / "90a" / "cached_ops"
            / "sampling" / "sampling.so").exists()
    started = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "started"]
    paths = {}       # each server's first start (the A/B pair); the plain start as installed came later, without it
    for e in started:
        paths.setdefault("turingbox" if "--worker-cls" in e["argv"] else "plain", e.get("pythonpath") or "")
    standin = str(tmp_path / "work" / "flashinfer-jit-cache")
    assert paths["plain"].split(os.pathsep)[0] == standin and standin not in paths["turingbox"]
    # FlashInfer's own lookup (0.6.8.post1, as make test-setup unpacks it), in a process with plain vLLM's PYTHONPATH
    from turingbox_warmup.image.flashinfer_aot import default_flashinfer_src
    src = default_flashinfer_src()
    if not src:
        pytest.skip("FlashInfer's package is not unpacked (make test-setup)")
    probe = ("from flashinfer.jit import env; from flashinfer.jit.sampling import gen_sampling_module; "
             "print(env.FLASHINFER_AOT_DIR); print(gen_sampling_module().get_library_path())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "9.0",
                              "PYTHONPATH": os.pathsep.join((paths["plain"], os.path.dirname(src)))})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(module.parent), str(module / "sampling.so")]


def test_plain_flashinfer_prebuilt_of_another_flashinfer_is_one_sentence(tmp_path):
    """FlashInfer accepts a jit-cache whose version merely starts with its own: the bench refuses modules built by
    another FlashInfer than the one plain vLLM imports (the bench's own interpreter, as on the GPU machine)."""
    from turingbox_warmup.image.flashinfer_aot import default_flashinfer_src
    src = default_flashinfer_src()
    if not src:
        pytest.skip("FlashInfer's package is not unpacked (make test-setup)")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    baked_flashinfer_layout(tmp_path / "fi-aot", version="0.6.8")
    r = bench(tmp_path, "empty", "--gpus", "0", "--plain-flashinfer-prebuilt", str(tmp_path / "fi-aot"),
              pythonpath=os.path.dirname(src))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert ("--plain-flashinfer-prebuilt's modules are FlashInfer 0.6.8, but plain vLLM imports FlashInfer "
            "0.6.8.post1.") in r.stderr


def test_plain_flashinfer_prebuilt_of_two_archs_is_one_sentence(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(open(QWEN36_CONFIG, "rb").read())
    baked_flashinfer_layout(tmp_path / "fi-aot", arch="90a")
    baked_flashinfer_layout(tmp_path / "fi-aot", arch="75")
    r = bench(tmp_path, "empty", "--gpus", "0", "--plain-flashinfer-prebuilt", str(tmp_path / "fi-aot"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--plain-flashinfer-prebuilt needs the modules of one GPU arch, found 2 cached_ops folders" in r.stderr
