"""Admission limits (issue 37 part 1) through a real `turingbox serve` in front of the real stand-in vLLM process:
each refusal in vLLM's error shape naming its setting, counted, and never reaching vLLM; the default max_tokens
written into what vLLM receives; the request timeout aborting the request upstream; 429 with Retry-After under
real concurrent clients, overall and per client."""
from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from tests.support.sidecar_harness import Serve, sse_events
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def refused_count(s: Serve, reason: str) -> float:
    m = re.search(rf'^turingbox_admission_refused_total{{reason="{reason}"}} (\S+)$', s.metrics(), re.MULTILINE)
    assert m, f"no turingbox_admission_refused_total for {reason}"
    return float(m.group(1))


def upstream_bodies(s: Serve) -> list[dict]:
    """What the stand-in received, per request that reached its generation code."""
    return [e["body"] for e in s.events("request") if "body" in e]


def assert_refused(s: Serve, path: str, body: dict, status: int, reason: str, message: str, param: str | None):
    """One request refused by the sidecar: vLLM 0.21's ErrorResponse shape, the count, and nothing upstream."""
    before_upstream, before_count = len(s.events("request")), refused_count(s, reason)
    r = s.client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json() == {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}
    assert refused_count(s, reason) == before_count + 1
    assert len(s.events("request")) == before_upstream, "a refused request reached vLLM"


@pytest.fixture(scope="module")
def plan_limits(tmp_path_factory):
    """Limits left to the plan (H200: max_num_seqs 8, max_model_len 262144); the stand-in checks model names and
    stops its answers after 3 tokens (so a default max_tokens of 32768 is cheap), and serves two names."""
    s = Serve(str(tmp_path_factory.mktemp("plan-limits")),
              env={"FAKE_VLLM_EOS_AFTER": "3", "FAKE_VLLM_CHECK_MODEL": "1", "FAKE_VLLM_MAX_MODEL_LEN": "262144"},
              passthrough=["--served-model-name", "model", "alias"])
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


