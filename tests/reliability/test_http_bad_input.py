"""Bad input on the public port: the sidecar's own OpenAPI fuzzed by schemathesis, oversized and
endless request heads, stalled bodies, slowloris heads, slow readers, methods that must not pass.

Covered elsewhere (tests/turingbox/serve/test_serve.py): test_oversized_body_refused (413 by Content-Length
and while reading a chunked body, nothing reaches vLLM), invalid JSON passed to vLLM and its 400
passed back (test_non_streaming).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time

import httpx
import pytest

from tests.reliability.procstats import rss_mib
from tests.reliability.serve_env import serve_env
from tests.support.sidecar_harness import Serve, sse_events
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
KEY = "fuzz-key-5150"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Serve(str(tmp_path_factory.mktemp("bad-input")),
              env=serve_env(TURINGBOX_API_KEY=KEY, TURINGBOX_CLIENT_TIMEOUT_SECONDS="1.5",
                            TURINGBOX_MAX_HEADER_BYTES="16384", TURINGBOX_MAX_REQUEST_BYTES="100000"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def raw_exchange(port: int, data: bytes, timeout: float = 10.0, send_slowly: float = 0.0) -> bytes:
    """Send bytes on a fresh connection; return everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        try:
            if send_slowly:
                for i in range(0, len(data), 1):
                    c.sendall(data[i:i + 1])
                    time.sleep(send_slowly)  # behaviour: a client that sends slowly
            else:
                c.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                out += d
        except (ConnectionResetError, socket.timeout):
            pass
        return out


def test_schemathesis_finds_no_server_error_and_a_conforming_schema(server):
    st = shutil.which("st") or shutil.which("schemathesis")
    if st is None:
        pytest.skip("schemathesis is not installed (pip install schemathesis)")
    schema = server.get("/openapi.json").json()
    assert set(schema["paths"]) == {"/health/live", "/health/ready", "/health/startup", "/metrics",
                                    "/turingbox/plan", "/turingbox/limits", "/v1/{path}", "/tokenize", "/detokenize"}
    assert set(schema["paths"]["/v1/{path}"]) == {"get", "post"}
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    report = os.path.join(server.tmp, "junit.xml")
    r = subprocess.run([st, "run", f"{server.url}/openapi.json", "--checks", "all",
                        # /v1/{path} is a transparent proxy: whether vLLM accepts a method on a route is
                        # vLLM's business (it answers 405/404), so "valid data must be accepted" does not apply.
                        "--exclude-checks", "positive_data_acceptance",
                        "-n", os.environ.get("SCHEMATHESIS_EXAMPLES", "50"), "--generation-deterministic",
                        "-H", f"Authorization: Bearer {KEY}", "--no-color", "--report", "junit",
                        "--report-junit-path", report],
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    summary = [line for line in r.stdout.splitlines() if "generated" in line]
    print("schemathesis:", summary)
    assert summary and " 0 passed" not in summary[-1]
    out = os.environ.get("TURINGBOX_TEST_RELIABILITY_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "schemathesis.txt"), "w") as f:
            f.write(r.stdout[-4000:])
    assert KEY not in server.output()


def test_request_head_over_the_limit_gets_431(server):
    big = raw_exchange(server.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 431 ")
    assert b"max_header_bytes" in big
    many = raw_exchange(server.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n"
                        + b"".join(b"X-%d: y\r\n" % i for i in range(5000)) + b"\r\n")
    assert many.startswith(b"HTTP/1.1 431 ")
    url = raw_exchange(server.port, b"GET /v1/models?" + b"q" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert url.startswith(b"HTTP/1.1 431 ")
    # A header line that never ends is cut off too, without waiting for it (memory stays bounded).
    before = rss_mib(server.proc.pid)
    endless = raw_exchange(server.port, b"GET / HTTP/1.1\r\nX-Endless: " + b"b" * 4_000_000)
    assert endless.startswith(b"HTTP/1.1 431 ")
    assert rss_mib(server.proc.pid) - before < 8
    # Below the limit all is well.
    ok = httpx.get(f"{server.url}/health/live", headers={"X-Fine": "c" * 8000})
    assert ok.status_code == 200


def test_slowloris_head_gets_408_and_the_connection_closed(server):
    t0 = time.monotonic()
    out = raw_exchange(server.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n", timeout=10)
    took = time.monotonic() - t0
    assert out.startswith(b"HTTP/1.1 408 ") and b"client_timeout_seconds" in out
    assert 1.0 < took < 5, took
    # Trickling a whole head slower than the deadline does not reset it.
    out = raw_exchange(server.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 40 + b"\r\n\r\n",
                       send_slowly=0.05, timeout=10)
    assert out.startswith(b"HTTP/1.1 408 ")


def test_stalled_body_gets_408(server):
    n = len(server.events("request"))
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    t0 = time.monotonic()
    out = raw_exchange(server.port, head, timeout=10)        # promises 100 bytes, sends 11, then waits
    assert out.startswith(b"HTTP/1.1 408 "), out[:200]
    assert b"stalled" in out and time.monotonic() - t0 < 5
    assert len(server.events("request")) == n                # nothing half-read reached vLLM
    wait_until(lambda: "turingbox_proxy_in_flight_requests 0.0" in server.metrics(), 5)


def test_slow_reader_is_held_back_not_buffered(server):
    """A client that stops reading a long stream: backpressure reaches vLLM, memory stays flat, and the
    stream completes in order once the client reads again."""
    n = 3000
    before = rss_mib(server.proc.pid)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps({"model": "m", "prompt": "x" * 2000, "stream": True, "max_tokens": n}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(3)  # behaviour: a client that stops reading for longer than the 1.5 s client timeout
        grew = rss_mib(server.proc.pid) - before
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            d = c.recv(65536)
            if not d:
                break
            data += d
    assert grew < 16, grew
    text = data.split(b"\r\n\r\n", 1)[1]
    # De-chunk the transfer encoding, then check every event.
    payload, rest = b"", text
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        size = int(size, 16)
        if size == 0:
            break
        payload, rest = payload + rest[:size], rest[size + 2:]
    events = sse_events(payload.decode().splitlines())
    assert [e["fake_seq"] for e in events[:-1]] == list(range(n)) and events[-1] == "[DONE]"


def test_methods_vllm_does_not_serve_never_reach_it(server):
    n = len(server.events("request"))
    for method in ("TRACE", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT"):
        r = server.client.request(method, "/v1/chat/completions", headers=AUTH)
        assert r.status_code == 405, (method, r.status_code)
        assert r.headers["allow"] == "GET, POST"
    assert len(server.events("request")) == n


def test_garbage_on_the_wire_gets_400_not_500(server):
    for data in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),     # a TLS hello
                 b"GET /health/live HTTP/9.9\r\n\r\n", b"NOT A REQUEST\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"):
        out = raw_exchange(server.port, data)
        assert out == b"" or out.startswith(b"HTTP/1.1 400 "), (data[:40], out[:100])
    assert server.get("/health/ready").status_code == 200
