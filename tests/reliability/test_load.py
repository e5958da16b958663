"""Load through the sidecar: >= 64 concurrent streaming and non-streaming requests to the real stand-in
upstream; every chunk checked; connections, descriptors and memory of serve watched; proxied vs direct.

The CI variant holds the load for LOAD_SECONDS (default 15 s); the slow one for 60 s and writes its
report to $TURINGBOX_TEST_RELIABILITY_OUT/load-60s.json when that is set (docs/reliability.md quotes it).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import threading

import pytest

from tests.reliability.loadgen import run_load
from tests.reliability.procstats import connections_to, fd_count, rss_mib, socket_count
from tests.support.sidecar_harness import free_port
from tests.support.waiting import wait_until

CONCURRENCY = 64
UPSTREAM = {"FAKE_VLLM_FIRST_CHUNK_DELAY": "0.02", "FAKE_VLLM_CHUNK_DELAY": "0.004", "FAKE_VLLM_ROLE_CHUNK": "1"}


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


class Sampler:
    """RSS of a process once a second, in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(rss_mib(self.pid))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def settle_descriptors(s, limit: int, timeout: float = 15.0) -> int:
    """Wait until serve holds at most `limit` descriptors. Idle upstream connections are retired after
    the pool's keep-alive (4 s) on the next request, so keep sending one now and then."""
    def low():
        s.get("/v1/models")
        n = fd_count(s.proc.pid)
        return n if n <= limit else False
    try:
        return wait_until(low, timeout, interval=0.5, what=f"serve's descriptors back to <= {limit}")
    except AssertionError:
        raise AssertionError(f"serve holds {fd_count(s.proc.pid)} descriptors after the load, "
                             f"{limit} allowed: {sorted(os.listdir(f'/proc/{s.proc.pid}/fd'))[:50]}") from None


def idle_pool_retired(s, upstream: int, timeout: float = 15.0) -> None:
    """Wait until the warm-up's idle upstream connections are retired (after the pool's keep-alive, on the next
    request): serve keeps at most the one the last request used."""
    def retired():
        s.get("/v1/models")
        return connections_to(s.proc.pid, upstream) <= 1
    wait_until(retired, timeout, interval=0.5, what=f"serve's idle connections to port {upstream} retired")


def run_case(serve_factory, proxied_s: float, direct_s: float) -> dict:
    upstream = free_port()
    s = serve_factory(args=["--upstream-port", str(upstream)], env=UPSTREAM)
    s.wait_ready()
    pid = s.proc.pid
    # Warm the pools and the allocator, then take the baseline at rest.
    warm = asyncio.run(run_load(s.url, CONCURRENCY, 2.0, seed=7))
    assert warm.as_dict()["errors"] == 0, warm.as_dict()
    fds_at_rest = settle_descriptors(s, fd_count(pid) + 64)      # at most one idle pool's worth now
    fds_before, sockets_before = settle_descriptors(s, 10_000), socket_count(pid)
    idle_pool_retired(s, upstream)
    fds_before = settle_descriptors(s, fds_before)
    sockets_before = socket_count(pid)

    with Sampler(pid) as rss:
        proxied = asyncio.run(run_load(s.url, CONCURRENCY, proxied_s, seed=1))
    fds_after = settle_descriptors(s, fds_before + 2)
    direct = asyncio.run(run_load(f"http://127.0.0.1:{upstream}", CONCURRENCY, direct_s, seed=2))

    p, d = proxied.as_dict(), direct.as_dict()
    text = s.metrics()
    third = max(1, len(rss.samples) // 3)
    report = {
        "concurrency": CONCURRENCY, "upstream": UPSTREAM, "proxied": p, "direct": d,
        "added_ttft_ms": {k: round(p["ttft_ms"][k] - d["ttft_ms"][k], 3) for k in ("p50", "p99")},
        "added_non_stream_ms": {k: round(p["non_stream_ms"][k] - d["non_stream_ms"][k], 3) for k in ("p50", "p99")},
        "throughput_vs_direct": round(p["throughput_rps"] / d["throughput_rps"], 3),
        "serve_fds": {"at_rest_before": fds_before, "after": fds_after, "with_warm_pool": fds_at_rest},
        "serve_sockets_before": sockets_before,
        "serve_rss_mib": {"first_third_max": round(max(rss.samples[:third]), 1),
                          "last_third_max": round(max(rss.samples[-third:]), 1),
                          "min": round(min(rss.samples), 1), "max": round(max(rss.samples), 1),
                          "samples": len(rss.samples)},
        "metrics": {"requests_200": metric(text, "turingbox_proxy_requests_total", '{code="200",route="chat/completions"}')
                    + metric(text, "turingbox_proxy_requests_total", '{code="200",route="completions"}'),
                    "in_flight": metric(text, "turingbox_proxy_in_flight_requests"),
                    "client_disconnects": metric(text, "turingbox_proxy_client_disconnects_total"),
                    "upstream_errors": sum(float(v) for v in re.findall(r"^turingbox_upstream_errors_total\S* (\S+)$",
                                                                       text, re.MULTILINE))},
    }
    # Every request the upstream saw completed, none was cancelled, and it saw each exactly once.
    requests = s.events("request")
    completed = s.events("completed")
    report["upstream_events"] = {"requests": len(requests), "completed": len(completed),
                                 "cancelled": len(s.events("cancelled"))}
    out = os.environ.get("TURINGBOX_TEST_RELIABILITY_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"load-{int(proxied_s)}s.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))

    for name, r in (("proxied", p), ("direct", d)):
        assert r["errors"] == 0, (name, r["error_reasons"])
        assert r["streams"] > 0 and r["requests"] - r["streams"] > 0
    assert p["requests"] >= CONCURRENCY * 5, p        # the load really was held
    assert report["metrics"]["in_flight"] == 0
    assert report["metrics"]["client_disconnects"] == 0 and report["metrics"]["upstream_errors"] == 0
    sent_through = warm.as_dict()["ok"] + p["ok"]
    assert report["metrics"]["requests_200"] >= sent_through          # (+ the /v1/models pokes)
    assert report["upstream_events"]["cancelled"] == 0
    assert len(requests) == len(completed) == sent_through + d["ok"]
    assert len({(e["pid"], e["id"]) for e in requests}) == len(requests)
    assert fds_after <= fds_before + 2
    growth = report["serve_rss_mib"]["last_third_max"] - report["serve_rss_mib"]["first_third_max"]
    assert growth < 16, report["serve_rss_mib"]                        # flat: no per-request leak
    return report


@pytest.mark.timeout(180)
def test_load_ci(serve_factory):
    run_case(serve_factory, float(os.environ.get("LOAD_SECONDS", "15")), 5.0)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_load_full_60s(serve_factory):
    run_case(serve_factory, 60.0, 60.0)