def test_n_best_of_and_beam_width_over_the_plans_max_num_seqs(plan_limits):
    s = plan_limits
    assert_refused(s, CHAT, {"messages": HI, "n": 1000}, 400, "n",
                   "n=1000 is above the limit of 8 (TURINGBOX_MAX_N).", "n")
    assert_refused(s, "/v1/completions", {"prompt": "x", "best_of": 9, "max_tokens": 1}, 400, "n",
                   "best_of=9 is above the limit of 8 (TURINGBOX_MAX_N).", "best_of")
    assert_refused(s, CHAT, {"messages": HI, "n": 9, "use_beam_search": True, "max_tokens": 1}, 400, "n",
                   "the beam width n=9 is above the limit of 8 (TURINGBOX_MAX_N).", "n")
    # As pydantic reads it: "12" is 12.
    assert_refused(s, CHAT, {"messages": HI, "n": "12"}, 400, "n", "n=12 is above the limit of 8 (TURINGBOX_MAX_N).", "n")
    ok = s.client.post(CHAT, json={"messages": HI, "n": 8, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
    assert upstream_bodies(s)[-1] == {"n": 8, "max_tokens": 2}


def test_max_tokens_and_total_tokens_over_the_plans_context(plan_limits):
    s = plan_limits
    assert_refused(s, CHAT, {"messages": HI, "max_tokens": 300000}, 400, "max_tokens",
                   "max_tokens=300000 is above the limit of 262144 (TURINGBOX_MAX_TOKENS).", "max_tokens")
    assert_refused(s, CHAT, {"messages": HI, "max_tokens": 5, "max_completion_tokens": 262145}, 400, "max_tokens",
                   "max_completion_tokens=262145 is above the limit of 262144 (TURINGBOX_MAX_TOKENS).",
                   "max_completion_tokens")
    assert_refused(s, "/v1/responses", {"input": "hi", "max_output_tokens": 10**6}, 400, "max_tokens",
                   "max_output_tokens=1000000 is above the limit of 262144 (TURINGBOX_MAX_TOKENS).", "max_output_tokens")
    # Each sequence within the context, but 8 of them take every slot of the KV pool.
    assert_refused(s, CHAT, {"messages": HI, "n": 8, "max_tokens": 65536}, 400, "total_tokens",
                   "prompt + n=8 x max_tokens=65536 is at least 524288 tokens, above the limit of 262144 "
                   "(TURINGBOX_MAX_TOTAL_TOKENS); ask for fewer tokens or a smaller n.", "max_tokens")
    # A batch of prompts counts each: 300 prompts x 1000 tokens.
    assert_refused(s, "/v1/completions", {"prompt": ["x"] * 300, "max_tokens": 1000}, 400, "total_tokens",
                   "prompt + n=1 x max_tokens=1000 for 300 prompts is at least 300000 tokens, above the limit of "
                   "262144 (TURINGBOX_MAX_TOTAL_TOKENS); ask for fewer tokens or a smaller n.", "max_tokens")
    # n=2 with a prompt the sidecar cannot bound (an image) and no max_tokens: vLLM would give each the context.
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    assert_refused(s, CHAT, {"messages": image, "n": 2}, 400, "total_tokens",
                   "n=2 with no max_completion_tokens lets each sequence run to the end of the 262144-token context: "
                   "up to 524288 tokens, above the limit of 262144 (TURINGBOX_MAX_TOTAL_TOKENS); send "
                   "max_completion_tokens (at most 32768 here).", "max_completion_tokens")
    ok = s.client.post(CHAT, json={"messages": HI, "n": 4, "max_tokens": 65536})     # 4 x 65536 = 262144: fits
    assert ok.status_code == 200, ok.text


def test_default_max_tokens_written_into_what_vllm_receives(plan_limits):
    s = plan_limits
    # Non-streaming chat without max_tokens: the plan's default (min(context, 32768)); everything else kept.
    r = s.client.post(CHAT, json={"model": "model", "messages": HI, "temperature": 0.5})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert upstream_bodies(s)[-1] == {"model": "model", "temperature": 0.5, "max_completion_tokens": 32768}
    # A stream with an explicit null: overridden (the last of a repeated key wins), still a stream, intact.
    got = []
    with s.client.stream("POST", CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}], '
                                                b'"max_tokens": null, "stream": true}  \n',
                         headers={"content-type": "application/json"}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        got = sse_events(resp.read().decode().splitlines())
    assert [e["choices"][0]["delta"]["content"] for e in got[:-1]] == ["tok0 ", "tok1 ", "tok2 "] and got[-1] == "[DONE]"
    assert upstream_bodies(s)[-1] == {"max_tokens": None, "stream": True, "max_completion_tokens": 32768}
    # n samples share the total: 8 x 32768 = 262144.
    assert s.client.post(CHAT, json={"messages": HI, "n": 8}).status_code == 200
    assert upstream_bodies(s)[-1] == {"n": 8, "max_completion_tokens": 32768}
    # Responses: max_output_tokens.
    r = s.client.post("/v1/responses", json={"input": "hi"})
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 "
    assert upstream_bodies(s)[-1] == {"max_output_tokens": 32768}
    # Completions without the field: vLLM's own default is 16 tokens, not the context, so nothing is written.
    assert s.client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert upstream_bodies(s)[-1] == {}
    # A prompt too long for the default to fit beside it keeps vLLM's own default (the rest of the context).
    long = {"messages": [{"role": "user", "content": "w " * 60_000}]}     # 120 kB: up to ~241k tokens by its bytes
    assert s.client.post(CHAT, json=long).status_code == 200
    assert upstream_bodies(s)[-1] == {}


def test_stand_in_answers_unknown_models_like_vllm(plan_limits):
    s = plan_limits
    r = s.client.post(CHAT, json={"model": "gpt-4", "messages": HI, "max_tokens": 1})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model `gpt-4` does not exist.", "type": "NotFoundError",
                                  "param": "model", "code": 404}}
    for name in ("model", "alias"):           # --served-model-name takes several (nargs='+')
        assert s.client.post(CHAT, json={"model": name, "messages": HI, "max_tokens": 1}).status_code == 200
    assert [m["id"] for m in s.get("/v1/models").json()["data"]] == ["model", "alias"]


