#!/usr/bin/env python3
"""A bounded asyncio load generator that checks every answer of the stand-in upstream.

`concurrency` workers each send one request after another until `duration` seconds are over (no
new request starts after that; those running finish). Requests alternate between streaming and
non-streaming chat and completions, with a random max_tokens, so the expected answer is known:

- a stream must carry content chunks numbered fake_seq 0..n-1 in order, each exactly once, all
  with the same response id, then `data: [DONE]` (no error event, nothing after it);
- a non-streaming answer must hold exactly "tok0 tok1 ... tok{n-1} ".

Anything else counts as an error, with its reason kept. Latency is TTFT (first content chunk)
for streams and the whole request otherwise.

    python tests/reliability/loadgen.py --url http://127.0.0.1:8000 --concurrency 64 --duration 60
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Result:
    kind: str                       # stream-chat, stream-completions, chat, completions
    ok: bool
    latency_s: float                # TTFT for streams, total otherwise
    total_s: float
    chunks: int = 0
    error: str | None = None


@dataclass
class Summary:
    url: str
    concurrency: int
    duration_s: float
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0

    def as_dict(self) -> dict:
        ok = [r for r in self.results if r.ok]
        errors: dict[str, int] = {}
        for r in self.results:
            if not r.ok:
                errors[r.error or "?"] = errors.get(r.error or "?", 0) + 1

        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            s = sorted(values)
            return round(s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] * 1000, 3)

        streams = [r.latency_s for r in ok if r.kind.startswith("stream")]
        plain = [r.latency_s for r in ok if not r.kind.startswith("stream")]
        return {
            "url": self.url, "concurrency": self.concurrency, "duration_s": self.duration_s,
            "wall_s": round(self.wall_s, 2), "requests": len(self.results), "ok": len(ok),
            "errors": len(self.results) - len(ok), "error_reasons": errors,
            "streams": len(streams), "chunks_checked": sum(r.chunks for r in ok),
            "throughput_rps": round(len(ok) / self.wall_s, 2) if self.wall_s else 0.0,
            "ttft_ms": {"p50": pct(streams, 50), "p99": pct(streams, 99)},
            "non_stream_ms": {"p50": pct(plain, 50), "p99": pct(plain, 99)},
        }


def check_stream(raw: bytes, n: int) -> tuple[int, str | None]:
    """(content chunks, None) when the SSE body is exactly n ordered content chunks then [DONE]."""
    text = raw.decode("utf-8", "replace")
    if not text.endswith("\n\n"):
        return 0, "stream did not end with a complete event"
    seqs, ids, done_at = [], set(), None
    events = [e for e in text.split("\n\n") if e]
    for i, event in enumerate(events):
        if not event.startswith("data: "):
            return 0, f"not an SSE data event: {event[:60]!r}"
        data = event[6:]
        if data == "[DONE]":
            done_at = i
            continue
        if done_at is not None:
            return 0, "data after [DONE]"
        obj = json.loads(data)
        if "error" in obj:
            return 0, "error event: " + str(obj["error"].get("message"))[:80]
        if obj.get("fake_seq", 0) < 0:        # the role-only chunk before the first content chunk
            continue
        seqs.append(obj["fake_seq"])
        ids.add(obj["id"])
    if done_at is None:
        return 0, "no [DONE]"
    if seqs != list(range(n)):
        if len(seqs) < n:
            return 0, "dropped chunks"
        if len(set(seqs)) < len(seqs):
            return 0, "duplicated chunks"
        return 0, "reordered chunks"
    if len(ids) != 1:
        return 0, "chunks of different responses mixed"
    return n, None


def http_error(r: httpx.Response) -> str:
    try:
        why = str(r.json()["error"]["message"])[:100]
    except Exception:
        why = r.text[:100]
    return f"HTTP {r.status_code}: {why}"


def expected_text(n: int) -> str:
    return "".join(f"tok{i} " for i in range(n))


async def one_request(client: httpx.AsyncClient, i: int, rng: random.Random, max_tokens: int) -> Result:
    stream = i % 2 == 0
    chat = (i // 2) % 2 == 0
    kind = ("stream-" if stream else "") + ("chat" if chat else "completions")
    n = rng.randint(1, max_tokens)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": "m", "max_tokens": n, "stream": stream}
    body.update({"messages": [{"role": "user", "content": f"request {i}"}]} if chat else {"prompt": f"request {i}"})
    t0 = time.perf_counter()
    try:
        if stream:
            first = None
            buf = bytearray()
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return Result(kind, False, 0.0, time.perf_counter() - t0, error=http_error(r))
                async for piece in r.aiter_raw():
                    if first is None and b'"fake_seq": 0' in bytes(buf) + piece:
                        first = time.perf_counter() - t0
                    buf += piece
            total = time.perf_counter() - t0
            chunks, error = check_stream(bytes(buf), n)
            return Result(kind, error is None, first or total, total, chunks, error)
        r = await client.post(path, json=body)
        total = time.perf_counter() - t0
        if r.status_code != 200:
            return Result(kind, False, total, total, error=http_error(r))
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        if text != expected_text(n):
            return Result(kind, False, total, total, error="wrong non-streaming body")
        return Result(kind, True, total, total, n)
    except httpx.HTTPError as exc:
        return Result(kind, False, 0.0, time.perf_counter() - t0,
                      error=f"{type(exc).__name__} ({kind}, after {time.perf_counter() - t0:.1f} s)")


async def run_load(url: str, concurrency: int = 64, duration: float = 60.0, max_tokens: int = 24,
                   seed: int = 1, headers: dict | None = None, request_timeout: float = 60.0,
                   on_progress=None) -> Summary:
    summary = Summary(url, concurrency, duration)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    counter = iter(range(1 << 40))
    t_start = time.perf_counter()
    deadline = t_start + duration

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=request_timeout, headers=headers or {},
                                 trust_env=False) as client:
        async def worker(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            while time.perf_counter() < deadline:
                summary.results.append(await one_request(client, next(counter), rng, max_tokens))

        async def progress() -> None:
            while on_progress is not None:
                await asyncio.sleep(1.0)  # behaviour: progress is reported once a second
                on_progress(time.perf_counter() - t_start, summary)

        ticker = asyncio.create_task(progress())
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        ticker.cancel()
    summary.wall_s = time.perf_counter() - t_start
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--api-key")
    args = ap.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    s = asyncio.run(run_load(args.url, args.concurrency, args.duration, args.max_tokens, headers=headers))
    print(json.dumps(s.as_dict(), indent=1))
    return 0 if s.as_dict()["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
