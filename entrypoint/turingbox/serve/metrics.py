"""Prometheus metrics of the sidecar, in a registry of its own.

Proxy metrics are updated as requests pass; stage, worker (plugin) and GPU metrics are read at
scrape time by collectors, so they never go stale and cost nothing between scrapes.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from turingbox.serve import stages

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
        self.upstream_errors = Counter("turingbox_upstream_errors", "Failures talking to vLLM, by kind",
                                       ["kind"], registry=r)
        self.client_disconnects = Counter("turingbox_proxy_client_disconnects",
                                          "Requests whose client went away before the end (upstream cancelled)",
                                          registry=r)
        r.register(_StageCollector(tracker))
        if worker_status is not None:
            r.register(_WorkerCollector(worker_status))
        r.register(_GpuCollector(gpu_uuids or (lambda: [])))


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
    """GPU telemetry through NVML when there is one; nothing (and no error) otherwise."""

    def __init__(self, gpu_uuids: Callable[[], list[str]]) -> None:
        self.gpu_uuids = gpu_uuids
        self._nvml = None
        self._unavailable = False

    def _init(self):
        if self._nvml is None and not self._unavailable:
            try:
                import pynvml
                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as exc:
                self._unavailable = True
                log.info("GPU telemetry off: NVML is not available (%s)", exc)
        return self._nvml

    def collect(self) -> Iterable:
        nv = self._init()
        if nv is None:
            return
        wanted = set(self.gpu_uuids())
        util = GaugeMetricFamily("turingbox_gpu_utilization_ratio", "GPU busy fraction", labels=["index", "uuid"])
        mem = GaugeMetricFamily("turingbox_gpu_memory_used_bytes", "GPU memory in use", labels=["index", "uuid"])
        total = GaugeMetricFamily("turingbox_gpu_memory_total_bytes", "GPU memory", labels=["index", "uuid"])
        temp = GaugeMetricFamily("turingbox_gpu_temperature_celsius", "GPU temperature", labels=["index", "uuid"])
        power = GaugeMetricFamily("turingbox_gpu_power_watts", "GPU power draw", labels=["index", "uuid"])
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception:
            return
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = nv.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                if wanted and uuid not in wanted:
                    continue
                labels = [str(i), uuid]
                m = nv.nvmlDeviceGetMemoryInfo(h)
                mem.add_metric(labels, float(m.used))
                total.add_metric(labels, float(m.total))
                util.add_metric(labels, nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
                temp.add_metric(labels, float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
                power.add_metric(labels, nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            except Exception:       # one odd device (or a field it lacks) must not hide the others
                continue
        yield from (util, mem, total, temp, power)


def gpu_uuids_of(plan: dict | None) -> list[str]:
    return [g for g in (plan or {}).get("gpus", []) if isinstance(g, str)] if plan else []