def test_settings_override_the_plan_and_limits_are_shown(serve_factory):
    s = serve_factory(env={"TURINGBOX_MAX_N": "2", "TURINGBOX_MAX_TOKENS": "100", "TURINGBOX_DEFAULT_MAX_TOKENS": "7",
                           "TURINGBOX_MAX_TOTAL_TOKENS": "150", "TURINGBOX_API_KEY": "k-1"})
    s.wait_ready()
    s.client.headers["Authorization"] = "Bearer k-1"
    limits = s.get("/turingbox/limits").json()
    assert {k: limits[k] for k in ("max_n", "max_tokens", "default_max_tokens", "max_total_tokens",
                                   "max_concurrent_requests", "max_concurrent_per_key", "request_timeout_seconds")} == {
        "max_n": 2, "max_tokens": 100, "default_max_tokens": 7, "max_total_tokens": 150,
        "max_concurrent_requests": 128, "max_concurrent_per_key": 128, "request_timeout_seconds": 900.0}
    assert limits["from_plan"] == ["max_concurrent_requests", "max_concurrent_per_key"]
    assert s.client.get("/turingbox/limits", headers={"Authorization": "Bearer no"}).status_code == 401
    assert_refused(s, CHAT, {"messages": HI, "n": 3}, 400, "n", "n=3 is above the limit of 2 (TURINGBOX_MAX_N).", "n")
    assert_refused(s, "/v1/completions", {"prompt": "x", "max_tokens": 101}, 400, "max_tokens",
                   "max_tokens=101 is above the limit of 100 (TURINGBOX_MAX_TOKENS).", "max_tokens")
    assert_refused(s, "/v1/completions", {"prompt": "x", "max_tokens": 80, "n": 2}, 400, "total_tokens",
                   "prompt + n=2 x max_tokens=80 is at least 160 tokens, above the limit of 150 "
                   "(TURINGBOX_MAX_TOTAL_TOKENS); ask for fewer tokens or a smaller n.", "max_tokens")
    r = s.client.post(CHAT, json={"messages": HI})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
    assert upstream_bodies(s)[-1] == {"max_completion_tokens": 7}
    assert s.client.post(CHAT, json={"messages": HI, "n": 2, "max_tokens": 75}).status_code == 200
    assert "admission limits {" in s.output()


def test_request_timeout_aborts_the_request_in_vllm(serve_factory):
    # 400 tokens at 50 ms each is 20 s of generation; the limit is 1 s.
    s = serve_factory(env={"TURINGBOX_REQUEST_TIMEOUT_SECONDS": "1", "FAKE_VLLM_CHUNK_DELAY": "0.05"})
    s.wait_ready()
    t0 = time.monotonic()
    r = s.client.post(CHAT, json={"messages": HI, "max_tokens": 400})
    took = time.monotonic() - t0
    assert r.status_code == 504 and took < 10, (r.status_code, took)
    assert r.json() == {"error": {"message": "The request ran longer than the limit of 1 s "
                                             "(TURINGBOX_REQUEST_TIMEOUT_SECONDS) and was aborted.",
                                  "type": "TimeoutError", "param": None, "code": 504}}
    first = s.events("request")[-1]["id"]
    wait_until(lambda: any(e["id"] == first for e in s.events("cancelled")), 10, what="vLLM aborting request 1")
    # A stream: 200 and some tokens, then the error event and [DONE].
    with s.client.stream("POST", CHAT, json={"messages": HI, "max_tokens": 400, "stream": True}) as resp:
        assert resp.status_code == 200
        events = sse_events(resp.read().decode().splitlines())
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 504 and "TURINGBOX_REQUEST_TIMEOUT_SECONDS" in events[-2]["error"]["message"]
    assert 1 <= len([e for e in events[:-2] if "choices" in e]) < 400
    second = s.events("request")[-1]["id"]
    wait_until(lambda: any(e["id"] == second for e in s.events("cancelled")), 10, what="vLLM aborting request 2")
    assert refused_count(s, "timeout") == 2
    assert not s.events("completed")
    # Within the limit: answered as usual.
    assert s.client.post(CHAT, json={"messages": HI, "max_tokens": 3}).status_code == 200


