"""Prometheus metrics of the sidecar, in a registry of its own, plus vLLM's own page passed through.

Proxy metrics are updated as requests pass; stage, worker (plugin) and GPU metrics are read at
scrape time by collectors, so they never go stale and cost nothing between scrapes.

`/metrics` on the public port also carries vLLM's own series (`vllm:*`, and the process_*/python_*/http_*
series of its API server), fetched from vLLM's loopback port when the sidecar is scraped, byte for byte
(names, labels and values unchanged), so vLLM's dashboards, KEDA/HPA on `vllm:num_requests_waiting` and the
Inference Gateway's endpoint picker work against the one port a pod exposes. One fetch is the whole
engine however many ranks it has: in vLLM 0.21 the workers (TP/PP ranks, on this node or others) export
no Prometheus series; each engine core sends its stats to the API server process, whose
PrometheusStatLogger records them with an `engine` label (one per data-parallel engine), and with several
API server processes vLLM aggregates through PROMETHEUS_MULTIPROC_DIR, so any one of them answers for all.
Scraping each rank would either find nothing or count the same engine twice.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Callable, Iterable

import httpcore
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from turingbox.gpus.inventory import NvmlTelemetry
from turingbox.serve import stages
from turingbox.serve.admission import REASONS as ADMISSION_REASONS

log = logging.getLogger("turingbox.serve")

# Latency buckets from sub-millisecond (health, models) to long generations.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
KNOWN_ROUTES = ("chat/completions", "completions", "models", "embeddings", "responses", "tokenize",
                "detokenize", "audio/transcriptions", "rerank", "score")


def route_label(path: str) -> str:
    """A bounded label for a /v1 path (unknown paths must not blow up the label space)."""
    p = path.strip("/")
    if p.startswith("v1/"):
        p = p[3:]
    if p.startswith("models"):
        return "models"
    return p if p in KNOWN_ROUTES else "other"


class ServeMetrics:
    def __init__(self, tracker: stages.StartupTracker,
                 worker_status: Callable[[], list[dict]] | None = None,
                 gpu_uuids: Callable[[], list[str]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("turingbox_proxy_requests", "Requests answered on /v1/*, by route and status",
                                ["route", "code"], registry=r)
        self.latency = Histogram("turingbox_proxy_request_duration_seconds",
                                 "Time from request to the last byte sent to the client", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.first_byte = Histogram("turingbox_proxy_time_to_first_byte_seconds",
                                    "Time from request to the first body byte from vLLM (TTFT for streams)",
                                    ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("turingbox_proxy_overhead_seconds",
                                  "Time the sidecar spends before the request reaches vLLM", ["route"],
                                  buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
                                  registry=r)
        self.in_flight = Gauge("turingbox_proxy_in_flight_requests", "Requests being proxied now", registry=r)
        self.rejected = Counter("turingbox_proxy_rejected", "Requests refused by the sidecar, by reason",
                                ["reason"], registry=r)
        # serve/admission.py's limits: 400 (n, max_tokens, total_tokens), 429 (concurrency, per_key), 504 (timeout)
        self.admission_refused = Counter("turingbox_admission_refused",
                                         "Requests refused or cut off by the admission limits, by reason",
                                         ["reason"], registry=r)
        for reason in ADMISSION_REASONS:     # present from the start, so rate() and alerts see the first one
            self.admission_refused.labels(reason)
        self.upstream_errors = Counter("turingbox_upstream_errors", "Failures talking to vLLM, by kind",
                                       ["kind"], registry=r)
        # vLLM refuses a stream's request in its first event after a 200: the sidecar answers those as the 4xx
        self.stream_refusals = Counter("turingbox_proxy_stream_refusals",
                                       "Streams vLLM refused in their first event, answered as that HTTP error",
                                       registry=r)
        self.client_disconnects = Counter("turingbox_proxy_client_disconnects",
                                          "Requests whose client went away before the end (upstream cancelled)",
                                          registry=r)
        r.register(_StageCollector(tracker))
        if worker_status is not None:
            r.register(_WorkerCollector(worker_status))
        r.register(_GpuCollector(gpu_uuids or (lambda: [])))
        self.upstream = UpstreamMetrics(r)

    async def exposition(self, upstream_url: str | None = None, upstream_key: str | None = None) -> bytes:
        """The page for /metrics: turingbox's series, then vLLM's (when its base URL is given and it answers).

        vLLM is asked first so that a failed fetch is already counted on the page that lacks its series."""
        upstream = await self.upstream.fetch(upstream_url, upstream_key) if upstream_url else None
        own = generate_latest(self.registry)
        if not upstream:
            return own
        return own + without_families(upstream, exposed_families(own))


class _StageCollector(Collector):
    def __init__(self, tracker: stages.StartupTracker) -> None:
        self.tracker = tracker

    def collect(self) -> Iterable:
        t = self.tracker
        current = GaugeMetricFamily("turingbox_stage", "1 for the stage serve is in now", labels=["stage"])
        for s in stages.ORDER + stages.TERMINAL:
            current.add_metric([s], 1.0 if t.stage == s else 0.0)
        yield current
        durations = GaugeMetricFamily("turingbox_startup_stage_seconds",
                                      "Seconds each startup stage took (the current one so far)", labels=["stage"])
        for s, d in t.durations.items():
            durations.add_metric([s], d)
        if t.stage in stages.ORDER and t.stage != stages.READY:
            durations.add_metric([t.stage], t.durations.get(t.stage, 0.0) + t.stage_elapsed())
        yield durations
        yield GaugeMetricFamily("turingbox_ready", "1 when /health/ready answers 200",
                                value=1.0 if t.stage == stages.READY else 0.0)
        if t.ready_after_s is not None:
            yield GaugeMetricFamily("turingbox_startup_seconds", "Seconds from start to ready", value=t.ready_after_s)
            graphs = GaugeMetricFamily("turingbox_startup_vllm_graphs",
                                       "vLLM's torch.compile graphs at this start: loaded from the cache or compiled",
                                       labels=["source"])
            graphs.add_metric(["loaded"], t.graphs_loaded)
            graphs.add_metric(["compiled"], t.graphs_compiled)
            yield graphs
            yield GaugeMetricFamily("turingbox_startup_compile_cache_mismatch",
                                    "1 when the compile cache was a hit but vLLM compiled its graphs anyway",
                                    value=1.0 if t.compile_cache_missed else 0.0)


class _WorkerCollector(Collector):
    """Per-rank plugin status files: warmup results and JIT compiles seen after ready."""

    def __init__(self, worker_status: Callable[[], list[dict]]) -> None:
        self.worker_status = worker_status

    def collect(self) -> Iterable:
        try:
            workers = self.worker_status()
        except Exception as exc:      # a torn or missing file must not break the scrape
            log.debug("worker status unreadable: %s", exc)
            workers = []
        total = CounterMetricFamily("turingbox_jit_after_ready",
                                    "Kernel compilations after ready, all ranks and kernels (should stay 0)")
        by_kernel = CounterMetricFamily("turingbox_jit_after_ready_by_kernel",
                                        "Kernel compilations after ready, per rank and kernel", labels=["rank", "kernel"])
        kernels = GaugeMetricFamily("turingbox_warmup_kernels", "Kernels the plugin warmed, per rank", labels=["rank"])
        seconds = GaugeMetricFamily("turingbox_warmup_seconds", "Plugin warmup time, per rank", labels=["rank"])
        ok = GaugeMetricFamily("turingbox_warmup_ok", "1 when the rank's plugin warmup passed", labels=["rank"])
        n = 0
        for w in workers:
            rank = str(w.get("rank", "?"))
            for kernel, count in sorted((w.get("jit_after_ready") or {}).items()):
                by_kernel.add_metric([rank, str(kernel)], float(count))
                n += int(count)
            warm = w.get("warmup") or {}
            if "kernels" in warm:
                kernels.add_metric([rank], float(warm.get("kernels") or 0))
            if "seconds" in warm:
                seconds.add_metric([rank], float(warm.get("seconds") or 0.0))
            ok.add_metric([rank], 1.0 if warm.get("ok") else 0.0)
        total.add_metric([], float(n))
        yield from (total, by_kernel, kernels, seconds, ok)


class _GpuCollector(Collector):
    """GPU telemetry (gpus.inventory.NvmlTelemetry) when there is NVML; nothing (and no error) otherwise."""

    def __init__(self, gpu_uuids: Callable[[], list[str]], telemetry: NvmlTelemetry | None = None) -> None:
        self.gpu_uuids = gpu_uuids
        self.telemetry = telemetry or NvmlTelemetry()

    def collect(self) -> Iterable:
        samples = self.telemetry.sample(self.gpu_uuids())
        if not samples:
            return
        labels = ["index", "uuid"]
        util = GaugeMetricFamily("turingbox_gpu_utilization_ratio", "GPU busy fraction", labels=labels)
        mem = GaugeMetricFamily("turingbox_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("turingbox_gpu_memory_total_bytes", "GPU memory", labels=labels)
        temp = GaugeMetricFamily("turingbox_gpu_temperature_celsius", "GPU temperature", labels=labels)
        power = GaugeMetricFamily("turingbox_gpu_power_watts", "GPU power draw", labels=labels)
        for g in samples:
            key = [str(g.index), g.uuid]
            util.add_metric(key, g.utilization_ratio)
            mem.add_metric(key, g.memory_used_bytes)
            total.add_metric(key, g.memory_total_bytes)
            temp.add_metric(key, g.temperature_celsius)
            power.add_metric(key, g.power_watts)
        yield from (util, mem, total, temp, power)



# ---- vLLM's own /metrics, passed through ---------------------------------------------------------

# Prometheus' own scrape timeout defaults to 10 s: a slow vLLM costs the scrape at most this, and the
# turingbox series still come back (the endpoint picker of the Inference Gateway scrapes far more often).
UPSTREAM_SCRAPE_TIMEOUT_S = 2.0
UPSTREAM_MAX_BYTES = 16 * 1024 * 1024      # a real 0.21 page is ~60 KB; more means something is wrong
_ACCEPT = b"text/plain;version=0.0.4"      # what generate_latest writes: never mix OpenMetrics into it

# One line of the Prometheus text format 0.0.4: a comment, or `name{labels} value [timestamp]`.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABELS = r'\{(?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\.)*"\s*,?)*\s*\}'
_VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|Inf|inf|NaN|nan)"
_SAMPLE = re.compile(rf"({_NAME})\s*(?:{_LABELS})?\s+{_VALUE}(?:\s+-?[0-9]+)?\s*")
_HEADER = re.compile(rf"#\s+(HELP|TYPE)\s+({_NAME})(?:\s.*)?")
_TYPES = [[t] for t in ("counter", "gauge", "histogram", "summary", "untyped")]
_TYPE_LINE = re.compile(rb"^# TYPE (\S+) ", re.M)


class UpstreamError(Exception):
    """Why vLLM's page was not passed through; `reason` is the counter's label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class UpstreamMetrics:
    """Fetches vLLM's /metrics for one sidecar scrape; concurrent scrapes share one fetch."""

    REASONS = ("connect", "timeout", "status", "invalid", "too_large", "error")

    def __init__(self, registry: CollectorRegistry, timeout_s: float = UPSTREAM_SCRAPE_TIMEOUT_S,
                 max_bytes: int = UPSTREAM_MAX_BYTES) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.errors = Counter("turingbox_upstream_metrics_scrape_errors",
                              "Scrapes of /metrics that came without vLLM's own series, by reason", ["reason"],
                              registry=registry)
        for reason in self.REASONS:       # present from the start, so rate() and alerts see the first one
            self.errors.labels(reason)
        self.duration = Gauge("turingbox_upstream_metrics_scrape_duration_seconds",
                              "How long the last fetch of vLLM's /metrics took", registry=registry)
        self._inflight: asyncio.Future | None = None
        self._last_reason: str | None = None

    async def fetch(self, base_url: str, api_key: str | None = None) -> bytes | None:
        """vLLM's page, validated, or None (counted and logged once per change of reason)."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch_counted(base_url, api_key))
            self._inflight.add_done_callback(self._clear)
        # shield: a scraper that goes away must not cancel the fetch the others wait for
        return await asyncio.shield(self._inflight)

    def _clear(self, fut: asyncio.Future) -> None:
        if self._inflight is fut:
            self._inflight = None

    async def _fetch_counted(self, base_url: str, api_key: str | None) -> bytes | None:
        t0 = time.perf_counter()
        try:
            page = await asyncio.wait_for(self._get(base_url.rstrip("/") + "/metrics", api_key), self.timeout_s)
            validate_exposition(page)
        except UpstreamError as exc:
            return self._failed(exc.reason, str(exc))
        except (asyncio.TimeoutError, httpcore.TimeoutException):
            return self._failed("timeout", f"no answer within {self.timeout_s:g} s")
        except (httpcore.ConnectError, ConnectionRefusedError) as exc:
            return self._failed("connect", f"cannot connect ({exc})")
        except (httpcore.NetworkError, httpcore.ProtocolError, OSError) as exc:
            return self._failed("error", f"{type(exc).__name__}: {exc}")
        finally:
            self.duration.set(time.perf_counter() - t0)
        if self._last_reason is not None:
            log.info("vLLM's /metrics answers again: its series are back on /metrics")
            self._last_reason = None
        return page

    def _failed(self, reason: str, detail: str) -> None:
        self.errors.labels(reason).inc()
        if reason != self._last_reason:    # a scrape every few seconds must not flood the log
            log.warning("vLLM's /metrics not passed through (%s): %s; serving turingbox's series alone",
                        reason, detail)
            self._last_reason = reason
        return None

    async def _get(self, url: str, api_key: str | None) -> bytes:
        headers = [(b"accept", _ACCEPT), (b"accept-encoding", b"identity")]
        if api_key:                       # vLLM 0.21 leaves /metrics open, but a key it was given is harmless
            headers.append((b"authorization", b"Bearer " + api_key.encode()))
        t = self.timeout_s
        ext = {"timeout": {"connect": t, "read": t, "write": t, "pool": t}}
        # A connection of its own per fetch: a scrape every few seconds does not need the proxy's pool, and
        # must never reuse a connection vLLM is closing (see the proxy's retry notes).
        async with httpcore.AsyncConnectionPool(max_connections=1, max_keepalive_connections=0) as pool:
            async with pool.stream("GET", url, headers=headers, extensions=ext) as resp:
                if resp.status != 200:
                    raise UpstreamError("status", f"HTTP {resp.status}")
                ctype = b""
                for k, v in resp.headers:
                    if k.lower() == b"content-type":
                        ctype = v.lower()
                if not ctype.startswith(b"text/plain"):
                    raise UpstreamError("invalid", f"content type {ctype.decode('latin-1') or 'missing'}")
                body = bytearray()
                async for chunk in resp.aiter_stream():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise UpstreamError("too_large", f"over {self.max_bytes} bytes")
        return bytes(body)


def validate_exposition(page: bytes) -> None:
    """Refuse a page that would make Prometheus reject the whole scrape (turingbox's series with it)."""
    if page and not page.endswith(b"\n"):
        raise UpstreamError("invalid", "page does not end with a newline (cut off?)")
    try:
        text = page.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UpstreamError("invalid", f"not UTF-8 ({exc})") from None
    for n, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line.startswith(("# HELP ", "# TYPE ")):
            m = _HEADER.fullmatch(line)
            if m is None or m.group(1) == "TYPE" and line.split()[3:] not in _TYPES:
                raise UpstreamError("invalid", f"line {n}: malformed {line[2:6]} line {line[:80]!r}")
        elif not line.startswith("#") and not _SAMPLE.fullmatch(line):
            raise UpstreamError("invalid", f"line {n}: not a sample {line[:80]!r}")


def exposed_families(page: bytes) -> set[str]:
    """The family names a page declares with # TYPE."""
    return {m.decode() for m in _TYPE_LINE.findall(page)}


def without_families(page: bytes, taken: set[str]) -> bytes:
    """`page` less the families named in `taken` and less any family it declares twice (first one kept).

    A family is its # HELP/# TYPE header and the samples after it, up to the next header of another name."""
    out: list[str] = []
    seen: set[str] = set()
    current: str | None = None
    keep = True
    for line in page.decode("utf-8").splitlines():
        m = _HEADER.fullmatch(line) if line.startswith("# ") else None
        if m:
            name = m.group(2)
            if name != current:
                current = name
                keep = name not in taken and name not in seen
                seen.add(name)
        elif line.startswith("#"):
            continue                     # other comments (the fixture's provenance line) carry nothing
        if keep and line:
            out.append(line)
    return ("\n".join(out) + "\n").encode() if out else b""
