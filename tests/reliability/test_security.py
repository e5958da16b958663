"""Security behaviour of the public port: the API key, and no secret in any output.

Covered elsewhere: tests/turingbox/serve/test_serve.py test_api_key_enforced_and_swapped_for_vllms_own (401 without,
with a wrong or non-Bearer key; health open; metrics open by default; vLLM gets its own key, never the
client's), test_sigterm_during_startup_stops_vllm_and_exits_0 (metrics_require_key), test_no_secret_in_plan_or_logs;
tests/image/test_image.py test_runs_as_non_root_and_build_ca_is_not_left_behind and test_read_only_root_filesystem
(uid 10001, --read-only with tmpfs /tmp); tests/reliability/test_http_bad_input.py (head, body and method limits).
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(60)

CLIENT_KEY = "client-key-Zq81xv"
VLLM_KEY = "vllm-key-Pp07ad"
HF_TOKEN = "hf_tokenSECRET42"


def test_api_key_guards_v1_before_anything_else(serve_factory):
    s = serve_factory(env={"TURINGBOX_API_KEY": CLIENT_KEY, "TURINGBOX_MAX_REQUEST_BYTES": "1000"})
    s.wait_ready()
    n = len(s.events("request"))
    guesses = ["", "Bearer", "Bearer x", f"Bearer {CLIENT_KEY[:-1]}", f"Bearer {CLIENT_KEY}x", f"bearer {CLIENT_KEY.upper()}",
               f"Token {CLIENT_KEY}", f"Basic {CLIENT_KEY}", f"Bearer  {CLIENT_KEY[1:]}", "Bearer \u00e9\u00e9"]
    for guess in guesses:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/anything/else")):
            r = s.client.request(method, path, headers={"Authorization": guess.encode("latin-1")} if guess else {},
                                 content=b"x" * 5000 if method == "POST" else None)
            # 401, not 413: the key is checked before the body is read; the presented token is not echoed.
            assert r.status_code == 401, (guess, path, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
            if len(guess) > 8:
                assert guess.split(" ", 1)[-1].strip() not in r.text
    assert len(s.events("request")) == n                      # nothing reached vLLM
    ok = s.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1},
                       headers={"Authorization": f"bearer {CLIENT_KEY}"})          # the scheme is case-insensitive
    assert ok.status_code == 200
    assert 'turingbox_proxy_rejected_total{reason="unauthorized"} 30.0' in s.metrics()
    for path in ("/health/live", "/health/ready", "/health/startup", "/metrics", "/openapi.json"):
        assert s.get(path).status_code == 200, path


def test_no_secret_in_any_output_even_when_vllm_dies(serve_factory):
    """Whole serve output (its log, vLLM's output passed through, the last-lines dump after a crash),
    the plan, the metrics and the OpenAPI schema: no API key, no vLLM key, no token."""
    s = serve_factory(env={"TURINGBOX_API_KEY": CLIENT_KEY, "FAKE_VLLM_DIE_AFTER_CHUNKS": "2",
                           "FAKE_VLLM_CHUNK_DELAY": "0.05", "TURINGBOX_EXIT_LINGER_SECONDS": "0.5"},
                      passthrough=["--api-key", VLLM_KEY, f"--hf-token={HF_TOKEN}"])
    s.wait_ready()
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    seen = [s.get("/turingbox/plan", headers=auth).text, s.get("/metrics").text, s.get("/openapi.json").text]
    assert json.loads(seen[0])["vllm_args"]
    s.client.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer wrong-key-77"})
    s.client.post("/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 5}, headers=auth)
    assert s.wait_exit(20) == 1                                # vLLM died mid-stream: its last lines are dumped
    out = s.output()
    assert "non-default args" in out and "log lines:" in out   # the lines that carried the secrets did go through
    assert "***" in out
    for secret in (CLIENT_KEY, VLLM_KEY, HF_TOKEN):
        for text in [out, *seen]:
            assert secret not in text, secret
    assert "wrong-key-77" not in out                           # a rejected guess is not logged either
