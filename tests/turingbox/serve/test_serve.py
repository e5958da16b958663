"""`turingbox serve` end to end: real serve process, real fake-vLLM HTTP process, real signals."""
from __future__ import annotations

import json
import re
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.sidecar_harness import FAKE_VLLM, H200, NO_GPUS, REPO, Serve, make_model_dir, pid_alive, sse_events
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

CHUNK_DELAY = 0.15


def stream_events(client: httpx.Client, path: str, body: dict, headers: dict | None = None, stop_after: int | None = None):
    """POST a streaming request; return [(arrival_s, event)] with the arrival time of every SSE event."""
    got, buf = [], b""
    t0 = time.monotonic()
    with client.stream("POST", path, json=body, headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for piece in r.iter_raw():
            now = time.monotonic() - t0
            buf += piece
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                for ev in sse_events(raw.decode().splitlines()):
                    got.append((now, ev))
            if stop_after is not None and len(got) >= stop_after:
                break
    return got


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One ready server shared by the read-only tests: API key on, vLLM with its own key, slow chunks."""
    s = Serve(str(tmp_path_factory.mktemp("shared")),
              env={"TURINGBOX_API_KEY": "side-key-123", "FAKE_VLLM_CHUNK_DELAY": str(CHUNK_DELAY),
                   "FAKE_VLLM_JIT_AFTER_READY": "rejection_greedy_sample_kernel=2",
                   "TURINGBOX_MAX_REQUEST_BYTES": "65536"},
              passthrough=["--api-key", "vllm-key-456"])
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


AUTH = {"Authorization": "Bearer side-key-123"}


def test_stages_before_ready_then_ready(serve_factory):
    # The real active warmup (turingbox.serve.active_warmup) runs here, against the fake.
    s = serve_factory(env={"FAKE_VLLM_STAGE_SECONDS": "0.6", "TURINGBOX_ACTIVE_WARMUP": "1"})
    seen, bodies = [], []
    live_during_startup = startup_before = v1_before = None

    def poll():
        nonlocal live_during_startup, startup_before, v1_before
        try:
            r = s.get("/health/ready", timeout=1.0)
        except httpx.HTTPError:
            return False
        if r.status_code == 200:
            return True
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        body = r.json()
        bodies.append(body)
        if not seen or seen[-1] != body["stage"]:
            seen.append(body["stage"])
        if body["stage"] == "loading":
            live_during_startup = s.get("/health/live").status_code
            startup_before = s.get("/health/startup").status_code
            v1 = s.client.post("/v1/chat/completions", json={"messages": []})
            v1_before = (v1.status_code, v1.headers.get("retry-after"), v1.json()["error"]["stage"])
        return False

    wait_until(poll, 30, what="ready")
    assert [st for st in seen if st in ("loading", "compiling", "capturing")] == ["loading", "compiling", "capturing"]
    assert seen.index("loading") > seen.index("starting") if "starting" in seen else True
    for body in bodies:
        assert set(body) >= {"stage", "elapsed_s", "estimate_s", "reason"}
        assert body["estimate_s"] > 0 and body["reason"]
    assert live_during_startup == 200
    assert startup_before == 503
    assert v1_before[0] == 503 and int(v1_before[1]) >= 1 and v1_before[2] in ("loading", "compiling", "capturing")
    assert s.get("/health/startup").status_code == 200
    assert s.get("/health/live").json()["stage"] == "ready"
    out = s.output()
    if "active warmup skipped" not in out:
        assert "active warmup {" in out and s.events("request")      # real requests went through vLLM before ready
        # allowed_token_ids + a grammar, from vLLM's own /tokenize of "{": builds the plugin's check before ready
        assert s.events("tokenize") and '"chat-json-allowed-ids"' in out


def test_streaming_passes_chunks_one_by_one(server):
    n = 6
    got = stream_events(server.client, "/v1/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                         "max_tokens": n}, headers=AUTH)
    content = [(t, e) for t, e in got if isinstance(e, dict) and e.get("choices")]
    assert [e["fake_seq"] for _, e in content] == list(range(n))
    assert got[-1][1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"]["content"] for _, e in content) == "".join(f"tok{i} " for i in range(n))
    times = [t for t, _ in content]
    # Each chunk arrives on its own, about one delay after the previous one: nothing is held back.
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g > CHUNK_DELAY * 0.5 for g in gaps), gaps
    assert times[0] < times[-1] - (n - 2) * CHUNK_DELAY * 0.8, times


def test_streaming_completions_and_usage(server):
    got = stream_events(server.client, "/v1/completions",
                        {"model": "m", "prompt": "x", "stream": True, "max_tokens": 3,
                         "stream_options": {"include_usage": True}}, headers=AUTH)
    events = [e for _, e in got]
    assert [e["choices"][0]["text"] for e in events[:3]] == ["tok0 ", "tok1 ", "tok2 "]
    assert events[3]["usage"]["completion_tokens"] == 3
    assert events[4] == "[DONE]"


def test_non_streaming(server):
    r = server.client.post("/v1/completions?trace=1", json={"model": "m", "prompt": "x", "max_tokens": 3},
                           headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.json()["choices"][0]["text"] == "tok0 tok1 tok2 "
    assert server.events("request")[-1]["query"] == "trace=1"
    r = server.client.post("/v1/chat/completions", json={"model": "m", "messages": [], "max_tokens": 2},
                           headers=AUTH)
    assert r.json()["choices"][0]["message"]["content"] == "tok0 tok1 "
    models = server.get("/v1/models", headers=AUTH)
    assert models.status_code == 200 and models.json()["data"][0]["id"]
    # Invalid JSON reaches vLLM unchanged and its 400 comes back unchanged.
    bad = server.client.post("/v1/chat/completions", content=b"{not json", headers=AUTH)
    assert bad.status_code == 400 and "invalid JSON" in bad.json()["error"]["message"]


def test_oversized_body_refused(server):
    n_requests = len(server.events("request"))
    big = {"model": "m", "prompt": "x" * 70_000, "max_tokens": 1}
    r = server.client.post("/v1/completions", json=big, headers=AUTH)
    assert r.status_code == 413 and "65536 bytes" in r.json()["error"]["message"]

    def chunked():          # no Content-Length: the limit holds while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"y" * 4096
        yield b'"}'
    r = server.client.post("/v1/completions", content=chunked(), headers=AUTH)
    assert r.status_code == 413
    assert len(server.events("request")) == n_requests          # nothing reached vLLM
    ok = server.client.post("/v1/completions", json={"prompt": "x" * 60_000, "max_tokens": 1}, headers=AUTH)
    assert ok.status_code == 200


def test_api_key_enforced_and_swapped_for_vllms_own(server):
    body = {"model": "m", "messages": [], "max_tokens": 1}
    missing = server.client.post("/v1/chat/completions", json=body)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "API key" in missing.json()["error"]["message"]
    wrong = server.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer side-key-12"})
    assert wrong.status_code == 401
    basic = server.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Basic side-key-123"})
    assert basic.status_code == 401
    assert server.get("/v1/models").status_code == 401
    assert server.get("/turingbox/plan").status_code == 401
    # Health stays open; metrics too unless metrics_require_key.
    for path in ("/health/live", "/health/ready", "/health/startup", "/metrics"):
        assert server.get(path).status_code == 200, path
    ok = server.client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert ok.status_code == 200
    # vLLM got its own key (passed after --), never the client's.
    last = server.events("request")[-1]
    assert last["authorization"] == "Bearer vllm-key-456"


def test_no_secret_in_plan_or_logs(server):
    plan = server.get("/turingbox/plan", headers=AUTH)
    assert plan.status_code == 200
    assert plan.json()["vllm_args"][0] == "serve"
    out = server.output()
    assert "non-default args" in out            # the fake's line that carries its key went through...
    for secret in ("side-key-123", "vllm-key-456"):
        assert secret not in plan.text
        assert secret not in out                 # ...masked
    plan_lines = [line for line in out.splitlines() if "turingbox.serve: plan {" in line]
    assert len(plan_lines) == 1 and json.loads(plan_lines[0].split("plan ", 1)[1])["vllm_args"]
    assert plan.json()["api_key"] == "on"
    assert [line.split(": ", 1)[1] for line in out.splitlines() if "turingbox.serve: API key:" in line] == \
        ["API key: on (/v1/* and /turingbox/plan need 'Authorization: Bearer <key>')"]


def test_vllms_token_routes_are_proxied_like_v1(server):
    """vLLM serves /tokenize and /detokenize beside /v1; a client of vLLM's server (the soak among them) counts
    tokens with them. They pass through the proxy with the same API key, readiness and metrics as /v1."""
    body = {"model": "m", "prompt": "hello"}
    assert server.client.post("/tokenize", json=body).status_code == 401
    r = server.client.post("/tokenize", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 5 and r.json()["tokens"] == [1000 + ord(c) for c in "hello"]
    assert server.events("tokenize")[-1]["prompt"] == "hello"
    back = server.client.post("/detokenize", json={"model": "m", "tokens": r.json()["tokens"]}, headers=AUTH)
    assert back.status_code == 200 and back.json() == {"prompt": "hello"}
    chat = server.client.post("/tokenize", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                              headers=AUTH)
    assert chat.status_code == 200 and chat.json()["count"] == 2
    wait_until(lambda: 'turingbox_proxy_requests_total{code="200",route="tokenize"}' in server.metrics(), 10,
               what="/tokenize counted in /metrics")
    schema = server.get("/openapi.json").json()
    assert schema["paths"]["/tokenize"]["post"]["security"] == [{"bearer": []}]
    get = server.get("/tokenize", headers=AUTH)              # vLLM's routes take POST only
    assert get.status_code == 405 and get.headers["allow"] == "POST"


def test_metrics(server):
    def sample(text: str, line_start: str) -> float:
        values = [float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_start + " ")]
        return values[0] if values else 0.0

    completions = 'turingbox_proxy_requests_total{code="200",route="completions"}'
    durations = 'turingbox_proxy_request_duration_seconds_count{route="completions"}'
    before = server.metrics()
    r = server.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, headers=AUTH)
    assert r.status_code == 200, r.text
    # The sidecar counts a request in its handler's `finally`, which may run just after the client has the
    # body: poll (bounded) until this very request is counted, not merely until some earlier one shows.
    text = wait_until(lambda: (lambda t: sample(t, completions) == sample(before, completions) + 1
                               and sample(t, durations) == sample(before, durations) + 1
                               and "turingbox_proxy_in_flight_requests 0.0" in t and t)(server.metrics()),
                      10, what="the completion counted in /metrics")
    assert 'turingbox_proxy_time_to_first_byte_seconds_count{route="completions"}' in text
    assert 'turingbox_proxy_rejected_total{reason="unauthorized"}' in text or "unauthorized" not in text
    assert 'turingbox_stage{stage="ready"} 1.0' in text
    # the stand-in vLLM prints no graph lines, and this start had no cache hit: nothing to flag
    assert 'turingbox_startup_vllm_graphs{source="compiled"} 0.0' in text
    assert "turingbox_startup_compile_cache_mismatch 0.0" in text
    for stage in ("planning", "starting", "loading", "compiling", "capturing", "warming"):
        assert f'turingbox_startup_stage_seconds{{stage="{stage}"}}' in text, stage
    assert "turingbox_jit_after_ready_total 2.0" in text
    assert 'turingbox_jit_after_ready_by_kernel_total{kernel="rejection_greedy_sample_kernel",rank="0"} 2.0' in text
    assert 'turingbox_warmup_ok{rank="0"} 1.0' in text


def test_client_disconnect_cancels_upstream(server):
    before = len(server.events("cancelled"))
    got = stream_events(server.client, "/v1/chat/completions",
                        {"model": "m", "messages": [], "stream": True, "max_tokens": 60}, headers=AUTH, stop_after=2)
    assert len(got) >= 2          # leaving the `with` closed the client connection mid-stream
    rid = server.events("request")[-1]["id"]
    cancelled = wait_until(lambda: [e for e in server.events("cancelled")[before:] if e["id"] == rid], 10,
                           what="the fake to see the cancellation")
    assert cancelled[0]["chunks_sent"] < 60
    assert not [e for e in server.events("completed") if e["id"] == rid]
    wait_until(lambda: "turingbox_proxy_in_flight_requests 0.0" in server.metrics(), 5, what="in-flight back to 0")
    assert "turingbox_proxy_client_disconnects_total 1.0" in server.metrics()


def test_upstream_hang_turns_readiness_503_and_back(server):
    hang = os.path.join(server.control, "hang")
    open(hang, "w").close()
    try:
        body = wait_until(lambda: (lambda r: r.status_code == 503 and r.json())(server.get("/health/ready")), 5,
                          what="readiness 503 while vLLM hangs")
        assert body["stage"] == "unresponsive" and "/health" in body["reason"]
        assert server.get("/health/live").status_code == 200
    finally:
        os.unlink(hang)
    wait_until(lambda: server.get("/health/ready").status_code == 200, 5, what="readiness back")


def test_sigterm_drains_in_flight_then_stops_vllm(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_CHUNK_DELAY": "0.15", "FAKE_VLLM_CHILD": "1",
                           "TURINGBOX_DRAIN_GRACE_SECONDS": "20"})
    s.wait_ready()
    child = s.events("child")[0]["child_pid"]
    fake = s.events("started")[0]["pid"]
    n = 12
    got, buf = [], b""
    with s.client.stream("POST", "/v1/chat/completions", json={"messages": [], "stream": True, "max_tokens": n}) as r:
        for piece in r.iter_raw():
            buf += piece
            if not got:     # first bytes are here: the request is in flight; now ask serve to stop
                s.signal(signal.SIGTERM)
                ready = s.get("/health/ready")
                assert ready.status_code == 503 and ready.json()["stage"] == "draining"
                new = s.client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 1})
                assert new.status_code == 503 and new.headers["retry-after"]
                assert s.get("/health/live").status_code == 200
            got.append(piece)
    events = sse_events(buf.decode().splitlines())
    assert events[-1] == "[DONE]" and len(events) == n + 1          # the in-flight stream completed
    assert s.wait_exit() == 0
    completed = s.events("completed")[-1]["t"]
    sigterm = s.events("sigterm")[0]["t"]
    assert sigterm >= completed                                     # vLLM was stopped only after the drain
    assert not pid_alive(fake) and not pid_alive(child)             # the whole process group is gone
    assert "drained: exiting" in s.output()


def test_sigterm_during_startup_stops_vllm_and_exits_0(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_STAGE_SECONDS": "5", "TURINGBOX_API_KEY": "k",
                           "TURINGBOX_METRICS_REQUIRE_KEY": "1"})
    wait_until(lambda: s.alive() and s.get("/health/ready").json()["stage"] == "loading", 20, what="loading")
    assert s.get("/metrics").status_code == 401
    assert "turingbox_stage" in s.get("/metrics", headers={"Authorization": "Bearer k"}).text
    fake = s.events("started")[0]["pid"]
    s.signal(signal.SIGTERM)
    assert s.wait_exit(timeout=10) == 0
    assert s.events("sigterm") and not pid_alive(fake)


def test_second_signal_forces_fast_exit(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_CHUNK_DELAY": "0.1", "TURINGBOX_DRAIN_GRACE_SECONDS": "30",
                           "FAKE_VLLM_CHILD": "1"})
    s.wait_ready()
    fake, child = s.events("started")[0]["pid"], s.events("child")[0]["child_pid"]
    with s.client.stream("POST", "/v1/chat/completions", json={"messages": [], "stream": True, "max_tokens": 500}) as r:
        next(r.iter_raw())
        s.signal(signal.SIGTERM)
        wait_until(lambda: s.get("/health/ready").json()["stage"] == "draining", 5)
        t0 = time.monotonic()
        s.signal(signal.SIGINT)
        code = s.wait_exit(timeout=5)
        assert time.monotonic() - t0 < 3
    assert code == 128 + signal.SIGINT
    wait_until(lambda: not pid_alive(fake) and not pid_alive(child), 5, what="vLLM's group killed")


def test_vllm_ignoring_sigterm_gets_sigkill(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_IGNORE_SIGTERM": "1", "TURINGBOX_VLLM_STOP_GRACE_SECONDS": "1"})
    s.wait_ready()
    fake = s.events("started")[0]["pid"]
    s.signal(signal.SIGTERM)
    assert s.wait_exit(timeout=10) == 0
    assert s.events("sigterm")            # it was asked first
    assert not pid_alive(fake)
    assert "sending SIGKILL" in s.output()


def test_upstream_death_mid_stream(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_DIE_AFTER_CHUNKS": "3", "FAKE_VLLM_EXIT_CODE": "7",
                           "FAKE_VLLM_CHUNK_DELAY": "0.05", "TURINGBOX_EXIT_LINGER_SECONDS": "3"})
    s.wait_ready()
    got = stream_events(s.client, "/v1/chat/completions", {"messages": [], "stream": True, "max_tokens": 10})
    events = [e for _, e in got]
    assert [e["fake_seq"] for e in events[:3]] == [0, 1, 2]
    assert "error" in events[3] and "exit code 7" in events[3]["error"]["message"]     # a clean error event
    assert events[4] == "[DONE]" and len(events) == 5
    live = s.get("/health/live")
    assert live.status_code == 503 and "exit code 7" in live.json()["reason"]
    assert s.get("/health/ready").status_code == 503
    code = s.wait_exit()
    assert code != 0
    out = s.output()
    assert "vLLM exited unexpectedly with exit code 7" in out
    assert "  | " in out and "dying on purpose" in out.split("log lines:")[-1]       # vLLM's last lines


def test_vllm_failing_during_startup(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_FAIL_AT": "compiling", "TURINGBOX_EXIT_LINGER_SECONDS": "0"})
    assert s.wait_exit() != 0
    out = s.output()
    assert "exited unexpectedly with exit code 3 during stage compiling" in out
    assert "fake failure while compiling" in out.split("log lines:")[-1]


def test_vllm_failing_names_the_cause_it_logged_far_above_its_last_lines(serve_factory):
    # session 8: a second server starting on the GPU while vLLM profiled; its cause is ~100 lines above the end
    s = serve_factory(env={"FAKE_VLLM_FAIL_AT": "compiling", "TURINGBOX_EXIT_LINGER_SECONDS": "3",
                           "FAKE_VLLM_FAIL_LINE": "Available KV cache memory: -71.52 GiB"})
    sentence = ("vLLM exited unexpectedly with exit code 3 during stage compiling. vLLM found -71.52 GiB left for its "
                "KV cache: GPU memory was taken while it measured (another server starting or stopping on the same "
                "GPU: start them one at a time), or the weights and activations do not fit its share (raise "
                "TURINGBOX_GPU_MEMORY_UTILIZATION).")
    def live_reason():
        try:
            r = s.get("/health/live", timeout=1.0)
        except httpx.HTTPError:
            return None
        return r.status_code == 503 and r.json()["reason"]
    assert wait_until(live_reason, timeout=30, what="liveness 503") == sentence
    assert s.wait_exit() == 1
    assert f"turingbox: {sentence} Its last" in s.output()


def assert_unplannable_start_exits_2(s: Serve, sentence: str) -> None:
    """Liveness turns 503 with the sentence, serve exits 2 with it as one stderr line: no traceback, vLLM never
    started, nothing left on disk."""
    def live_503():
        if s.proc.poll() is not None:
            raise AssertionError(f"serve exited ({s.proc.returncode}) before liveness was seen 503:\n{s.output()}")
        try:
            r = s.get("/health/live", timeout=1.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 503 and r
    live = wait_until(live_503, 20, 0.02, what="liveness 503")
    assert live.json()["status"] == "dead" and sentence in live.json()["reason"]
    ready = s.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["stage"] == "failed" and sentence in ready.json()["reason"]
    assert s.get("/turingbox/plan").status_code == 503
    assert s.wait_exit() == 2
    err = s.output()
    lines = [line for line in err.splitlines() if line.startswith("turingbox: ")]
    assert len(lines) == 1 and sentence in lines[0] and lines[0].endswith("."), err
    assert err.count(sentence) == 1, err                # said once, not also in a log line
    assert "Traceback" not in err and s.stdout() == ""
    assert not s.events("started")                     # vLLM never started
    assert s.temporaries() == [] and not os.path.exists(os.path.join(s.tmp, "runtime"))


def test_no_gpu_exits_2_with_the_sentence_after_liveness_503(serve_factory):
    s = serve_factory(gpus_json=NO_GPUS, split_stderr=True, env={"TURINGBOX_EXIT_LINGER_SECONDS": "3"})
    assert_unplannable_start_exits_2(s, "lists no GPU (an empty list); add inventory entries to it, or unset it "
                                        "to read the GPUs through NVML.")


def test_model_that_does_not_fit_exits_2_with_the_sentence(serve_factory, tmp_path):
    with open(H200) as f:
        gpus = json.load(f)
    gpus[0].update(name="Tesla T4", compute_capability="7.5", memory_total_mib=15360, memory_free_mib=15000)
    small = tmp_path / "t4.json"
    small.write_text(json.dumps(gpus))
    s = serve_factory(gpus_json=str(small), split_stderr=True, env={"TURINGBOX_EXIT_LINGER_SECONDS": "3"})
    assert_unplannable_start_exits_2(s, "the model does not fit on 1x Tesla T4 (15.0 GiB each)")
    assert "GiB per GPU" in s.output()


API_KEY_OFF_LINE = "API key: off ({why}): /v1 is open to anyone who reaches 127.0.0.1:{port}"


@pytest.mark.parametrize("value, why", [("", "TURINGBOX_API_KEY is set but empty"),
                                        (None, "TURINGBOX_API_KEY is not set")])
def test_api_key_off_is_a_logged_warning_and_shown_in_the_plan(serve_factory, value, why):
    """Compose passes TURINGBOX_API_KEY through empty from a host where it is unset: that is off, said so."""
    s = serve_factory(env={"TURINGBOX_API_KEY": value})
    s.wait_ready()
    lines = [line for line in s.output().splitlines() if "turingbox.serve: API key:" in line]
    assert len(lines) == 1 and " WARNING " in lines[0], lines
    assert lines[0].split("turingbox.serve: ", 1)[1] == API_KEY_OFF_LINE.format(why=why, port=s.port)
    plan = s.get("/turingbox/plan")
    assert plan.status_code == 200 and plan.json()["api_key"] == "off"
    ok = s.client.post("/v1/chat/completions", json={"model": "m", "messages": [], "max_tokens": 1})
    assert ok.status_code == 200


def test_the_plugin_in_vllm_reads_resolved_values_not_the_raw_turingbox_variables(serve_factory, tmp_path):
    """TURINGBOX_GDN=auto (the documented default) reached the workers raw and the plugin refused it. Now the
    plugin reads only its contract (turingbox_plugin.contract): the additional_config section and the
    ENGINE_ENV variables (TBPLUGIN_*), which the plan sets. The operator's raw TURINGBOX_* variables are still in
    vLLM's environment, and the plugin's settings, resolved from the child's real environment and argv, are the
    plan's anyway."""
    from turingbox_plugin.activation import argv_additional_config, resolve_settings
    from turingbox_plugin.contract import ENGINE_ENV, RUNTIME_DIR_ENV
    dump = tmp_path / "vllm-env.json"
    wrapper = tmp_path / "dump_env_then_fake_vllm.py"
    wrapper.write_text("import json, os, sys\n"
                       "with open(sys.argv[1], 'w') as f:\n    json.dump(dict(os.environ), f)\n"
                       f"os.execv(sys.executable, [sys.executable, {FAKE_VLLM!r}, *sys.argv[2:]])\n")
    s = serve_factory(env={"TURINGBOX_GDN": "auto", "TURINGBOX_STRICT_WARMUP": "0", "TURINGBOX_BENCHMARK_MODE": "0",
                           "TURINGBOX_VLLM_COMMAND": f"{sys.executable} {wrapper} {dump}",
                           "SOME_OTHER_SETTING": "kept"})
    s.wait_ready()
    child = json.loads(dump.read_text())
    plan = s.get("/turingbox/plan").json()
    assert child["TURINGBOX_GDN"] == "auto"          # no stripping: the plugin never reads it
    # (a variable the plan leaves unset, None, is not in the child's environment)
    assert {k: child.get(k) for k in ENGINE_ENV} == {k: plan["env"][k] for k in ENGINE_ENV}
    assert all(k.startswith("TBPLUGIN_") for k in ENGINE_ENV) and child["TURINGBOX_BENCHMARK_MODE"] == "0"
    instance = child[RUNTIME_DIR_ENV]                  # the engine's own directory under the configured one
    assert os.path.dirname(instance) == os.path.join(s.tmp, "runtime") and os.path.isdir(instance)
    assert os.path.basename(instance).startswith(f"turingbox-serve-{s.proc.pid}-")
    assert child["SOME_OTHER_SETTING"] == "kept" and child["FAKE_VLLM_EVENTS"] == s.events_path
    assert child["CUDA_VISIBLE_DEVICES"] == plan["env"]["CUDA_VISIBLE_DEVICES"] and "VLLM_PLUGINS" not in child
    argv = s.events("started")[0]["argv"]
    settings = resolve_settings(argv_additional_config(argv), env=child)      # raised "gdn = 'auto'" before
    assert settings.gdn == plan["plugin"]["gdn"] == "vllm" and settings.strict_warmup is False
    assert settings.to_dict() == {**plan["plugin"], "active": True, "runtime_dir": instance, "benchmark_mode": False,
                                  "autotune_compile_threads": None, "source": "additional_config"}


def test_bad_settings_exit_2_with_one_sentence(serve_factory):
    s = serve_factory(env={"TURINGBOX_DRAIN_GRACE_SECONDS": "soon"})
    assert s.wait_exit() == 2
    out = s.output().strip()
    assert out.count("\n") == 0 and "TURINGBOX_DRAIN_GRACE_SECONDS" in out and "Traceback" not in out
    s = serve_factory(passthrough=["--port", "9999"])
    assert s.wait_exit() == 2
    assert "--upstream-port" in s.output() and "Traceback" not in s.output()


def test_port_in_use_exit_2(serve_factory):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        s = serve_factory(args=["--port", str(port)])
        assert s.wait_exit() == 2
        assert f"cannot listen on 127.0.0.1:{port}" in s.output()


@pytest.fixture(scope="module")
def plan_without_runtime_dir(tmp_path_factory):
    """A saved plan that names no runtime dir (nor does the environment): serve makes one with mkdtemp."""
    d = tmp_path_factory.mktemp("plan")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    made = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--gpus-json", H200,
                           "--model", make_model_dir(str(d)), "--json"],
                          capture_output=True, text=True, check=True, env={**env, "TMPDIR": str(d)})
    plan = json.loads(made.stdout)
    del plan["env"]["TBPLUGIN_RUNTIME_DIR"]
    assert "runtime_dir" not in plan["plugin"]
    path = d / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path), plan["cache_key"]


