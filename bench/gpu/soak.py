#!/usr/bin/env python3
"""Traffic soak (issue 15): a seeded, randomized client mix against an OpenAI-compatible server, with the
JIT-after-ready counters sampled from its /metrics while it runs.

  # the soak (runs --duration s AND at least --min-requests requests; --max-duration is a hard stop)
  python3 bench/gpu/soak.py --url http://127.0.0.1:8000 --seed 15 --out $OUT --tag soak64
  # the same requests (every 4xx of the soak + --sample of the rest) against plain `vllm serve`
  python3 bench/gpu/soak.py --replay $OUT/soak-soak64.jsonl --url http://127.0.0.1:8200 --out $OUT
  # first request vs the next ten (side_by_side.py's ttft(); right after ready only)
  python3 bench/gpu/soak.py --url http://127.0.0.1:8000 --first-check-only --out $OUT --tag x
  # the PNG again (where matplotlib is installed), or one verdict for a GPU phase
  python3 bench/gpu/soak.py --plot $OUT/soak-soak64.jsonl
  python3 bench/gpu/soak.py --verdict --tag soak64 --out $OUT

Endpoints (soak_gen.py draws them): /v1/chat/completions, /v1/completions, /v1/responses (streamed and not) and
/tokenize (both its forms). vLLM serves /tokenize at its root; turingbox's sidecar proxies it like /v1/*.
--tokenize-url sends those requests elsewhere (default: --url; a server that answers them 404 is named in the
summary). --unstreamed-ok ENDPOINTS: a 200 with a whole JSON answer to
a stream request of these endpoints is read as the answer (and counted in the summary), for a stand-in engine
that does not stream them; without it such an answer is a stream error.

Writes soak-TAG.jsonl (one line per request: id, t_start, kind, params summary, status, TTFT, total, error
head, the JIT counter at its end, and the request body: long texts as recipes, see soak_gen.expand),
soak-TAG.json (summary; "ok" = no 5xx, no internal error inside a 200 stream (nor a /v1/responses
stream broken off on a request expected to succeed) and JIT-after-ready delta 0; outcomes by endpoint too) and
soak-TAG.png. Exits 0 unless the
tool itself broke: a server that answers badly is what it reports, not a reason to stop.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import random
import re
import statistics
import sys
import time
from typing import Any

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import soak_gen as G  # noqa: E402

JIT_TOTAL = "turingbox_jit_after_ready_total"
JIT_KERNEL = "turingbox_jit_after_ready_by_kernel_total"
BUCKETS = [(0, 512, "<512"), (512, 4096, "512-4K"), (4096, 30000, "4K-30K"), (30000, 1 << 40, "30K+")]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def bucket(tokens: int) -> str:
    for lo, hi, name in BUCKETS:
        if lo <= tokens < hi:
            return name
    return BUCKETS[-1][2]


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def message_class(msg: str) -> str:
    """An error message without its numbers and quoted values: what a 4xx is 'about'."""
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", msg or "")
    m = re.sub(r"\d+(\.\d+)?", "N", m)
    return re.sub(r"\s+", " ", m).strip()[:120]


def error_text(data: bytes) -> str:
    try:
        obj = json.loads(data)
    except ValueError:
        return data[:300].decode(errors="replace")
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict):
            err = err.get("message", err)
        if isinstance(err, list):      # FastAPI validation errors
            err = "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in err)
        return str(err)[:300]
    return str(obj)[:300]


def parse_jit(text: str) -> tuple[float | None, dict[str, float]]:
    total, by = None, {}
    for line in text.splitlines():
        if line.startswith(JIT_TOTAL + " ") or line.startswith(JIT_TOTAL + "{"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(JIT_KERNEL + "{"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line[len(JIT_KERNEL):line.rindex("}") + 1]))
            by[f"{labels.get('rank', '?')}:{labels.get('kernel', '?')}"] = float(line.rsplit(" ", 1)[1])
    return total, by


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.url = args.url.rstrip("/")
        self.tokenize_url = (getattr(args, "tokenize_url", "") or args.url).rstrip("/")
        self.unstreamed_ok = {e for e in (getattr(args, "unstreamed_ok", "") or "").split(",") if e}
        headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.client = httpx.AsyncClient(base_url=self.url, headers=headers, trust_env=False,
                                        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
                                        timeout=httpx.Timeout(30.0, read=None, write=120.0, pool=None))
        self.t0 = time.time()
        self.records: list[dict] = []
        self.jit_samples: list[dict] = []
        self.jit_last: float | None = None
        self.inflight = 0
        self.max_inflight = 0
        self.sem = asyncio.Semaphore(args.max_concurrency)
        self.out_f = None
        self.seed = args.seed
        self.started = 0
        self.gone_since: float | None = None   # the server stopped answering (connection refused, 503 dead)
        self.aborted: str | None = None

    # -- server facts

    async def discover(self) -> dict:
        info: dict[str, Any] = {"source": None}
        try:
            r = await self.client.get("/turingbox/plan", timeout=10)
            if r.status_code == 200:
                plan = r.json()
                info.update(source="/turingbox/plan", max_model_len=plan.get("max_model_len"),
                            model=plan.get("served_model_name") or plan.get("model"),
                            mtp=bool(plan.get("num_speculative_tokens")), max_num_seqs=plan.get("max_num_seqs"),
                            plan={k: plan.get(k) for k in ("tensor_parallel_size", "num_speculative_tokens",
                                                           "max_model_len", "max_num_seqs", "quantization",
                                                           "gpu_memory_utilization", "cache_key")})
        except (httpx.HTTPError, ValueError):
            pass
        try:    # turingbox's admission limits (a plain vLLM has none: 404)
            r = await self.client.get("/turingbox/limits", timeout=10)
            if r.status_code == 200:
                info["max_n"] = r.json().get("max_n")
        except (httpx.HTTPError, ValueError):
            pass
        if not info.get("max_model_len") or not info.get("model"):
            r = await self.client.get("/v1/models", timeout=10)
            m = r.json()["data"][0]
            info.update(source="/v1/models", model=info.get("model") or m["id"],
                        max_model_len=info.get("max_model_len") or m.get("max_model_len"))
        if self.a.model:
            info["model"] = self.a.model
        if self.a.max_model_len:
            info["max_model_len"] = self.a.max_model_len
        if self.a.mtp is not None:
            info["mtp"] = bool(self.a.mtp)
        info.setdefault("mtp", True)
        return info

    async def metrics(self) -> tuple[float | None, dict[str, float]] | None:
        try:
            r = await self.client.get("/metrics", timeout=10)
            if r.status_code != 200:
                return None
            return parse_jit(r.text)
        except httpx.HTTPError:
            return None

    async def sample_jit(self, label: str = "") -> None:
        got = await self.metrics()
        if got is None:
            self.jit_samples.append({"t": round(time.time() - self.t0, 2), "total": None, "label": label or "unreadable"})
            return
        total, by = got
        if total is not None:
            self.jit_last = total
        s = {"t": round(time.time() - self.t0, 2), "total": total, "by_kernel": by}
        if label:
            s["label"] = label
        if (not self.jit_samples or label or by != self.jit_samples[-1].get("by_kernel")
                or total != self.jit_samples[-1].get("total")):
            self.jit_samples.append(s)
        else:
            self.jit_samples[-1]["t_last"] = s["t"]     # unchanged: keep the file small

    async def jit_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_jit()
            try:
                await asyncio.wait_for(stop.wait(), self.a.metrics_every)
            except asyncio.TimeoutError:
                pass

    # -- one request

    async def send(self, req: G.Req, group: str, body_bytes: bytes | None = None) -> dict:
        rec: dict[str, Any] = {"id": req.id, "group": group, "endpoint": req.endpoint, "kind": req.prompt_class,
                               "expect": req.expect, "intended_prompt_tokens": req.intended_prompt_tokens,
                               "max_tokens": req.max_tokens, "params": req.summary(),
                               "families": req.families}
        async with self.sem:
            data = body_bytes if body_bytes is not None else G.body_for_wire(req, self.seed)
            self.inflight += 1
            self.started += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            rec["inflight_at_start"] = self.inflight
            t_start = time.time()
            rec["t_start"] = round(t_start - self.t0, 3)
            try:
                await asyncio.wait_for(self._attempts(req, data, rec, t_start), req.timeout_s)
            except asyncio.TimeoutError:
                rec.update(status=0, error=f"timeout after {req.timeout_s:g} s" + (
                    f" (HTTP {rec['http_status']} headers had come)" if rec.get("http_status") else ""),
                    error_class="timeout")
            except asyncio.CancelledError:
                rec.update(status=0, error="cancelled at --max-duration", error_class="cancelled")
                self._finish(rec, req, t_start)
                raise
            except httpx.HTTPError as exc:
                rec.update(status=0, error=f"{type(exc).__name__}: {exc}"[:300], error_class=type(exc).__name__)
            except Exception as exc:      # one bad response never ends the soak
                rec.update(status=0, error=f"client {type(exc).__name__}: {exc}"[:300], error_class="client")
            finally:
                self.inflight -= 1
        self._finish(rec, req, t_start)
        return rec

    def _finish(self, rec: dict, req: G.Req, t_start: float) -> None:
        if "total_s" in rec:
            return
        rec["total_s"] = round(time.time() - t_start, 4)
        dead = (not rec.get("status") and rec.get("error_class") in ("ConnectError", "RemoteProtocolError")) or \
            (rec.get("status") == 503 and "exited" in str(rec.get("error", "")))
        if dead:
            self.gone_since = self.gone_since or time.time()
        elif rec.get("status"):
            self.gone_since = None
        rec["jit_at_end"] = self.jit_last
        rec["body"] = G.stored_body(req) if req.raw is None else None
        if req.raw is not None:
            rec["raw"] = req.raw
        self.records.append(rec)
        if self.out_f:
            self.out_f.write(json.dumps(rec) + "\n")
            self.out_f.flush()

    async def _attempts(self, req: G.Req, data: bytes, rec: dict, t0: float) -> None:
        """One exchange; when the connection failed before any response arrived (a kept-alive connection the
        server closed after an error answer, as vLLM 0.21's uvicorn does), once more on a fresh connection,
        as HTTP clients (openai's included) do. The first attempt's error is kept in rec["retried"]."""
        try:
            await self._exchange(self.client, req, data, rec, t0)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError) as exc:
            if "status" in rec:
                raise
            rec["retried"] = f"{type(exc).__name__}: {exc}"[:200]
            async with httpx.AsyncClient(base_url=self.url, headers=self.client.headers, trust_env=False,
                                         timeout=self.client.timeout) as fresh:
                await self._exchange(fresh, req, data, rec, t0)

    def url_for(self, req: G.Req) -> str:
        return (self.tokenize_url if req.endpoint == "tokenize" else self.url) + req.path

    async def _exchange(self, client: httpx.AsyncClient, req: G.Req, data: bytes, rec: dict, t0: float) -> None:
        stream = bool(isinstance(req.body, dict) and req.body.get("stream")) and req.raw is None
        async with client.stream("POST", self.url_for(req), content=data,
                                      headers={"content-type": "application/json"}) as resp:
            rec["status"] = rec["http_status"] = resp.status_code
            if (stream and resp.status_code == 200 and req.endpoint in self.unstreamed_ok
                    and not resp.headers.get("content-type", "").startswith("text/event-stream")):
                rec["stream_answered_whole"] = True      # a stand-in that does not stream this endpoint
                stream = False
            if resp.status_code != 200 or not stream:
                chunks = []
                async for chunk in resp.aiter_bytes():
                    if "ttft_s" not in rec:
                        rec["ttft_s"] = round(time.time() - t0, 4)
                    chunks.append(chunk)
                body = b"".join(chunks)
                rec["bytes"] = len(body)
                if resp.status_code != 200:
                    rec["error"] = error_text(body)
                    rec["error_class"] = message_class(rec["error"])
                    return
                try:
                    obj = json.loads(body)
                    if req.endpoint == "tokenize":
                        rec["prompt_tokens"] = obj["count"]
                    elif req.endpoint == "responses":
                        usage = obj.get("usage") or {}
                        rec["prompt_tokens"] = usage.get("input_tokens")
                        rec["completion_tokens"] = usage.get("output_tokens")
                        rec["finish"] = obj.get("status")      # completed | incomplete (max_output_tokens)
                        rec["n_output_items"] = len(obj.get("output") or [])
                    else:
                        usage = obj.get("usage") or {}
                        rec["prompt_tokens"] = usage.get("prompt_tokens")
                        rec["completion_tokens"] = usage.get("completion_tokens")
                        ch = obj.get("choices") or []
                        rec["finish"] = ch[0].get("finish_reason") if ch else None
                        rec["n_choices"] = len(ch)
                except (ValueError, AttributeError, KeyError, TypeError) as exc:
                    rec["error"] = f"unparsable 200 body: {exc}"[:300]
                    rec["error_class"] = "unparsable 200 body"
                return
            n_data, done, nbytes = 0, False, 0
            responses = req.endpoint == "responses"
            lines = resp.aiter_lines()
            while True:
                try:
                    line = await lines.__anext__()
                except StopAsyncIteration:
                    break
                except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                    if not responses:
                        raise
                    # vLLM 0.21 sends no error event for a refusal raised inside a /v1/responses stream (only a
                    # GenerationError becomes one): the stream breaks off after its 200
                    rec["stream_error"] = f"stream broken off after the 200: {type(exc).__name__}: {exc}"[:300]
                    rec["stream_broken"] = True
                    break
                nbytes += len(line) + 1
                if not line.startswith("data:"):
                    continue                  # SSE comments, and /v1/responses' "event: <type>" lines
                payload = line[5:].strip()
                if "ttft_s" not in rec:
                    rec["ttft_s"] = round(time.time() - t0, 4)
                if payload == "[DONE]":
                    done = True
                    continue
                n_data += 1
                try:
                    obj = json.loads(payload)
                except ValueError:
                    rec["stream_error"] = f"unparsable chunk: {payload[:100]}"
                    continue
                if isinstance(obj, dict) and obj.get("error"):
                    err = obj["error"]
                    rec["stream_error"] = (err.get("message") if isinstance(err, dict) else str(err))[:300]
                    continue
                if responses and isinstance(obj, dict):
                    kind = obj.get("type")
                    if kind == "error":
                        rec["stream_error"] = str(obj.get("message") or obj)[:300]
                    elif kind in ("response.completed", "response.incomplete", "response.failed"):
                        done = True           # the Responses API's last event (it sends no [DONE])
                        final = obj.get("response") or {}
                        usage = final.get("usage") or {}
                        rec["prompt_tokens"] = usage.get("input_tokens")
                        rec["completion_tokens"] = usage.get("output_tokens")
                        rec["finish"] = final.get("status")
                        if kind == "response.failed":
                            rec["stream_error"] = str((final.get("error") or {}).get("message") or kind)[:300]
                    continue
                usage = obj.get("usage") if isinstance(obj, dict) else None
                if usage:
                    rec["prompt_tokens"] = usage.get("prompt_tokens")
                    rec["completion_tokens"] = usage.get("completion_tokens")
                for ch in obj.get("choices") or []:
                    if ch.get("finish_reason"):
                        rec["finish"] = ch["finish_reason"]
            rec["bytes"] = nbytes
            rec["chunks"] = n_data
            if not done:
                rec["stream_error"] = rec.get("stream_error") or (
                    "stream ended without response.completed" if responses else "stream ended without [DONE]")
            if rec.get("stream_error"):
                rec["error"] = rec["stream_error"]
                rec["error_class"] = "stream: " + message_class(rec["stream_error"])

    # -- calibration

    async def calibrate(self, info: dict) -> G.Calibration:
        """tokens per word and template overheads from usage.prompt_tokens of a few probe requests."""
        cal = G.Calibration()
        model = info["model"]
        probes = {}
        for name, body in [
            ("c100", {"model": model, "prompt": G.render(self.seed, [["rand", "cal-a", 100]]), "max_tokens": 1}),
            ("c1000", {"model": model, "prompt": G.render(self.seed, [["rand", "cal-b", 1000]]), "max_tokens": 1}),
            ("chat_off", {"model": model, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False},
                          "messages": [{"role": "system", "content": G.render(self.seed, [["rand", "cal-c", 100]])},
                                       {"role": "user", "content": G.render(self.seed, [["rand", "cal-d", 100]])}]}),
            ("chat_on", {"model": model, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": True},
                         "messages": [{"role": "system", "content": G.render(self.seed, [["rand", "cal-c", 100]])},
                                      {"role": "user", "content": G.render(self.seed, [["rand", "cal-d", 100]])}]}),
        ]:
            endpoint = "chat" if name.startswith("chat") else "completions"
            req = G.Req(-1 - len(probes), endpoint, body, ["calibrate"], "ok", 0, "calibrate", 1, 300.0)
            rec = await self.send(req, "calibrate")
            probes[name] = rec.get("prompt_tokens")
        c100, c1000 = probes.get("c100"), probes.get("c1000")
        if c100 and c1000 and c1000 > c100:
            ratio = (c1000 - c100) / 900.0
            if 0.5 <= ratio <= 2.5:
                cal.tokens_per_word = round(ratio, 3)
                cal.completion_overhead = max(0, round(c100 - 100 * ratio))
                if probes.get("chat_off"):
                    cal.chat_overhead = max(0, round(probes["chat_off"] - 200 * ratio))
                if probes.get("chat_on"):
                    cal.chat_thinking_overhead = max(0, round(probes["chat_on"] - 200 * ratio))
                cal.source = "probes"
        if cal.source != "probes":
            cal.source = f"default (probes gave {probes})"
        log(f"calibration: {cal}")
        return cal

    # -- the run

    GONE_S = 15.0      # a server that answered nothing for this long is dead: stop and say so

    def should_stop(self) -> bool:
        el = time.time() - self.t0
        if self.gone_since is not None and time.time() - self.gone_since > self.GONE_S:
            if self.aborted is None:
                self.aborted = f"the server stopped answering {el - (time.time() - self.gone_since):.1f} s into the soak"
                log(f"aborting: {self.aborted}")
            return True
        return el >= self.a.duration and self.started >= self.a.min_requests

    async def worker(self, gen: G.SoakGen, lock: asyncio.Lock, wid: int) -> None:
        rng = random.Random(f"think-{self.seed}-{wid}")
        while not self.should_stop():
            async with lock:
                g = gen.group()
            if g.kind == "burst":
                await asyncio.gather(*(self.send(r, f"burst{len(g.reqs)}") for r in g.reqs))
            else:
                for r in g.reqs:
                    await self.send(r, g.kind)
                    if self.should_stop():
                        break
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 1.0))

    async def run(self) -> dict:
        a = self.a
        os.makedirs(a.out, exist_ok=True)
        jsonl = os.path.join(a.out, f"soak-{a.tag}.jsonl")
        self.out_f = open(jsonl, "w")
        info = await self.discover()
        log(f"server: {info}")
        first = None
        if a.first_check:
            first = first_check(self.url, info["model"])
            log(f"first-request check: {first}")
        await self.sample_jit("start")
        cal = await self.calibrate(info) if not a.no_calibrate else G.Calibration(source="--no-calibrate")
        gen = G.SoakGen(a.seed, info["model"], int(info["max_model_len"]), mtp=info["mtp"], calib=cal,
                        long_output_weight=a.long_output_weight, max_n=info.get("max_n"))
        stop = asyncio.Event()
        jit_task = asyncio.create_task(self.jit_loop(stop))
        lock = asyncio.Lock()
        n_workers = workers_for(a.workers, info.get("max_num_seqs"))
        log(f"{n_workers} client loops ({'--workers' if a.workers else 'one per sequence slot of the plan, at least 3'})")
        workers = [asyncio.create_task(self.worker(gen, lock, i)) for i in range(n_workers)]
        done, pending = await asyncio.wait(workers, timeout=max(1.0, a.max_duration - (time.time() - self.t0)))
        hard_stop = bool(pending)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception():
                log(f"worker died: {t.exception()!r}")
        stop.set()
        await jit_task
        await self.sample_jit("end")
        self.out_f.close()
        await self.client.aclose()
        summary = summarize(self.records, self.jit_samples, {
            "tag": a.tag, "url": self.url, "seed": a.seed, "argv": sys.argv, "server": info,
            "calibration": cal.__dict__, "duration_s": round(time.time() - self.t0, 1),
            "hard_stop": hard_stop, "aborted": self.aborted, "max_inflight": self.max_inflight, "first_check": first,
            "workers": n_workers,
            "jsonl": os.path.basename(jsonl)})
        with open(os.path.join(a.out, f"soak-{a.tag}.json"), "w") as f:
            json.dump(summary, f, indent=1)
        png = os.path.join(a.out, f"soak-{a.tag}.png")
        summary["png"] = plot(self.records, self.jit_samples, png, f"soak {a.tag} seed {a.seed}")
        with open(os.path.join(a.out, f"soak-{a.tag}.json"), "w") as f:
            json.dump(summary, f, indent=1)
        return summary


def workers_for(asked: int, max_num_seqs: int | None) -> int:
    """Client loops: as asked, or (0) one per sequence slot the plan schedules, at least 3. Fewer loops than slots leave
    the engine idle and the soak client-bound: 3 loops kept session 23's 2 sequences full, 8 are needed at 8."""
    return asked if asked > 0 else max(3, int(max_num_seqs or 0))


def summarize(records: list[dict], jit_samples: list[dict], meta: dict) -> dict:
    reqs = [r for r in records if r.get("group") != "calibrate"]
    status = collections.Counter(str(r.get("status", 0)) for r in records)
    n5 = sum(1 for r in records if 500 <= (r.get("status") or 0) < 600)
    cls4 = collections.Counter(f"{r['status']} {r.get('error_class', '')}" for r in records
                               if 400 <= (r.get("status") or 0) < 500)
    cls0 = collections.Counter(r.get("error_class", "?") for r in records if not r.get("status"))
    cls5 = collections.Counter(f"{r['status']} {r.get('error_class', '')}" for r in records
                               if 500 <= (r.get("status") or 0) < 600)
    retried = collections.Counter(r["retried"].split(":")[0] for r in records if r.get("retried"))
    stream_err = collections.Counter(r.get("error_class", "") for r in records
                                     if r.get("status") == 200 and r.get("stream_error"))
    # vLLM's 500 inside a stream whose headers already said 200: an internal error all the same
    stream5 = [r["id"] for r in records if outcome(r) == STREAM_INTERNAL_ERROR]
    # a stream refuses inside its 200 (vLLM sends the error as an event): that is the expected failure too
    expected_fail_ok = [r["id"] for r in reqs if r["expect"].startswith("fail:") and r.get("status") == 200
                        and not r.get("stream_error")]
    unexpected_4xx = [r["id"] for r in reqs if r["expect"] == "ok" and 400 <= (r.get("status") or 0) < 500]
    # a /v1/responses stream that broke off after its 200 on a request vLLM should serve: its internal error
    broken_ok = [r["id"] for r in reqs if r.get("stream_broken") and r["expect"] == "ok"]
    by_endpoint: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in reqs:
        by_endpoint[r.get("endpoint", "?")][outcome(r)] += 1
    tokenize_404 = sum(1 for r in reqs if r.get("endpoint") == "tokenize" and r.get("status") == 404
                       and r.get("expect") == "ok")
    whole = sum(1 for r in reqs if r.get("stream_answered_whole"))
    ttft: dict[str, list[float]] = collections.defaultdict(list)
    for r in reqs:
        if r.get("endpoint") == "tokenize":           # nothing generated: no time to first token
            continue
        if r.get("status") == 200 and r.get("ttft_s") is not None and not r.get("stream_error"):
            ttft[bucket(r["intended_prompt_tokens"])].append(r["ttft_s"])
    tt = {}
    for _, _, name in BUCKETS:
        xs = ttft.get(name, [])
        tt[name] = {"n": len(xs), "p50": pct(xs, .5), "p90": pct(xs, .9), "p99": pct(xs, .99),
                    "max": max(xs) if xs else None}
    readable = [s for s in jit_samples if s.get("total") is not None]
    j0 = readable[0] if readable else None
    j1 = readable[-1] if readable else None
    delta = (j1["total"] - j0["total"]) if j0 and j1 else None
    by_delta = {}
    if j0 and j1:
        for k, v in (j1.get("by_kernel") or {}).items():
            d = v - (j0.get("by_kernel") or {}).get(k, 0.0)
            if d:
                by_delta[k] = d
    first_jit = next((s for s in readable if j0 and s["total"] != j0["total"]), None)
    calib_err = [r["prompt_tokens"] - r["intended_prompt_tokens"] for r in reqs
                 if r.get("prompt_tokens") and r["kind"] in ("short", "medium", "long", "near_max")
                 and r.get("endpoint", "chat") in ("chat", "completions")
                 and not {"token_ids_prompt", "multi_prompt", "multi_turn", "truncate_prompt_tokens",
                          "continue_final_message", "add_generation_prompt"} & set(r["families"])]
    fam = collections.Counter(f for r in reqs for f in r["families"] if not f.startswith("fail:"))
    fails = collections.Counter(f[5:] for r in reqs for f in r["families"] if f.startswith("fail:"))
    reasons = []
    if n5:
        reasons.append(f"{n5} responses with status 5xx")
    if stream5:
        reasons.append(f"{len(stream5)} streams ended with an internal server error after a 200: ids {stream5[:20]}")
    if broken_ok:
        reasons.append(f"{len(broken_ok)} /v1/responses streams broke off after a 200 on requests expected to "
                       f"succeed: ids {broken_ok[:20]}")
    if delta is None:
        reasons.append(f"{JIT_TOTAL} not readable from /metrics")
    elif delta:
        reasons.append(f"JIT after ready grew by {delta:g}: {by_delta}")
    notes = []
    if cls0:
        notes.append(f"{sum(cls0.values())} requests without an HTTP status: {dict(cls0)}")
    if retried:
        notes.append(f"{sum(retried.values())} requests retried once on a fresh connection after the first "
                     f"failed before any response: {dict(retried)}")
    if stream_err:
        notes.append(f"{sum(stream_err.values())} 200 streams with an error: {dict(stream_err)}")
    if tokenize_404:
        notes.append(f"{tokenize_404} /tokenize requests answered 404: the server at --url does not serve /tokenize "
                     "; --tokenize-url sends them elsewhere")
    if whole:
        notes.append(f"{whole} stream requests answered with a whole JSON body (--unstreamed-ok)")
    return {
        **meta,
        "ok": n5 == 0 and not stream5 and not broken_ok and delta == 0 and not meta.get("aborted"),
        "not_ok_reasons": reasons,
        "notes": notes,
        "requests": len(records),
        "requests_excluding_calibration": len(reqs),
        "by_status": dict(sorted(status.items())),
        "n_5xx": n5,
        "stream_internal_errors": stream5[:50],
        "n_stream_internal_errors": len(stream5),
        "responses_streams_broken_expected_ok": broken_ok[:50],
        "by_endpoint": {k: dict(sorted(v.items())) for k, v in sorted(by_endpoint.items())},
        "n_streams_answered_whole": whole,
        "5xx_by_message": dict(cls5.most_common()),
        "4xx_by_message": dict(cls4.most_common()),
        "no_status_by_error": dict(cls0.most_common()),
        "stream_errors_in_200": dict(stream_err.most_common()),
        "retried_on_fresh_connection": dict(retried.most_common()),
        "expected_fail_but_200": expected_fail_ok[:50],
        "n_expected_fail_but_200": len(expected_fail_ok),
        "unexpected_4xx": unexpected_4xx[:50],
        "n_unexpected_4xx": len(unexpected_4xx),
        "jit_after_ready": {"start": j0 and j0["total"], "end": j1 and j1["total"], "delta": delta,
                            "by_kernel_start": j0 and j0.get("by_kernel"), "by_kernel_end": j1 and j1.get("by_kernel"),
                            "by_kernel_delta": by_delta, "first_change_t": first_jit and first_jit["t"],
                            "samples": jit_samples},
        "ttft_s_by_prompt_bucket": tt,
        "prompt_token_error_vs_intended": {"n": len(calib_err), "median": statistics.median(calib_err) if calib_err else None,
                                           "min": min(calib_err, default=None), "max": max(calib_err, default=None)},
        "families": dict(sorted(fam.items())),
        "must_fail_kinds": dict(sorted(fails.items())),
    }


def plot(records: list[dict], jit_samples: list[dict], png: str, title: str) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no PNG (run `soak.py --plot JSONL` where it is installed)")
        return "skipped: no matplotlib"
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    colors = {"<512": "tab:blue", "512-4K": "tab:green", "4K-30K": "tab:purple", "30K+": "tab:brown"}
    for _, _, name in BUCKETS:
        pts = [(r["t_start"], r["ttft_s"]) for r in records if r.get("status") == 200 and r.get("ttft_s")
               and bucket(r.get("intended_prompt_tokens", 0)) == name and not r.get("stream_error")
               and r.get("endpoint") != "tokenize"]
        if pts:
            ax.scatter(*zip(*pts), s=6, alpha=.6, color=colors[name], label=f"200, prompt {name} ({len(pts)})")
    ymax = max([r.get("ttft_s") or 0 for r in records] + [1e-3])
    marks = [("4xx", lambda s: 400 <= s < 500, "orange", "x"), ("5xx", lambda s: 500 <= s < 600, "red", "X"),
             ("no status (timeout/reset)", lambda s: s == 0, "black", "v")]
    for label, pred, color, m in marks:
        pts = [(r["t_start"], r.get("ttft_s") or r.get("total_s") or ymax) for r in records if pred(r.get("status") or 0)]
        if pts:
            ax.scatter(*zip(*pts), s=22 if label != "4xx" else 10, color=color, marker=m, label=f"{label} ({len(pts)})")
    pts = [(r["t_start"], r.get("ttft_s") or 1e-3) for r in records if r.get("status") == 200 and r.get("stream_error")]
    if pts:
        ax.scatter(*zip(*pts), s=22, color="magenta", marker="D", label=f"200 with stream error ({len(pts)})")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s), first byte / first SSE data")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(alpha=.3)
    ev = sorted([(r["t_start"], 1) for r in records] + [(r["t_start"] + r.get("total_s", 0), -1) for r in records])
    n, xs, ys = 0, [], []
    for t, d in ev:
        n += d
        xs.append(t)
        ys.append(n)
    ax2.step(xs, ys, where="post", color="gray", lw=.8, label="requests in flight")
    ax2.set_ylabel("in flight")
    ax3 = ax2.twinx()
    js = [(s["t"], s["total"]) for s in jit_samples if s.get("total") is not None]
    if js:
        ax3.step(*zip(*js), where="post", color="red", lw=1.5, label="jit_after_ready_total")
    ax3.set_ylabel("JIT after ready", color="red")
    ax2.set_xlabel("seconds since soak start")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return os.path.basename(png)


def first_check(url: str, model: str) -> dict:
    """side_by_side.py's first-request measurement (one streaming chat, then ten more of the same shape)."""
    import side_by_side
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        first = side_by_side.ttft(port, model)
        later = [side_by_side.ttft(port, model) for _ in range(10)]
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    med = statistics.median(later)
    return {"first_ttft_s": first, "later_ttft_s": later, "later_ttft_median_s": med,
            "first_over_later": first / med, "goal_le_1_2": first / med <= 1.2}


# -- replay

# Refusals that are turingbox's own (the plugin's API-server check), where plain vLLM 0.21 fails the same request
# with a 500 (vllm#53665's kin: allowed_token_ids that cannot start the structured output, or continue it: both
# sentences begin alike, vllm_fixes.fix_allowed_vs_grammar and fix_allowed_ids_dead_end). A 4xx here against
# plain vLLM's 5xx is the fix, not a difference to explain; any other status difference is.
OWN_REFUSALS = ("allowed_token_ids and structured_outputs leave no token to generate",)
# turingbox's admission limits (serve/admission.py) name the setting they refuse by, "(TURINGBOX_MAX_TOTAL_TOKENS)":
# the plan's limits, turingbox's own refusals whatever plain vLLM answers (the CPU stand-in does not check
# prompt + max_tokens against max_model_len, so it answers 200 where vLLM 0.21 and the sidecar answer 400).
ADMISSION_MARK = "(TURINGBOX_"
STREAM_INTERNAL_ERROR = "200+internal-error"


def outcome(r: dict) -> str:
    """A request's result as the soak and the replay compare it: the HTTP status; a stream whose 200 carried an
    error event is "200+error" (a refusal raised after the headers, as vLLM does for streams), or
    STREAM_INTERNAL_ERROR when that error is vLLM's "Internal server error"."""
    status = r.get("status")
    if status == 200 and r.get("stream_error"):
        return STREAM_INTERNAL_ERROR if "Internal server error" in r["stream_error"] else "200+error"
    return str(status)


# vLLM refuses a stream's request after its 200: chat and completions as their first event, the responses API by
# breaking the stream off. turingbox's sidecar answers the first as the 400 it is (the proxy reads the first event),
# and refuses min_p/logit_bias under MTP and the responses API's top_logprobs above vLLM's limit itself, before the
# stream: the same refusals, with vLLM's sentence (the sidecar may append its remedy).
SPEC_DECODE_SENTENCE = "not yet supported with speculative decoding"
LOGPROBS_SENTENCE = "which is greater than max allowed"


def same_outcome(soak_r: dict, plain_r: dict) -> bool:
    so, po = outcome(soak_r), outcome(plain_r)
    if so == po:
        return True
    if so[:1] != "4" or po != "200+error":
        return False
    soak_msg, plain_msg = soak_r.get("error") or "", plain_r.get("stream_error") or plain_r.get("error") or ""
    if plain_r.get("stream_broken"):       # vLLM's responses stream says nothing: only the sidecar's rules apply
        return soak_r.get("endpoint") == "responses" and (LOGPROBS_SENTENCE in soak_msg or SPEC_DECODE_SENTENCE
                                                           in soak_msg)
    return bool(plain_msg) and (plain_msg in soak_msg or SPEC_DECODE_SENTENCE in soak_msg and SPEC_DECODE_SENTENCE
                                in plain_msg)


def _failed(o: str) -> bool:
    return o == STREAM_INTERNAL_ERROR or o[:1] == "5"


def is_admission_refusal(m: dict) -> bool:
    """A replay mismatch whose soak side is a refusal by turingbox's admission limits (4xx, or an error event in a
    200 stream, naming a TURINGBOX_ setting)."""
    soak_o = m.get("soak_outcome") or str(m.get("soak_status"))
    return (soak_o[:1] == "4" or soak_o == "200+error") and ADMISSION_MARK in (m.get("soak_error") or "")


def split_replay_mismatches(mismatches: list[dict]) -> tuple[list[dict], list[dict]]:
    """(turingbox's own refusals, every other mismatch). Own: a refusal by turingbox's admission limits (whatever
    plain vLLM answered), or one of OWN_REFUSALS where plain vLLM failed internally. A refusal is a 400,
    or an error event in a 200 stream; plain's failure a 5xx or an internal error in its stream."""
    own, other = [], []
    for m in mismatches:
        soak_o = m.get("soak_outcome") or str(m.get("soak_status"))
        plain_o = m.get("plain_outcome") or str(m.get("plain_status"))
        ours = is_admission_refusal(m) or soak_o in ("400", "200+error") and _failed(plain_o) \
            and any(t in (m.get("soak_error") or "") for t in OWN_REFUSALS)
        (own if ours else other).append(m)
    return own, other



async def replay(args: argparse.Namespace) -> dict:
    recs = _jsonl(args.replay)
    summary_path = args.replay[:-len(".jsonl")] + ".json"
    seed = args.seed
    if os.path.exists(summary_path):
        seed = json.load(open(summary_path)).get("seed", seed)
    recs = [r for r in recs if r.get("group") != "calibrate" and (r.get("body") is not None or r.get("raw"))]
    # every refusal and error: 4xx, and streams whose 200 carried an error event (a stream's refusal comes late)
    four = [r for r in recs if 400 <= (r.get("status") or 0) < 500 or outcome(r).startswith("200+")]
    rest = [r for r in recs if r not in four]
    if args.against:   # the other server's sample: every request it answered is compared
        ids = {str(r["id"]) for r in _jsonl(args.against)}
        sample = [r for r in rest if str(r["id"]) in ids]
    else:
        sample = random.Random(f"replay-{seed}").sample(rest, min(args.sample, len(rest)))
    a = argparse.Namespace(**{**vars(args), "max_concurrency": args.replay_concurrency})
    s = Soak(a)
    s.seed = seed
    tag = args.tag or os.path.basename(args.replay)[:-len(".jsonl")].removeprefix("soak-")
    out_jsonl = os.path.join(args.out, f"replay-{tag}.jsonl")
    s.out_f = open(out_jsonl, "w")

    async def one(r: dict, why: str) -> dict:
        endpoint = r["endpoint"]
        body = r.get("body")
        req = G.Req(r["id"], endpoint, body if body is not None else {}, r["families"], r["expect"],
                    r["intended_prompt_tokens"], r["kind"], r["max_tokens"],
                    600.0 if r["intended_prompt_tokens"] > 30000 else 300.0, r.get("raw"))
        out = await s.send(req, f"replay-{why}")
        answers.append(out)
        return {"id": r["id"], "why": why, "soak_status": r.get("status"), "plain_status": out.get("status"),
                "soak_outcome": outcome(r), "plain_outcome": outcome(out), "same_status": same_outcome(r, out),
                "soak_error": (r.get("error") or "")[:200], "plain_error": (out.get("error") or "")[:200],
                "families": [f for f in r["families"] if f.startswith("fail:")], "kind": r["kind"]}

    answers: list[dict] = []
    t0 = time.time()
    rows = await asyncio.gather(*[one(r, "4xx") for r in four], *[one(r, "sample") for r in sample])
    s.out_f.close()
    await s.client.aclose()
    rows4 = [x for x in rows if x["why"] == "4xx"]
    rowss = [x for x in rows if x["why"] == "sample"]
    mism4 = [x for x in rows4 if not x["same_status"]]
    mismS = [x for x in rowss if not x["same_status"]]
    cmp_ = {"soak_jsonl": os.path.basename(args.replay), "url": args.url, "seed": seed, "argv": sys.argv,
            "duration_s": round(time.time() - t0, 1),
            "n_4xx": len(rows4), "n_4xx_same_status": len(rows4) - len(mism4),
            "all_4xx_same_status": not mism4,
            "n_sample": len(rowss), "n_sample_same_status": len(rowss) - len(mismS),
            "sample_status_pairs": dict(collections.Counter(f"{x['soak_outcome']}->{x['plain_outcome']}" for x in rowss)),
            "4xx_status_pairs": dict(collections.Counter(f"{x['soak_outcome']}->{x['plain_outcome']}" for x in rows4)),
            "mismatches_4xx": mism4, "mismatches_sample": mismS}
    own, other = split_replay_mismatches(mism4)
    n_admission = sum(1 for m in own if is_admission_refusal(m))
    cmp_.update(n_turingbox_refusals_of_vllm_5xx=len(own) - n_admission, n_turingbox_admission_refusals=n_admission,
                n_unexplained_4xx_mismatches=len(other), ok=not other)
    if args.against:
        cmp_["against"] = compare_against(answers, args.against, earlier=recs)
        cmp_["ok"] = cmp_["against"]["ok"]
    with open(os.path.join(args.out, f"replay-{tag}.json"), "w") as f:
        json.dump(cmp_, f, indent=1)
    return cmp_


def compare_against(answers: list[dict], against_jsonl: str, earlier: list[dict] | None = None) -> dict:
    """A replay's answers (the server judged, e.g. turingbox after a fix) beside another server's recorded answers
    to the same soak requests (e.g. plain vLLM's replay JSONL of an earlier session), by request id. Explained
    differences: a refusal of a request plain vLLM fails internally (split_replay_mismatches), and a complete
    answer where plain vLLM failed internally to a request the generator expects to succeed (any other request
    plain vLLM fails and the judged server answers is listed for review). Every request the other server answered
    must have been replayed, as the same request (endpoint and kind). `earlier`, the soak's own records, only
    puts the first outcome beside each difference."""
    theirs = {str(r["id"]): r for r in _jsonl(against_jsonl)}
    first = {str(r["id"]): outcome(r) for r in earlier or []}
    mine = {str(a["id"]): a for a in answers}
    pairs, mism, not_same_request = collections.Counter(), [], []
    for i, t in theirs.items():
        a = mine.get(i)
        if a is None:
            continue
        if (a.get("endpoint"), a.get("kind")) != (t.get("endpoint"), t.get("kind")):
            not_same_request.append(i)
            continue
        ours, other = outcome(a), outcome(t)
        pairs[f"{ours}->{other}"] += 1
        if ours != other:
            mism.append({"id": a["id"], "soak_outcome": ours, "plain_outcome": other, "expect": a.get("expect"),
                         "earlier_outcome": first.get(i), "soak_error": (a.get("error") or "")[:200],
                         "plain_error": (t.get("error") or "")[:200], "kind": a.get("kind")})
    answered = [m for m in mism if m["soak_outcome"] == "200" and _failed(m["plain_outcome"])
                and m["expect"] in ("ok", "boundary")]
    own, unexplained = split_replay_mismatches([m for m in mism if m not in answered])
    missing = sorted(set(theirs) - set(mine), key=lambda x: (len(x), x))
    n = sum(pairs.values())
    return {"against_jsonl": os.path.basename(against_jsonl), "n_against": len(theirs), "n_compared": n,
            "not_replayed": missing, "not_the_same_request": not_same_request, "n_same": n - len(mism),
            "pairs": dict(pairs), "n_turingbox_refusals_of_vllm_5xx": len(own),
            "n_answered_where_vllm_failed": len(answered), "n_unexplained": len(unexplained), "mismatches": mism,
            "ok": n > 0 and not unexplained and not missing and not not_same_request}


def _jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def verdict(args: argparse.Namespace) -> dict:
    """One line per Done-when clause for a GPU phase, from what the phase wrote to --out."""
    out, tag = args.out, args.tag

    def load(name):
        p = os.path.join(out, name)
        return json.load(open(p)) if os.path.exists(p) else None
    sbs, summ, rep = load(f"side_by_side-{tag}.json"), load(f"soak-{tag}.json"), load(f"replay-{tag}.json")
    v: dict[str, Any] = {"tag": tag}
    tb = (sbs or {}).get("turingbox") or {}
    if "first_over_later" in tb:
        v["first_over_later"] = tb["first_over_later"]
        v["first_request_ok"] = tb["first_over_later"] <= 1.2
    elif summ and summ.get("first_check") and "first_over_later" in summ["first_check"]:
        v["first_over_later"] = summ["first_check"]["first_over_later"]
        v["first_request_ok"] = v["first_over_later"] <= 1.2
    if summ:
        v.update(soak_ok=summ["ok"], requests=summ["requests"], duration_s=summ["duration_s"],
                 n_5xx=summ["n_5xx"], n_stream_internal_errors=summ.get("n_stream_internal_errors"),
                 jit_delta=summ["jit_after_ready"]["delta"],
                 jit_by_kernel_delta=summ["jit_after_ready"]["by_kernel_delta"], not_ok_reasons=summ["not_ok_reasons"])
    monitor = {}
    for name in args.log or []:
        p = name if os.path.isabs(name) else os.path.join(out, name)
        if os.path.exists(p):
            lines = [l for l in open(p, errors="replace") if "Triton kernel JIT compilation during inference" in l]
            monitor[os.path.basename(p)] = {"lines": len(lines), "kernels": sorted(set(
                re.findall(r"during inference: (\S+?)\.", "".join(lines))))}
    v["jit_monitor"] = monitor
    if rep:
        own, other = split_replay_mismatches(rep.get("mismatches_4xx") or [])
        n_admission = sum(1 for m in own if is_admission_refusal(m))
        v.update(replay_ok=not other, replay_4xx=f"{rep['n_4xx_same_status']}/{rep['n_4xx']}",
                 replay_4xx_turingbox_refusals_of_vllm_5xx=len(own) - n_admission,
                 replay_4xx_turingbox_admission_refusals=n_admission, replay_4xx_unexplained=len(other),
                 replay_sample=f"{rep['n_sample_same_status']}/{rep['n_sample']}")
    with open(os.path.join(out, f"verdict-{tag}.json"), "w") as f:
        json.dump(v, f, indent=1)
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--duration", type=float, default=600.0, help="run at least this long (s)")
    ap.add_argument("--min-requests", type=int, default=2000, help="... and at least this many requests")
    ap.add_argument("--max-duration", type=float, default=None, help="hard stop (s; default 3 x --duration)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--workers", type=int, default=0,
                    help="client loops drawing groups (single/sequential/burst); 0: one per sequence slot of the "
                         "server's plan (/turingbox/plan's max_num_seqs), at least 3")
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--metrics-every", type=float, default=5.0)
    ap.add_argument("--model", default="", help="override the served model name")
    ap.add_argument("--max-model-len", type=int, default=0, help="override max_model_len")
    ap.add_argument("--mtp", type=int, default=None, help="override: 1 = the server refuses min_p/logit_bias")
    ap.add_argument("--api-key", default=os.environ.get("TURINGBOX_API_KEY", ""))
    ap.add_argument("--tokenize-url", default="",
                    help="where /tokenize requests go (default --url)")
    ap.add_argument("--unstreamed-ok", default="", metavar="ENDPOINTS",
                    help="comma list (e.g. responses): read a whole JSON 200 to a stream request of these endpoints "
                         "as its answer (a stand-in engine that does not stream them)")
    ap.add_argument("--long-output-weight", type=float, default=1.0,
                    help="scales the weight of max_tokens 256..2048 (throughput knob)")
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument("--first-check", action="store_true", help="first request vs the next ten, before the soak")
    ap.add_argument("--first-check-only", action="store_true")
    ap.add_argument("--replay", metavar="JSONL", help="send a soak's 4xx + --sample others to --url, compare")
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--replay-concurrency", type=int, default=4)
    ap.add_argument("--compare", metavar="JSONL", help="a recorded replay's JSONL to compare --against, offline "
                    "(--replay names the soak's JSONL for the first outcomes)")
    ap.add_argument("--against", metavar="JSONL",
                    help="with --replay: compare the answers by id with another server's replay JSONL of the same soak "
                         "(its requests replace --sample)")
    ap.add_argument("--plot", metavar="JSONL", help="draw the PNG of a soak's JSONL (+ its summary's JIT samples)")
    ap.add_argument("--verdict", action="store_true", help="summarize a GPU phase's files in --out for --tag")
    ap.add_argument("--log", action="append", help="with --verdict: server logs to grep for vLLM's jit_monitor")
    args = ap.parse_args()
    if args.max_duration is None:
        args.max_duration = 3 * args.duration
    os.makedirs(args.out, exist_ok=True)
    if args.verdict:
        print(json.dumps(verdict(args), indent=1))
        return 0
    if args.plot:
        recs = _jsonl(args.plot)
        sp = args.plot[:-len(".jsonl")] + ".json"
        samples = json.load(open(sp))["jit_after_ready"]["samples"] if os.path.exists(sp) else []
        print(plot(recs, samples, args.plot[:-len(".jsonl")] + ".png", os.path.basename(args.plot)))
        return 0
    if args.compare:   # offline: a recorded replay against another server's
        if not args.against:
            ap.error("--compare needs --against")
        res = compare_against(_jsonl(args.compare), args.against, _jsonl(args.replay) if args.replay else None)
        print(json.dumps({k: v for k, v in res.items() if k != "mismatches"}, indent=1))
        for m in res["mismatches"]:
            print("against mismatch:", json.dumps(m)[:400])
        return 0 if res["ok"] else 1
    if args.replay:
        res = asyncio.run(replay(args))
        print(json.dumps({k: v for k, v in res.items() if not k.startswith("mismatches")}, indent=1))
        for m in (res["mismatches_4xx"] + res["mismatches_sample"])[:20]:
            print("mismatch:", json.dumps(m)[:400])
        if "against" in res:
            print("against", json.dumps({k: v for k, v in res["against"].items() if k != "mismatches"}, indent=1))
            for m in res["against"]["mismatches"][:20]:
                print("against mismatch:", json.dumps(m)[:400])
        return 0
    args.tag = args.tag or f"seed{args.seed}"
    if args.first_check_only:
        res = first_check(args.url, args.model or asyncio.run(Soak(args).discover())["model"])
        with open(os.path.join(args.out, f"first-check-{args.tag}.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps(res, indent=1))
        return 0
    summary = asyncio.run(Soak(args).run())
    short = {k: summary[k] for k in ("ok", "not_ok_reasons", "notes", "requests", "duration_s", "by_status",
                                     "by_endpoint",
                                     "n_5xx", "4xx_by_message", "ttft_s_by_prompt_bucket", "calibration",
                                     "max_inflight", "hard_stop", "png")}
    short["jit_after_ready"] = {k: v for k, v in summary["jit_after_ready"].items() if k != "samples"}
    print(json.dumps(short, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
