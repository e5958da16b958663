#!/usr/bin/env python3
"""Issue 37 on the GPU: one hostile request (n=1000, no max_tokens) must not own the server.

Against a running `turingbox serve` (--url): the other clients' TTFT unloaded (K concurrent streaming chats, R
rounds), then the same clients while the hostile request is sent beside them, then the hostile request's answer.
Writes a JSON record (--out): the refusal (status, body), the TTFTs of both rounds, their medians and the ratio
loaded / unloaded, and turingbox's refusal counters from /metrics. Exit 0 when the request was refused with 400 and
the ratio is <= 1.2, else 1 (the record says which).

  python3 bench/gpu/hostile.py --url http://127.0.0.1:8000 --out /tmp/results/hostile.json
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

HOSTILE = {"messages": [{"role": "user", "content": "Write a very long story."}], "n": 1000, "temperature": 1.0}
MAX_RATIO = 1.2        # the other clients' median TTFT with the hostile request beside them / without it


def verdict(hostile_answer: dict, unloaded: list[float], loaded: list[float]) -> dict:
    """The record's verdict fields: the hostile request refused with 400 (an answer without a status, when its
    thread failed, is not a refusal), the medians of both rounds' TTFTs, their ratio loaded / unloaded, and ok."""
    u, l = statistics.median(unloaded), statistics.median(loaded)
    out = {"unloaded_median_s": round(u, 4), "loaded_median_s": round(l, 4), "ratio": round(l / u, 3),
           "refused": hostile_answer.get("status") == 400}
    out["ok"] = out["refused"] and out["ratio"] <= MAX_RATIO
    return out


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def served_model(url: str) -> str:
    c = _conn(url, 30)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


def ttft(url: str, model: str, i: int) -> float:
    """Seconds to the first streamed token of a short chat (distinct prompts: no prefix-cache shortcut)."""
    body = {"model": model, "stream": True, "max_tokens": 16, "temperature": 0.0,
            "messages": [{"role": "user", "content": f"Client {i} at {time.time_ns()}: name three rivers."}]}
    c = _conn(url, 300)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"client {i}: HTTP {r.status} {r.read()[:300]!r}")
    first = None
    for line in r:
        if first is None and line.startswith(b"data: {"):
            delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                first = time.perf_counter() - t0
    c.close()
    if first is None:
        raise RuntimeError(f"client {i}: stream ended without content")
    return first


def round_of(url: str, model: str, clients: int, rounds: int, during=None) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for k in range(rounds):
            t = ttft(url, model, i * 1000 + k)
            with lock:
                out.append(t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    if during:
        during()
    for t in threads:
        t.join()
    return out


def metrics(url: str) -> list[str]:
    c = _conn(url, 30)
    c.request("GET", "/metrics")
    return [l for l in c.getresponse().read().decode().splitlines()
            if l.startswith(("turingbox_admission", "vllm:num_requests_waiting", "vllm:num_requests_running"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    model = served_model(a.url)
    round_of(a.url, model, a.clients, 1)                      # warm the path once (not counted)
    unloaded = round_of(a.url, model, a.clients, a.rounds)
    hostile: dict = {}

    def send_hostile() -> None:
        time.sleep(0.05)          # let the clients' first requests start: the hostile one arrives among them
        c = _conn(a.url, 600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", json.dumps({"model": model, **HOSTILE}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        hostile.update(status=r.status, seconds=round(time.perf_counter() - t0, 4),
                       body=r.read()[:2000].decode("utf-8", "replace"))

    loaded = round_of(a.url, model, a.clients, a.rounds, during=send_hostile)
    record = {"url": a.url, "model": model, "hostile_request": HOSTILE, "hostile_answer": hostile,
              "clients": a.clients, "rounds": a.rounds, "unloaded_ttft_s": unloaded, "loaded_ttft_s": loaded,
              **verdict(hostile, unloaded, loaded),
              "metrics_after": metrics(a.url), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ("hostile_answer", "unloaded_median_s", "loaded_median_s", "ratio",
                                             "ok")}, indent=1))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
