"""bench/startup_timeline.py reads where a recorded start's seconds went (issue 18's profile), from the H200 log
of session 7's seeded start: every step found, in order, adding up to the ready time the sidecar logged."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOG = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s7", "turingbox-soak64.log.gz")


def test_session7_seeded_start_timeline(tmp_path):
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"), LOG, "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=120)
    r = json.loads(out.read_text())
    steps = {s["step"]: s for s in r["steps"]}
    assert len(steps) == 14
    # a seeded entry holds vLLM's model infos: no subprocess inspection of the model classes
    assert steps["API server: model-class inspection (subprocesses without cached model infos)"]["seconds"] == 0.0
    assert "sidecar Python start + imports (turingbox)" not in steps   # no --t0: the first line starts the clock
    # the sidecar logged "ready after 111.7 s"; vLLM's own lines are known to the second
    assert abs(r["ready_s"] - 111.7) < 1.0
    assert abs(sum(s["seconds"] for s in r["steps"]) - r["ready_s"]) < 0.2
    assert steps["vLLM CLI + API-server imports"]["seconds"] == 16.3
    assert steps["engine-core process spawn + imports"]["seconds"] == 21.0
    assert steps["torch.compile from the cache (model + drafter)"]["seconds"] == 15.0
    assert steps["engine handshake, API server routes + chat template"]["seconds"] == 4.0
    assert steps["active warmup + checks (turingbox)"]["seconds"] == 12.1
    assert r["recompiled"] is False
    starts = [s["start_s"] for s in r["steps"]]
    assert starts == sorted(starts)


def test_session8_plain_vllm_log_with_the_harness_clock(tmp_path):
    """Plain `vllm serve` prints no sidecar line: --t0 and --ready-s come from the harness (session-a.log)."""
    log = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s8", "plain-soak64.log.gz")
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"), log, "--json", str(out),
                    "--t0", "2026-12-02 05:06:37.4", "--ready-s", "113.6"],
                   check=True, capture_output=True, text=True, timeout=120)
    r = json.loads(out.read_text())
    steps = {s["step"]: s for s in r["steps"]}
    assert r["recompiled"] is True and r["ready_s"] == 113.6
    assert not any("turingbox" in name or "plugin" in name for name in steps)
    assert steps["vLLM CLI + API-server imports"]["seconds"] == 16.6
    assert steps["torch.compile, recompiled: cache miss (model + drafter)"]["seconds"] == 53.0
    assert abs(sum(s["seconds"] for s in r["steps"]) - r["ready_s"]) < 0.2


def test_session9_cold_awq_start_spends_66_s_inspecting_the_model_classes(tmp_path):
    """An empty entry: vLLM imports Qwen3_5ForConditionalGeneration, then Qwen3_5MTP, each in a subprocess; the
    step ends at the second "Resolved architecture" line, not the first."""
    log = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s9", "turingbox-soakawq.log.gz")
    out = tmp_path / "a.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"), log, "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=120)
    steps = {s["step"]: s for s in json.loads(out.read_text())["steps"]}
    assert steps["API server: model-class inspection (subprocesses without cached model infos)"]["seconds"] == 66.0
    assert steps["API server: config, tokenizer + model-module import"]["seconds"] == 5.0


def test_inspection_step_ends_before_later_milestones_when_the_next_is_absent(tmp_path):
    """Session 9's fork check has no API-server text-only line (the next milestone): the inspection step still
    ends at its own last "Resolved architecture" (54 s), not at one of a later start in the same file."""
    import gzip
    s9 = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s9")
    log = tmp_path / "two-starts.log"
    log.write_bytes(gzip.open(os.path.join(s9, "fork-check-4layer.log.gz")).read()
                    + gzip.open(os.path.join(s9, "turingbox-soakawq.log.gz")).read())
    out = tmp_path / "f.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"), str(log), "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=120)
    steps = {s["step"]: s for s in json.loads(out.read_text())["steps"]}
    assert steps["API server: model-class inspection (subprocesses without cached model infos)"]["seconds"] == 54.0


def test_a_log_without_milestones_is_one_sentence(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("nothing here\n")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"), str(log)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "no timestamped turingbox/vLLM lines" in p.stderr
    assert "Traceback" not in p.stderr


def test_session12_bench_logs_use_the_harness_offsets(tmp_path):
    """bench/startup.py --copy-logs prefixes every line with the seconds since it started the process (ms): the
    timeline uses them, not vLLM's whole-second stamps, and needs no --t0 (session 12's seeded pair, H200)."""
    data = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s12")
    results = {}
    for name, ready in (("seeded-turingbox", 75.464), ("seeded-plain", 181.263)):
        out = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "startup_timeline.py"),
                        os.path.join(data, f"{name}.log.gz"), "--json", str(out), "--ready-s", str(ready)],
                       check=True, capture_output=True, text=True, timeout=120)
        results[name] = json.loads(out.read_text())
    tb = {s["step"]: s for s in results["seeded-turingbox"]["steps"]}
    assert tb["sidecar Python start + imports (turingbox)"]["start_s"] == 0.0     # the harness' own start
    assert tb["vLLM CLI + API-server imports"]["seconds"] == 13.6                  # 1.139 -> 14.728 in the log
    assert tb["strict warmup (plugin)"]["seconds"] == 15.6
    assert results["seeded-turingbox"]["recompiled"] is False
    assert abs(results["seeded-turingbox"]["ready_s"] - 75.5) < 0.1
    plain = {s["step"]: s for s in results["seeded-plain"]["steps"]}
    assert plain["vLLM CLI + API-server imports"]["start_s"] == 0.0
    assert plain["torch.compile from the cache (model + drafter)"]["seconds"] > 90    # FLA autotunes again
    assert results["seeded-plain"]["recompiled"] is False


def test_offset_logs_keep_progress_redraws_in_their_line_and_skip_unstamped_lines(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import startup_timeline
    log = tmp_path / "x.log"
    log.write_bytes(
        b"    1.000 2026-12-02 10:00:00,000 INFO turingbox.serve: stage: planning -> starting (0.1 s since start)\n"
        b"    2.500 (APIServer pid=1) INFO 12-02 10:00:02 [utils.py:240] non-default args: {}\n"
        b"no offset here: a line the harness did not stamp\n"
        b"    9.250 (EngineCore pid=2) Capturing CUDA graphs:  50%\rCapturing CUDA graphs: 100%\n")
    with startup_timeline.open_log(str(log)) as f:
        lines = f.readlines()
    assert len(lines) == 4 and "\r" in lines[3]
    r = startup_timeline.parse(lines, ready_s=12.0)
    assert r["t0"] is None and r["ready_s"] == 12.0
    # vLLM's arguments line at the harness' 2.500 s (its own stamp says only 10:00:02); the unstamped line is skipped
    assert [(x["step"], x["start_s"], x["seconds"]) for x in r["steps"]] == [
        ("vLLM CLI + API-server imports", 0.0, 2.5), ("until the harness saw ready", 2.5, 9.5)]
