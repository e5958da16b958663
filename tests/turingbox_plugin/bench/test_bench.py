"""Benchmark maths against numpy, and bench decode/prefill + active warmup against real HTTP servers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from turingbox.serve.active_warmup import WarmupError, run_active_warmup
from turingbox_plugin.bench import stats
from turingbox_plugin.bench.client import bench_decode, bench_prefill, plot_prefill
from turingbox_plugin.errors import ToolError

# TTFT medians recorded by the seed's prefill bench shape (tokens, seconds): close to a line, not on it.
RECORDED = [(2048, 0.412), (4096, 0.771), (8192, 1.530), (16384, 3.102), (32768, 6.391)]
RECORDED_TTFTS = [0.405, 0.398, 0.431, 0.412, 0.409, 0.44, 0.401]


def test_median_percentile_match_numpy():
    for xs in (RECORDED_TTFTS, [1.0], [3.0, 1.0], list(range(10))):
        assert stats.median(xs) == pytest.approx(float(np.median(xs)))
        for p in (0, 50, 90, 100):
            assert stats.percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    with pytest.raises(ValueError):
        stats.median([])
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_ttft_fit_matches_numpy_polyfit():
    fit = stats.fit_ttft(RECORDED)
    slope, intercept = np.polyfit([t for t, _ in RECORDED], [s for _, s in RECORDED], 1)
    assert fit.slope == pytest.approx(slope) and fit.intercept == pytest.approx(intercept)
    ys = np.array([s for _, s in RECORDED])
    pred = intercept + slope * np.array([t for t, _ in RECORDED])
    assert fit.r2 == pytest.approx(1 - ((ys - pred) ** 2).sum() / ((ys - ys.mean()) ** 2).sum())
    assert 0.99 < fit.r2 < 1.0
    assert fit.prefill_tokens_per_s == pytest.approx(1 / slope)
    exact = stats.fit_ttft([(1000, 0.1 + 1000 / 5000), (3000, 0.1 + 3000 / 5000)])
    assert exact.overhead_s == pytest.approx(0.1) and exact.prefill_tokens_per_s == pytest.approx(5000)
    assert exact.r2 == pytest.approx(1.0)
    with pytest.raises(ValueError):
        stats.fit_ttft([(1000, 0.2), (1000, 0.3)])


def test_decode_summary():
    runs = [{"completion_tokens": 512, "seconds": 3.0}, {"completion_tokens": 512, "seconds": 2.0},
            {"completion_tokens": 256, "seconds": 2.0}]
    s = stats.decode_summary(runs)
    assert s["tok_per_s_mean"] == pytest.approx((512 / 3 + 256 + 128) / 3)
    assert s["tok_per_s_median"] == pytest.approx(512 / 3)
    assert s["seconds_median"] == 2.0


def test_bench_decode_against_server(fake_vllm_factory):
    url = fake_vllm_factory()
    r = bench_decode(url, repeats=3, max_tokens=7)
    assert r["model"] == "demo" and len(r["runs"]) == 3
    expected_text = "".join(f"tok{i} " for i in range(7))
    import hashlib
    for run in r["runs"]:
        assert run["completion_tokens"] == 7 and run["output_chars"] == len(expected_text)
        assert run["output_sha256"] == hashlib.sha256(expected_text.encode()).hexdigest()
        assert run["tok_per_s"] == pytest.approx(7 / run["seconds"], rel=1e-3)
    assert r["summary"]["requests"] == 3


def test_bench_prefill_recovers_server_model(ttft_server, tmp_path):
    url, overhead, per_token = ttft_server
    r = bench_prefill(url, lengths=(500, 1500, 3000), requests_per_length=3)
    assert [p["tokens"] for p in r["lengths"]] == [500, 1500, 3000]
    assert all(len(p["ttft_s"]) == 3 for p in r["lengths"])
    fit = r["fit"]
    assert fit["r2"] > 0.98
    assert fit["prefill_tokens_per_s"] == pytest.approx(1 / per_token, rel=0.3)
    # The fitted overhead includes the real HTTP/JSON round trip on top of the server's sleep.
    assert overhead - 0.005 < fit["overhead_s"] < overhead + 0.15
    png = plot_prefill(r, str(tmp_path / "prefill.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_bench_prefill_skips_lengths_beyond_context(fake_vllm_factory):
    url = fake_vllm_factory()
    r = bench_prefill(url, lengths=(64, 128, 8192), requests_per_length=2)
    assert [p["tokens"] for p in r["lengths"]] == [64, 128]
    assert r["skipped"] == [{"tokens": 8192, "reason": "exceeds max_model_len 4096"}]


def test_bench_cli_unreachable_server_is_one_sentence(tmp_path):
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "turingbox_plugin.cli", "bench", "decode", "--url",
                        "http://127.0.0.1:9", "--repeats", "1", "--output", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot reach" in r.stderr
    assert not out.exists()


def test_bench_cli_json_and_files(fake_vllm_factory, tmp_path):
    url = fake_vllm_factory()
    out = tmp_path / "prefill.json"
    r = subprocess.run([sys.executable, "-m", "turingbox_plugin.cli", "bench", "prefill", "--url", url,
                        "--lengths", "100,200", "--requests", "2", "--json", "--output", str(out),
                        "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lengths"] == json.loads(out.read_text())["lengths"]
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_active_warmup_runs_every_shape(fake_vllm_factory, tmp_path):
    events = tmp_path / "events.jsonl"
    url = fake_vllm_factory(env={"FAKE_VLLM_EVENTS": str(events)})
    r = run_active_warmup(url, "demo", timeout=60, concurrencies=(1, 3))
    assert [x["name"] for x in r["requests"]] == ["chat-greedy", "chat-sampled-stream", "completion-greedy-stream",
                                                  "completion-sampled", "chat-long-prompt", "chat-tool-call",
                                                  "chat-forced-tool-call", "chat-json-object", "chat-json-allowed-ids"]
    assert [b["concurrency"] for b in r["concurrency"]] == [1, 3]
    assert all(x["ttft_seconds"] is not None for x in r["requests"] if "stream" in x["name"])
    seen = [json.loads(l) for l in events.read_text().splitlines() if '"request"' in l]
    seen = [e for e in seen if e.get("kind", e.get("event")) == "request"] or seen
    assert sum(1 for e in seen if e.get("stream")) >= 2
    assert len(seen) == 9 + 1 + 3
    allowed = next(e for e in seen if e.get("allowed_token_ids"))     # "{" from the fake's /tokenize
    assert allowed["allowed_token_ids"] == [1000 + ord("{")]
    assert max(e["bytes"] for e in seen) > 10_000                      # the long prompt really is long


def test_active_warmup_fails_with_one_sentence(fake_vllm_factory):
    url = fake_vllm_factory("--fake-die-after-chunks", "2")
    with pytest.raises(WarmupError) as e:
        run_active_warmup(url, "demo", timeout=30)
    assert "active warmup request" in str(e.value) and "\n" not in str(e.value)


def test_active_warmup_auth(fake_vllm_factory):
    url = fake_vllm_factory("--api-key", "s3cret")
    with pytest.raises(WarmupError, match="HTTP 401"):
        run_active_warmup(url, "demo", timeout=30)
    assert run_active_warmup(url, "demo", api_key="s3cret", timeout=30, concurrencies=(2,))["requests"]


def _recorded_bodies(record) -> list[dict]:
    return [json.loads(line)["body"] for line in record.read_text().splitlines()]


def test_active_warmup_sends_grammar_requests_with_thinking_off(openai_recorder):
    url, record = openai_recorder()
    r = run_active_warmup(url, "demo", timeout=60, concurrencies=(1,))
    results = {x["name"]: x for x in r["requests"]}
    assert results["chat-forced-tool-call"]["structured_applied"] is True
    assert results["chat-json-object"]["structured_applied"] is True
    bodies = _recorded_bodies(record)
    forced = [b for b in bodies if isinstance(b.get("tool_choice"), dict)]
    assert len(forced) == 1 and forced[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert forced[0]["tools"][0]["function"]["name"] == "get_weather" and not forced[0].get("stream")
    json_mode = [b for b in bodies if b.get("response_format") and not b.get("allowed_token_ids")]
    assert len(json_mode) == 1 and json_mode[0]["response_format"] == {"type": "json_object"}
    for b in forced + json_mode:
        assert b["chat_template_kwargs"] == {"enable_thinking": False} and b["max_tokens"] == 32
    # the stand-in has vLLM's /tokenize, so the grammar with allowed_token_ids ("{") goes out too
    [allowed] = [b for b in bodies if b.get("allowed_token_ids")]
    assert allowed["response_format"] == {"type": "json_object"} and allowed["allowed_token_ids"] == [1000 + ord("{")]
    assert allowed["chat_template_kwargs"] == {"enable_thinking": False}


def test_active_warmup_grammar_refusal_is_not_fatal(openai_recorder):
    url, _ = openai_recorder("refuse")
    r = run_active_warmup(url, "demo", timeout=60, concurrencies=(2,))
    results = {x["name"]: x for x in r["requests"]}
    for name in ("chat-forced-tool-call", "chat-json-object"):
        assert "HTTP 400" in results[name]["skipped"] and "structured outputs are not supported" in results[name]["skipped"]
    assert "skipped" not in results["chat-greedy"] and results["chat-tool-call"]["chunks"] == 1
    assert r["concurrency"][0]["concurrency"] == 2


def test_active_warmup_grammar_requests_are_time_bounded(openai_recorder, monkeypatch):
    from turingbox.serve import active_warmup

    monkeypatch.setattr(active_warmup, "OPTIONAL_TIMEOUT_S", 0.5)
    url, _ = openai_recorder("apply", "--fake-structured-delay", "5")
    r = run_active_warmup(url, "demo", timeout=60, concurrencies=())
    results = {x["name"]: x for x in r["requests"]}
    assert "ReadTimeout" in results["chat-forced-tool-call"]["skipped"]   # the server answers after 5 s
    assert "skipped" not in results["completion-sampled"]
