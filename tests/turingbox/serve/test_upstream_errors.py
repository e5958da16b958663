"""The proxy after vLLM answers with an error: real serve process, real fake-vLLM process.

vLLM 0.21's uvicorn drops a connection a few ms after an error raised inside its app (a 400 for a prompt over
max_model_len, or for min_p/logit_bias with speculative decoding, which the sidecar now refuses itself), without
`Connection: close`. The fake does the same (close-after-error, its default). A pooled proxy that reuses such a
connection answers the next user's request with 502 (seen on the GPU: 20 of 20 pairs).
"""
from __future__ import annotations

import json

import pytest

from tests.support.sidecar_harness import Serve

pytestmark = pytest.mark.timeout(90)

BAD_BODIES = [     # each reaches vLLM (the stand-in) and gets its 400: over the stand-in's max_model_len
    {"model": "m", "prompt": "hello " * 4500, "max_tokens": 2},
    {"model": "m", "messages": [{"role": "user", "content": "hi " * 4200}], "max_tokens": 2},
    {"model": "m", "prompt": "word " * 5000, "max_tokens": 2},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Serve(str(tmp_path_factory.mktemp("errors")))
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


def test_request_after_an_error_answer_is_served(server):
    """20 error/good pairs back to back: every good request gets 200, every error its own 400."""
    plan = server.get("/turingbox/plan").json()
    assert plan["num_speculative_tokens"] > 0           # the H200 plan runs MTP: min_p is refused
    for i in range(20):
        bad = BAD_BODIES[i % len(BAD_BODIES)]
        path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
        r = server.client.post(path, json=bad)
        assert r.status_code == 400, (i, r.status_code, r.text)
        good = server.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        assert good.status_code == 200, (i, good.status_code, good.text)
        stream = server.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2,
                                                             "stream": True})
        assert stream.status_code == 200 and b"[DONE]" in stream.content, (i, stream.status_code, stream.text)


def test_concurrent_errors_and_good_requests(server):
    """Errors and good requests interleaved from several clients: no 5xx at all."""
    import concurrent.futures as cf

    import httpx

    def one(i: int) -> int:
        with httpx.Client(base_url=server.url, timeout=20, trust_env=False) as c:
            body = BAD_BODIES[i % 3] if i % 2 else {"model": "m", "prompt": "x", "max_tokens": 2}
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            return c.post(path, json=body).status_code

    with cf.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(80)))
    assert not [c for c in codes if c >= 500], codes
    assert codes.count(200) == 40


def refused_for_spec(server) -> float:
    line = [ln for ln in server.metrics().splitlines()
            if ln.startswith('turingbox_admission_refused_total{reason="speculative_decoding"}')]
    return float(line[0].split()[-1])


def test_spec_decode_refusal_names_the_remedy(server):
    """vLLM's refusal under MTP, given by the sidecar before vLLM sees the request: vLLM's sentence and status, the
    parameter named, the remedy appended, counted."""
    before_upstream, before = len(server.events("request")), refused_for_spec(server)
    for path, body, param in (
            ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "min_p": 0.05}, "min_p"),
            ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2, "logit_bias": {"11": 5}}, "logit_bias"),
            ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2, "logit_bias": {"11": 5}},
             "logit_bias")):
        r = server.client.post(path, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"].startswith("The min_p and logit_bias sampling parameters are not yet supported")
        assert "TURINGBOX_MTP=0" in err["message"] and err["param"] == param and err["code"] == 400
        assert int(r.headers["content-length"]) == len(r.content)
    assert refused_for_spec(server) == before + 3
    assert len(server.events("request")) == before_upstream, "a refused request reached vLLM"
    # What vLLM itself lets through is not refused: min_p 0 (its default), min_p with greedy sampling (vLLM sets it
    # to 0), either with beam search (its own parameters), an empty logit_bias, min_p on the responses API (not one
    # of its fields).
    for path, body in (("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "min_p": 0}),
                       ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "min_p": 0.2,
                                            "temperature": 0}),
                       ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "min_p": 0.2,
                                            "logit_bias": {"11": 5}, "use_beam_search": True}),
                       ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "logit_bias": {}}),
                       ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2, "min_p": 0.5})):
        assert server.client.post(path, json=body).status_code == 200, body
    assert refused_for_spec(server) == before + 3
    # Other errors pass through untouched.
    r = server.client.post("/v1/completions", json={"model": "m", "prompt": "word " * 5000, "max_tokens": 2})
    assert r.status_code == 400 and "TURINGBOX_MTP" not in r.text


def test_pooled_connection_closed_under_the_proxy_is_retried(serve_factory):
    """vLLM closing a kept-alive connection as a request arrives (keep-alive race): the proxy sends it
    once more on a new connection instead of answering 502."""
    s = serve_factory(env={"FAKE_VLLM_KEEPALIVE_RACE": "1", "FAKE_VLLM_KEEPALIVE_RACE_METHODS": "GET,POST"})
    s.wait_ready()
    for i in range(10):
        r = s.get("/v1/models")
        assert r.status_code == 200, (i, r.text)
        r = s.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200, (i, r.text)
    assert 'turingbox_upstream_errors_total{kind="retried"}' in s.metrics()


def test_spec_decode_refusal_of_a_stream_comes_before_it(server):
    """With stream=true vLLM answers 200 and refuses in the first SSE event (session 22's soak: 6 such streams);
    the sidecar answers 400 before any stream starts."""
    r = server.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2, "min_p": 0.05,
                                                    "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    err = json.loads(r.text)["error"]
    assert err["message"].startswith("The min_p and logit_bias") and "TURINGBOX_MTP=0" in err["message"]
    assert err["param"] == "min_p"


def test_large_error_body_passes_whole(server):
    """A 400 that echoes a large request (vLLM's pydantic errors do) arrives complete, then the next request works.

    Seen on the GPU: the proxy read at most 64 KiB of an error body and sent it under the full Content-Length."""
    prompt = ("x" * 250 + " ") * 2000                        # ~500 KB echoed back, 2000 words
    r = server.client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": "many"})
    assert r.status_code == 400
    assert int(r.headers["content-length"]) == len(r.content) > 100_000
    assert "Input should be a valid integer" in r.json()["error"]["message"]
    good = server.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
    assert good.status_code == 200
