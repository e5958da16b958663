"""Warmup wave planning (pure) and worker status files."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from turingbox_plugin.status import StatusWriter, check_all_ready, read_worker_status, write_status_atomic
from turingbox_plugin.warmup_plan import (choose_concurrencies, int_class, padded_size, plan_waves)

CAPTURE = (1, 2, 4) + tuple(range(8, 513, 8))   # vLLM's default capture-size ladder shape


def test_int_class_matches_triton_specialisation():
    assert [int_class(x) for x in (1, 2, 15, 16, 17, 32, 48)] == ["one", "other", "other", "div16", "other",
                                                                    "div16", "div16"]
    assert padded_size(3, (1, 2, 4, 8)) == 4 and padded_size(9, (1, 2, 4, 8)) == 9 and padded_size(5, ()) == 5


@settings(max_examples=60, deadline=None)
@given(max_num_seqs=st.integers(1, 300), k=st.integers(0, 5))
def test_concurrencies_cover_every_reachable_key(max_num_seqs, k):
    chosen = choose_concurrencies(max_num_seqs, k, CAPTURE, max_count=64)
    key = lambda n: (int_class(n), int_class(n * (k + 1)), int_class(padded_size(n * (k + 1), CAPTURE)))
    covered = {key(n) for n in chosen}
    assert all(key(n) in covered for n in range(1, min(max_num_seqs, 512) + 1))
    assert chosen == sorted(chosen) and chosen[0] == 1 and max(chosen) <= max_num_seqs


def test_waves_for_the_demo_plan():
    waves = plan_waves(max_num_seqs=16, num_spec_tokens=3, max_model_len=8192, max_num_batched_tokens=2048,
                       capture_sizes=(1, 2, 4, 8, 16, 24, 32))
    names = [w.name for w in waves]
    assert names[:4] == ["single-greedy-1tok", "single-sampled-32tok", "long-prompt-chunked", "long-prompt-prefix-hit"]
    assert "batch-16-all-greedy" in names and "batch-16-all-sampled" in names
    long_a, long_b = waves[2].requests[0], waves[3].requests[0]
    assert long_a.prompt_len > 2048 and (long_a.prompt_len, long_a.prompt_seed) == (long_b.prompt_len, long_b.prompt_seed)
    for w in waves:
        for r in w.requests:
            assert r.prompt_len + r.max_tokens <= 8192
            assert r.max_tokens >= 3 * (3 + 1)           # several MTP rounds even if all drafts accepted
    mixed = [w for w in waves if "mixed" in w.name]
    assert mixed and all({r.sampling for r in w.requests} >= {"greedy", "sampled"} for w in mixed if len(w.requests) >= 2)
    assert all(any(r.delay_steps for r in w.requests) for w in mixed)   # staggered: prefill mixed with decode
    # a 1-, 16- and 17-token prefill each alone beside running decodes (one Triton int class each)
    join = next(w for w in waves if w.name == "short-prompts-join-decodes")
    decoders = [r for r in join.requests if r.delay_steps == 0]
    joiners = sorted((r.delay_steps, r.prompt_len) for r in join.requests if r.delay_steps)
    assert [n for _, n in joiners] == [1, 16, 17] and len({d for d, _ in joiners}) == 3
    assert decoders and all(d.max_tokens >= 3 * r.max_tokens for d in decoders for r in join.requests if r.delay_steps)


def test_waves_respect_tiny_limits_and_reject_nonsense():
    waves = plan_waves(max_num_seqs=1, num_spec_tokens=0, max_model_len=64, max_num_batched_tokens=32)
    assert [w.name for w in waves] == ["single-greedy-1tok", "single-sampled-32tok"]
    assert all(r.prompt_len + r.max_tokens <= 64 for w in waves for r in w.requests)
    with pytest.raises(ValueError):
        plan_waves(0, 0, 1024, 1024)


def test_status_writer_and_reader(tmp_path):
    d = str(tmp_path / "run")
    w1 = StatusWriter(d, 1, {"plugin_version": "0.1.0", "stage": "starting", "gdn_path": "vllm"})
    w0 = StatusWriter(d, 0, {"plugin_version": "0.1.0", "stage": "starting", "gdn_path": "vllm"})
    w0.update(stage="ready", warmup={"kernels": 12, "seconds": 1.5, "ok": True, "error": None})
    w1.update(stage="warming")
    statuses = read_worker_status(d)
    assert [s["rank"] for s in statuses] == [0, 1]
    assert statuses[0]["warmup"] == {"kernels": 12, "seconds": 1.5, "ok": True, "error": None}
    assert statuses[0]["pid"] == os.getpid() and statuses[0]["jit_after_ready"] == {}
    assert "rank 1 is at stage 'warming'" in check_all_ready(statuses, 2)
    assert "rank(s) [2]" in check_all_ready(statuses, 3)
    w1.update(stage="ready", warmup={"ok": True, "kernels": 3, "seconds": 0.1})
    assert check_all_ready(read_worker_status(d), 2) is None
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]          # atomic: no leftovers
    (tmp_path / "run" / "worker-7.json").write_text("{not json")
    bad = read_worker_status(d)[-1]
    assert bad["rank"] == 7 and bad["stage"] == "unreadable"


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    p = str(tmp_path / "worker-0.json")
    write_status_atomic(p, {"stage": "ready"})
    with pytest.raises(TypeError):
        write_status_atomic(p, {"stage": object.__new__(type("X", (), {"__str__": None}))})
    assert json.load(open(p)) == {"stage": "ready"}
    assert os.listdir(tmp_path) == ["worker-0.json"]


def test_wave_seconds_line_names_every_wave_and_the_total():
    from turingbox_plugin.driver import describe_waves
    line = describe_waves([{"wave": "single-greedy-1tok", "requests": 1, "steps": 2, "seconds": 0.4},
                           {"wave": "long-prompt-chunked", "requests": 1, "steps": 5, "seconds": 3.3}])
    assert line == ("waves in 3.7 s: single-greedy-1tok 0.40 s (2 steps), "
                    "long-prompt-chunked 3.30 s (5 steps)")
