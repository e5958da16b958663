"""/metrics carries vLLM's own series next to turingbox's: the sidecar's real /metrics route in front of a real
HTTP upstream that serves a vLLM 0.21 page (tests/fixtures/vllm-0.21.0-metrics.txt), and a real `turingbox serve`
whose stand-in vLLM serves that recorded page (or, told to, none at all)."""
from __future__ import annotations

import asyncio
import http.server
import os
import re
import socket
import threading
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.sidecar_harness import REPO
from tests.support.waiting import wait_until

from turingbox.serve import stages
from turingbox.serve.metrics import ServeMetrics, UpstreamError, validate_exposition
from turingbox.serve.options import ServeOptions
from turingbox.serve.app import Sidecar
from turingbox.serve.state import ServeState

pytestmark = pytest.mark.timeout(60)

FIXTURE = os.path.join(REPO, "tests", "fixtures", "vllm-0.21.0-metrics.txt")
PROM_TEXT = "text/plain; version=0.0.4; charset=utf-8"     # what vLLM's prometheus_client route sends
KEY = "metrics-key-1"
HEADER_RE = re.compile(r"^# (HELP|TYPE) (\S+)", re.M)


def vllm_page() -> bytes:
    with open(FIXTURE, "rb") as f:
        return f.read()


def sample_lines(page: bytes) -> list[str]:
    return [line for line in page.decode().splitlines() if line and not line.startswith("#")]


class Upstream:
    """A real HTTP server on loopback standing in for vLLM's port: serves `body` at /metrics as told."""

    def __init__(self) -> None:
        self.body = vllm_page()
        self.status = 200
        self.content_type = PROM_TEXT
        self.delay = 0.0
        self.hits = 0
        self.authorization: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                outer.hits += 1
                outer.authorization.append(self.headers.get("Authorization"))
                if outer.delay:
                    time.sleep(outer.delay)  # behaviour: an upstream /metrics that answers slowly
                body = outer.body if self.path == "/metrics" else b"{}"
                try:
                    self.send_response(outer.status if self.path == "/metrics" else 404)
                    self.send_header("Content-Type", outer.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):   # the sidecar gave up (timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"     # nothing listens once the socket is closed


def make_sidecar(upstream_url: str | None, **options) -> Sidecar:
    tracker = stages.StartupTracker()
    for stage in stages.ORDER:
        tracker.advance(stage)                    # planning → ... → ready, like a real start
    state = ServeState(tracker=tracker, options=ServeOptions(**options), upstream_url=upstream_url,
                       startup_ok=True)
    return Sidecar(state, ServeMetrics(tracker))


def scrape(sidecar: Sidecar, n: int = 1, headers: dict | None = None) -> list[httpx.Response]:
    """n concurrent GET /metrics through the sidecar's real ASGI app."""
    async def run():
        transport = httpx.ASGITransport(app=sidecar)
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            try:
                return await asyncio.gather(*(client.get("/metrics", headers=headers) for _ in range(n)))
            finally:
                await sidecar.aclose()
    return asyncio.run(run())


def errors(text: str, reason: str) -> float:
    m = re.search(rf'^turingbox_upstream_metrics_scrape_errors_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert m, f"no error counter for {reason}"
    return float(m.group(1))


# -- the fixture itself

def test_fixture_is_a_vllm_021_page_with_the_series_we_depend_on():
    page = vllm_page()
    validate_exposition(page)                      # our own gate accepts it...
    families = {f.name for f in text_string_to_metric_families(page.decode())}   # ...and so does the reference parser
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_drafts", "vllm:generation_tokens",
                 "vllm:cache_config_info"):
        assert name in families, name
    assert re.search(rb'^vllm:num_requests_running\{engine="0",model_name="[^"]+"\} ', page, re.M)
    assert b'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001"' in page


# -- the route, against a real upstream

