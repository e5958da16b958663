#!/usr/bin/env python3
"""Proxy-added latency of the sidecar: streaming TTFT and non-streaming time, direct vs proxied, interleaved.

Starts a real `turingbox serve` in front of the stand-in upstream (tests/support/fake_vllm.py) with a
fixed upstream port, then alternates the same request against the upstream's port and the sidecar's
port (the order flips every round, so drift and warm-up hit both sides alike). The client is
http.client, as in bench/gpu/side_by_side.py: one new connection per request ("fresh") or one kept
open ("keepalive").

    python tests/reliability/latency_bench.py --requests 300 --first-chunk-delay 0.08 --json out.json

Against servers already running (e.g. on the GPU machine, vLLM on 8100 behind the sidecar on 8000):

    python tests/reliability/latency_bench.py --direct-port 8100 --proxy-port 8000 --model NAME

Prints one JSON object: per mode, p50/p90/p99 of direct and proxied, and the added p50/p99.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))     # a script: the checkout, for the tests package

from tests.support.sidecar_harness import Serve, free_port  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

BODY = {"model": "m", "stream": True, "max_tokens": 8, "temperature": 0.0,
        "messages": [{"role": "user", "content": "Say something about caches."}]}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


class Client:
    def __init__(self, port: int, keepalive: bool) -> None:
        self.port, self.keepalive, self.conn = port, keepalive, None

    def _conn(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        return self.conn

    def ttft(self, body: dict) -> float:
        """Seconds from sending a streaming chat request to its first content chunk (read to the end)."""
        conn = self._conn()
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        first = None
        while True:
            line = r.readline()
            if not line:
                break
            if first is None and line.startswith(b"data: {"):
                delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
                # vLLM 0.21 with a reasoning parser streams thinking as `reasoning` before any `content`.
                if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
                    first = time.perf_counter() - t0
        self._done()
        assert first is not None
        return first

    def total(self, body: dict) -> float:
        """Seconds for a whole non-streaming request."""
        conn = self._conn()
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": False}),
                     {"content-type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        took = time.perf_counter() - t0
        assert r.status == 200 and json.loads(data)["choices"], data[:200]
        self._done()
        return took

    def _done(self) -> None:
        if not self.keepalive:
            self.conn.close()
            self.conn = None


def measure(direct_port: int, proxy_port: int, requests: int, keepalive: bool, kind: str) -> dict:
    direct, proxied = Client(direct_port, keepalive), Client(proxy_port, keepalive)
    fn = {"ttft": Client.ttft, "total": Client.total}[kind]
    for c in (direct, proxied):            # warm both paths (imports, pools) before timing
        for _ in range(3):
            fn(c, BODY)
    d, p = [], []
    for i in range(requests):
        pair = [(direct, d), (proxied, p)]
        for client, out in (pair if i % 2 == 0 else pair[::-1]):
            out.append(fn(client, BODY))
    diffs = [b - a for a, b in zip(d, p)]
    ms = lambda v: round(v * 1000, 3)  # noqa: E731
    return {"requests": requests, "client": "keepalive" if keepalive else "fresh", "measure": kind,
            "direct_ms": {"p50": ms(pct(d, 50)), "p90": ms(pct(d, 90)), "p99": ms(pct(d, 99))},
            "proxied_ms": {"p50": ms(pct(p, 50)), "p90": ms(pct(p, 90)), "p99": ms(pct(p, 99))},
            "added_ms": {"p50": ms(pct(p, 50) - pct(d, 50)), "p99": ms(pct(p, 99) - pct(d, 99)),
                         "median_of_pairs": ms(statistics.median(diffs))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="timed requests per side and mode")
    ap.add_argument("--first-chunk-delay", type=float, default=0.08, help="upstream prefill time, seconds")
    ap.add_argument("--chunk-delay", type=float, default=0.0, help="upstream time per later chunk, seconds")
    ap.add_argument("--modes", default="fresh,keepalive")
    ap.add_argument("--measures", default="ttft,total")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--direct-port", type=int, help="measure servers already running: the upstream's port")
    ap.add_argument("--proxy-port", type=int, help="... and the sidecar's port")
    ap.add_argument("--model", default="m", help="model name to send (running servers)")
    args = ap.parse_args(argv)
    BODY["model"] = args.model
    if args.direct_port and args.proxy_port:
        out = {"direct_port": args.direct_port, "proxy_port": args.proxy_port, "results": [
            measure(args.direct_port, args.proxy_port, args.requests, mode == "keepalive", kind)
            for kind in args.measures.split(",") for mode in args.modes.split(",")]}
        return _report(out, args.json)
    with tempfile.TemporaryDirectory(prefix="tb-latency-") as tmp:
        upstream = free_port()
        s = Serve(tmp, args=["--upstream-port", str(upstream)],
                  env={"FAKE_VLLM_FIRST_CHUNK_DELAY": str(args.first_chunk_delay), "FAKE_VLLM_ROLE_CHUNK": "1",
                       "FAKE_VLLM_CHUNK_DELAY": str(args.chunk_delay), "FAKE_VLLM_EVENTS": "",
                       "TURINGBOX_UPSTREAM_PROBE_SECONDS": "5"})
        try:
            s.wait_ready(60)
            wait_until(lambda: s.get("/health/ready").status_code == 200, 10)
            out = {"first_chunk_delay_s": args.first_chunk_delay, "results": []}
            for kind in args.measures.split(","):
                for mode in args.modes.split(","):
                    out["results"].append(measure(upstream, s.port, args.requests, mode == "keepalive", kind))
        finally:
            s.close()
    return _report(out, args.json)


def _report(out: dict, path: str | None) -> int:
    text = json.dumps(out, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
