"""A stream vLLM refuses is answered as the 4xx it is (session 23's soak: 3 streams got a 200 and then vLLM's refusal).

vLLM 0.21 checks a stream's sampling parameters inside its generator (input_processor → SamplingParams.verify), after
the 200 is sent: chat and completions then send one error event and [DONE]; the responses API raises there and the
stream breaks off with no event at all. The stand-in vLLM does both, for vLLM's logprobs limit (20). Through a real
`turingbox serve`: the proxy reads a stream's first event before answering, so chat/completions refusals become a
400 in vLLM's error shape; the responses API's case is refused by admission before vLLM; every other stream passes
as before, its first event included.
"""
from __future__ import annotations

import re

import pytest

from tests.support.sidecar_harness import Serve, free_port, sse_events

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    upstream = free_port()
    s = Serve(str(tmp_path_factory.mktemp("stream-refusals")), env={"FAKE_VLLM_EOS_AFTER": "4"},
              args=["--upstream-port", str(upstream)])
    s.upstream_port = upstream
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


def counter(s: Serve, line: str) -> float:
    m = re.search(rf"^{re.escape(line)} (\S+)$", s.metrics(), re.MULTILINE)
    assert m, line
    return float(m.group(1))


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 22}),
    ("/v1/completions", {"prompt": "hi", "logprobs": 27}),
])
def test_a_stream_refused_in_its_first_event_is_a_400(server, path, body):
    before = counter(server, "turingbox_proxy_stream_refusals_total")
    sent = len(server.events("request"))
    body = {"model": "m", "max_tokens": 3, "stream": True, **body}
    r = server.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert err["message"].startswith(f"Requested sample logprobs of {body.get('top_logprobs') or body['logprobs']}, "
                                     "which is greater than max allowed: 20")
    # vLLM itself refused it (the stand-in got the request and answered in its stream): the sidecar only re-framed it
    assert len(server.events("request")) == sent + 1
    assert counter(server, "turingbox_proxy_stream_refusals_total") == before + 1
    # unstreamed, vLLM's own 400 passes as it is
    r = server.client.post(path, json={**body, "stream": False})
    assert r.status_code == 400 and "greater than max allowed: 20" in r.json()["error"]["message"]
    # and the next stream is served whole, its first event included
    with server.client.stream("POST", path, json={**body, "logprobs": True if "messages" in body else 5,
                                                  "top_logprobs": 5}) as resp:
        assert resp.status_code == 200
        events = sse_events(resp.read().decode().splitlines())
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1]) and len(events) >= 2


def test_responses_stream_over_the_logprobs_limit_is_refused_before_vllm(server):
    before = counter(server, 'turingbox_admission_refused_total{reason="logprobs"}')
    sent = len(server.events("request"))
    body = {"model": "m", "input": "hi", "max_output_tokens": 3, "stream": True,
            "include": ["message.output_text.logprobs"], "top_logprobs": 27}
    r = server.client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": {"message": "Requested sample logprobs of 27, which is greater than max allowed: 20",
                                  "type": "BadRequestError", "param": "top_logprobs", "code": 400}}
    assert len(server.events("request")) == sent, "a refused request reached vLLM"
    assert counter(server, 'turingbox_admission_refused_total{reason="logprobs"}') == before + 1
    # -1 asks for the whole vocabulary
    r = server.client.post("/v1/responses", json={**body, "top_logprobs": -1})
    assert r.status_code == 400 and "-1 (the whole vocabulary)" in r.json()["error"]["message"]
    # within the limit, or without output logprobs in `include`: vLLM's to answer
    for ok in ({**body, "top_logprobs": 20}, {**body, "include": []}):
        with server.client.stream("POST", "/v1/responses", json=ok) as resp:
            assert resp.status_code == 200, ok
            resp.read()
    assert len(server.events("request")) == sent + 2


def test_what_the_stand_in_does_without_the_sidecar(server):
    """The behaviour the two tests above turn into 400s, straight from the stand-in (as from vLLM 0.21)."""
    import httpx
    base = f"http://127.0.0.1:{server.upstream_port}"
    with httpx.Client(base_url=base, timeout=20, trust_env=False) as c:
        with c.stream("POST", "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "logprobs": True,
                "top_logprobs": 22}) as resp:
            assert resp.status_code == 200
            events = sse_events(resp.read().decode().splitlines())
        assert events[0]["error"]["code"] == 400 and events[-1] == "[DONE]"
        with pytest.raises(httpx.HTTPError):
            with c.stream("POST", "/v1/responses", json={
                    "model": "m", "input": "hi", "stream": True, "include": ["message.output_text.logprobs"],
                    "top_logprobs": 27}) as resp:
                assert resp.status_code == 200
                resp.read()