def test_vllm_series_pass_through_unchanged_next_to_turingbox(upstream):
    (r,) = scrape(make_sidecar(upstream.url))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    text = r.text
    assert 'turingbox_stage{stage="ready"} 1.0' in text
    got = set(sample_lines(r.content))
    missing = [line for line in sample_lines(vllm_page()) if line not in got]
    assert not missing, f"vLLM lines changed or lost: {missing[:3]}"
    assert errors(text, "connect") == 0 and errors(text, "invalid") == 0
    # one HELP and one TYPE per family, and the whole page is valid for the reference parser
    dup = [k for k, n in Counter(HEADER_RE.findall(text)).items() if n > 1]
    assert not dup, dup
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:num_requests_running", "turingbox_ready", "process_start_time_seconds"} <= names
    assert upstream.hits == 1


def test_upstream_down_still_serves_turingbox_and_counts_it():
    sidecar = make_sidecar(closed_port_url())
    first, = scrape(sidecar)
    assert first.status_code == 200
    assert "turingbox_ready 1.0" in first.text and "vllm:" not in first.text
    assert errors(first.text, "connect") == 1.0        # counted on the very page that lacks vLLM's series
    second, = scrape(sidecar)
    assert errors(second.text, "connect") == 2.0


def test_slow_upstream_is_cut_off_by_the_short_timeout(upstream):
    upstream.delay = 3.0
    sidecar = make_sidecar(upstream.url)
    sidecar.metrics.upstream.timeout_s = 0.3
    t0 = time.monotonic()
    (r,) = scrape(sidecar)
    took = time.monotonic() - t0
    assert r.status_code == 200 and "turingbox_ready 1.0" in r.text and "vllm:" not in r.text
    assert took < 2.0, took
    assert errors(r.text, "timeout") == 1.0


@pytest.mark.parametrize("case,reason", [
    ("http_500", "status"),
    ("cut_mid_line", "invalid"),
    ("garbage_line", "invalid"),
    ("bad_type", "invalid"),
    ("openmetrics", "invalid"),
    ("too_large", "too_large"),
])
def test_a_page_prometheus_would_reject_is_not_passed_through(upstream, case, reason):
    page = vllm_page()
    sidecar = make_sidecar(upstream.url)
    if case == "http_500":
        upstream.status = 500
    elif case == "cut_mid_line":
        upstream.body = page[:page.index(b"vllm:kv_cache_usage_perc{") + 30]
    elif case == "garbage_line":
        upstream.body = page + b"this is not a sample\n"
    elif case == "bad_type":
        upstream.body = page.replace(b"# TYPE vllm:num_requests_running gauge", b"# TYPE vllm:num_requests_running gauges")
    elif case == "openmetrics":
        upstream.content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    elif case == "too_large":
        sidecar.metrics.upstream.max_bytes = 4096
    (r,) = scrape(sidecar)
    assert r.status_code == 200 and "vllm:" not in r.text and "turingbox_ready 1.0" in r.text
    assert errors(r.text, reason) == 1.0
    list(text_string_to_metric_families(r.text))      # still a page the reference parser accepts


def test_families_turingbox_has_or_vllm_repeats_appear_once(upstream):
    # A page that redeclares one of our families and repeats one of its own: each must appear once, ours kept.
    upstream.body = (b"# HELP turingbox_ready an impostor\n# TYPE turingbox_ready gauge\nturingbox_ready 0.0\n"
                     + vllm_page()
                     + b"# HELP vllm:num_requests_running again\n# TYPE vllm:num_requests_running gauge\n"
                       b'vllm:num_requests_running{engine="0",model_name="x"} 99.0\n')
    (r,) = scrape(make_sidecar(upstream.url))
    text = r.text
    assert re.findall(r"^turingbox_ready (\S+)$", text, re.M) == ["1.0"]
    assert "an impostor" not in text and " 99.0" not in text
    counts = Counter(HEADER_RE.findall(text))
    assert counts[("TYPE", "turingbox_ready")] == 1 and counts[("TYPE", "vllm:num_requests_running")] == 1
    list(text_string_to_metric_families(text))