@pytest.mark.parametrize("cache_mode, ending", [
    ("private", "sigterm-when-ready"),
    ("cold", "sigterm-during-startup"),
    ("cold", "vllm-fails"),
    ("private", "second-signal"),
])
def test_serve_removes_its_temporary_dirs_on_every_exit(serve_factory, tmp_path, plan_without_runtime_dir,
                                                        cache_mode, ending):
    """A private/cold cache copy and a mkdtemp runtime dir are serve's own: they go when it exits, however
    it exits, so restarts do not fill TMPDIR. The configured cache volume stays."""
    import filelock
    plan_file, key = plan_without_runtime_dir
    volume = tmp_path / "volume"
    if cache_mode == "cold":
        volume.write_text("a file, not a directory: the cache volume is unusable")
    busy = filelock.FileLock(str(volume / "locks" / f"{key}.lock"))
    if cache_mode == "private":                  # another process is seeding this entry
        (volume / "locks").mkdir(parents=True)
        busy.acquire()
    env = {"TURINGBOX_CACHE_DIR": str(volume), "TURINGBOX_CACHE_LOCK_WAIT": "0.2", "TURINGBOX_RUNTIME_DIR": None,
           "TURINGBOX_EXIT_LINGER_SECONDS": "0"}
    env.update({"sigterm-during-startup": {"FAKE_VLLM_STAGE_SECONDS": "5"},
                "vllm-fails": {"FAKE_VLLM_FAIL_AT": "compiling"},
                "second-signal": {"FAKE_VLLM_IGNORE_SIGTERM": "1", "TURINGBOX_VLLM_STOP_GRACE_SECONDS": "30"},
                }.get(ending, {}))
    try:
        s = serve_factory(plan_file=plan_file, env=env)
        if ending == "vllm-fails":
            assert s.wait_exit() == 1
        elif ending == "sigterm-during-startup":
            wait_until(lambda: s.alive() and s.get("/health/ready").json()["stage"] == "loading", 20, what="loading")
            assert s.temporaries()
            s.signal(signal.SIGTERM)
            assert s.wait_exit() == 0
        else:
            s.wait_ready()
            made = s.temporaries()
            assert [n.rsplit("-", 1)[0] for n in made] == [f"turingbox-private-{key}", f"turingbox-serve-{s.proc.pid}"], made
            s.signal(signal.SIGTERM)
            if ending == "second-signal":
                wait_until(lambda: s.events("sigterm"), 10, what="vLLM asked to stop (it ignores SIGTERM)")
                s.signal(signal.SIGINT)
                assert s.wait_exit() == 128 + signal.SIGINT
            else:
                assert s.wait_exit() == 0
        status = s.cache_status()
        assert status["mode"] == cache_mode and status["entry"].startswith(s.tmpdir + os.sep)
        assert s.temporaries() == [], s.output()[-3000:]
        if cache_mode == "private":              # the volume is someone else's: left as it was
            assert sorted(os.listdir(volume)) == ["entries", "locks", "quarantine"]
            assert os.listdir(volume / "locks") == [f"{key}.lock"]
        else:
            assert volume.is_file()
    finally:
        busy.release(force=True)