def concurrent_posts(url: str, bodies: list[dict], local_address: str | None = None) -> list[httpx.Response]:
    """POST all bodies at once, one client thread each (a barrier lines them up)."""
    barrier = threading.Barrier(len(bodies))
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        transport = httpx.HTTPTransport(local_address=local_address) if local_address else None
        with httpx.Client(base_url=url, timeout=30, trust_env=False, transport=transport) as c:
            barrier.wait()
            out[i] = c.post(CHAT, json=bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrency_limit_429_with_retry_after_under_concurrent_clients(serve_factory):
    # Each admitted request takes 40 x 50 ms = 2 s upstream: the other clients arrive while 3 are in flight.
    s = serve_factory(env={"TURINGBOX_MAX_CONCURRENT_REQUESTS": "3", "FAKE_VLLM_CHUNK_DELAY": "0.05"})
    s.wait_ready()
    answers = concurrent_posts(s.url, [{"messages": HI, "max_tokens": 40}] * 8)
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 3 + [429] * 5, codes
    for r in answers:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json() == {"error": {"message": "3 requests are in flight, the limit of 3 "
                                                     "(TURINGBOX_MAX_CONCURRENT_REQUESTS); retry later.",
                                          "type": "RateLimitError", "param": None, "code": 429}}
    assert len(s.events("request")) == 3 and refused_count(s, "concurrency") == 5
    assert 'turingbox_proxy_requests_total{code="429",route="chat/completions"} 5.0' in s.metrics()
    # The slots are free again once those finished; GETs never count.
    assert s.client.get("/v1/models").status_code == 200
    assert s.client.post(CHAT, json={"messages": HI, "max_tokens": 1}).status_code == 200


def test_per_client_limit_counts_each_address(serve_factory):
    s = serve_factory(env={"TURINGBOX_MAX_CONCURRENT_PER_KEY": "1", "TURINGBOX_MAX_CONCURRENT_REQUESTS": "4",
                           "FAKE_VLLM_CHUNK_DELAY": "0.05"})
    s.wait_ready()
    held = httpx.Client(base_url=s.url, timeout=30, trust_env=False)
    try:
        with held.stream("POST", CHAT, json={"messages": HI, "max_tokens": 400, "stream": True}) as stream:
            assert stream.status_code == 200
            chunks = stream.iter_raw()
            next(chunks)            # admitted and generating (keep the iterator: dropping it closes the connection)
            again = s.client.post(CHAT, json={"messages": HI, "max_tokens": 1})
            assert again.status_code == 429 and int(again.headers["retry-after"]) >= 1
            assert again.json()["error"]["message"] == ("1 requests of this client are in flight, the limit of 1 per "
                                                        "client (TURINGBOX_MAX_CONCURRENT_PER_KEY); retry later.")
            # Another client address is another key (auth off: the client's address).
            other = concurrent_posts(s.url, [{"messages": HI, "max_tokens": 1}], local_address="127.0.0.2")[0]
            assert other.status_code == 200, other.text
        held_id = [e for e in s.events("request") if e["chunks"] == 400][0]["id"]
        wait_until(lambda: any(e["id"] == held_id for e in s.events("cancelled")), 10, what="the held stream cancelled")
    finally:
        held.close()
    assert refused_count(s, "per_key") == 1
    wait_until(lambda: s.client.post(CHAT, json={"messages": HI, "max_tokens": 1}).status_code == 200, 10,
               what="the client's slot back")


def test_per_key_limit_with_an_api_key(serve_factory):
    s = serve_factory(env={"TURINGBOX_API_KEY": "k-2", "TURINGBOX_MAX_CONCURRENT_PER_KEY": "1",
                           "FAKE_VLLM_CHUNK_DELAY": "0.05"})
    s.wait_ready()
    auth = {"Authorization": "Bearer k-2"}
    with s.client.stream("POST", CHAT, json={"messages": HI, "max_tokens": 400, "stream": True}, headers=auth) as st:
        assert st.status_code == 200
        chunks = st.iter_raw()
        next(chunks)
        # The same key from another address: still the same key.
        with httpx.Client(base_url=s.url, timeout=30, trust_env=False, headers=auth,
                          transport=httpx.HTTPTransport(local_address="127.0.0.2")) as c:
            r = c.post(CHAT, json={"messages": HI, "max_tokens": 1})
        assert r.status_code == 429 and r.json()["error"]["param"] is None
    assert refused_count(s, "per_key") == 1