def test_concurrent_scrapes_share_one_upstream_fetch(upstream):
    upstream.delay = 0.3
    responses = scrape(make_sidecar(upstream.url), n=6)
    assert all(r.status_code == 200 and "vllm:num_requests_running{" in r.text for r in responses)
    assert upstream.hits == 1


def test_no_fetch_before_ready_or_once_vllm_died(upstream):
    sidecar = make_sidecar(None)                   # not ready yet: the controller has not set the upstream
    (r,) = scrape(sidecar)
    assert r.status_code == 200 and "vllm:" not in r.text and errors(r.text, "connect") == 0
    dead = make_sidecar(upstream.url)
    dead.state.mark_upstream_dead("vLLM exited unexpectedly")
    (r,) = scrape(dead)
    assert "vllm:" not in r.text and upstream.hits == 0


def test_key_rule_is_the_same_as_before(upstream):
    open_metrics = make_sidecar(upstream.url, api_key=KEY)
    (r,) = scrape(open_metrics)
    assert r.status_code == 200 and "vllm:num_requests_running{" in r.text     # default: /metrics stays open
    guarded = make_sidecar(upstream.url, api_key=KEY, metrics_require_key=True)
    (r,) = scrape(guarded)
    assert r.status_code == 401 and "vllm:" not in r.text
    hits = upstream.hits
    (r,) = scrape(make_sidecar(upstream.url, api_key=KEY, metrics_require_key=True),
                  headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "vllm:num_requests_running{" in r.text
    assert upstream.hits == hits + 1               # the refused scrape never reached vLLM


def test_vllms_own_key_goes_to_vllm_never_the_clients(upstream):
    sidecar = make_sidecar(upstream.url, api_key=KEY, metrics_require_key=True)
    sidecar.state.upstream_api_key = "vllm-own-key"
    scrape(sidecar, headers={"Authorization": f"Bearer {KEY}"})
    assert upstream.authorization == ["Bearer vllm-own-key"]


def test_validate_exposition_rejects_what_the_reference_parser_rejects():
    page = vllm_page()
    for bad in (page[:-1], page + b'vllm:x{a="1"\n', page + b"vllm:x 1.0 2.0 3.0\n", b"\xff\xfe\n"):
        with pytest.raises(UpstreamError):
            validate_exposition(bad)
    validate_exposition(b"")                       # an empty page is valid (nothing registered yet)


# -- a real `turingbox serve` in front of the stand-in vLLM

def test_serve_passes_the_recorded_vllm_page_through(serve_factory):
    s = serve_factory()
    s.wait_ready()
    r = s.get("/metrics")
    assert r.status_code == 200
    assert 'turingbox_stage{stage="ready"} 1.0' in r.text
    for series in ("vllm:num_requests_running{", "vllm:kv_cache_usage_perc{", "vllm:time_to_first_token_seconds_bucket{"):
        assert series in r.text
    assert r.text.count("# TYPE vllm:num_requests_running ") == 1
    assert not re.search(r'^turingbox_upstream_metrics_scrape_errors_total\{[^}]*\} [1-9]', r.text, re.M)


def test_serve_counts_a_vllm_without_metrics_and_logs_it_once(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_METRICS": "none"})
    s.wait_ready()
    texts = [wait_until(lambda: (lambda r: r.status_code == 200 and r.text)(s.get("/metrics")), 10,
                        what="/metrics") for _ in range(3)]
    assert all('turingbox_stage{stage="ready"} 1.0' in t and "vllm:" not in t for t in texts)
    assert errors(texts[-1], "status") >= 3.0       # the fake answers 404 there: counted every time...
    warned = [line for line in s.output().splitlines() if "/metrics not passed through" in line]
    assert len(warned) == 1 and "HTTP 404" in warned[0]      # ...and said once