def test_throughput_plans_dp_with_the_strict_warmup_and_serve_waits_for_every_engine(serve_factory):
    """Issue 37: 8 x H100 with the 27B model and TURINGBOX_OBJECTIVE=throughput, strict warmup on (the default):
    DP=8 of TP=1; serve is ready only when the workers of all eight engines reported their warmup, and refuses to
    serve when one engine's did not (require_plugin, the default)."""
    gpus = os.path.join(REPO, "tests", "fixtures", "gpus", "8xh100.json")
    s = serve_factory(gpus_json=gpus, env={"TURINGBOX_OBJECTIVE": "throughput"})
    s.wait_ready()
    plan = s.get("/turingbox/plan").json()
    assert (plan["tensor_parallel_size"], plan["data_parallel_size"]) == (1, 8)
    assert plan["plugin"]["strict_warmup"] and plan["plugin"]["require_plugin"]
    assert "--data-parallel-size" in s.events("started")[0]["argv"]
    assert len(re.findall(r"worker rank \d+: plugin", s.output())) == 8
    s.close()

    s = serve_factory(gpus_json=gpus, env={"TURINGBOX_OBJECTIVE": "throughput", "FAKE_VLLM_ENGINES_REPORTING": "7"})
    assert s.proc.wait(timeout=60) != 0
    assert "did not report from worker(s) 7 of 8" in s.output()


def test_a_text_only_demo_forks_vllms_engine_core_unless_the_operator_says_spawn(serve_factory):
    # issue 18: with --language-model-only the API server never initialises CUDA, so vLLM can fork its engine core
    # (~15 s sooner than spawning a fresh interpreter on the H200, session 11); the operator's own choice wins.
    for env, method in (({}, "fork"), ({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, "spawn")):
        s = serve_factory(demo=True, env=env)
        try:
            s.wait_ready()
            started = s.events("started")[0]
            assert started["multiproc_method"] == method
            assert "--language-model-only" in started["argv"] and "--limit-mm-per-prompt" not in started["argv"]
        finally:
            s.close()
