"""The startup state machine: which stage serve is in, how long each took, and what is left.

Stages move forward only. vLLM's own log lines move it through loading, compiling and capturing
(substrings picked from vLLM 0.21.0's messages, see LOG_STAGE_PATTERNS); serve itself moves it
through planning, downloading (a Hugging Face id whose files the models volume lacks; skipped
otherwise), starting, warming and ready. Draining and failed are terminal.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

PLANNING = "planning"      # inventory + plan (+ demo model build, a hub model's config.json)
DOWNLOADING = "downloading"  # a hub model's files into the models volume (turingbox.model.hub), with progress
STARTING = "starting"      # cache preparation, vLLM import, tokenizer, engine process start
LOADING = "loading"        # weights
COMPILING = "compiling"    # torch.compile / compile-cache load, memory profiling, KV cache allocation
CAPTURING = "capturing"    # CUDA graph capture, engine init end, API server start
WARMING = "warming"        # upstream answers; active warmup and plugin status check
READY = "ready"
DRAINING = "draining"
FAILED = "failed"

ORDER = (PLANNING, DOWNLOADING, STARTING, LOADING, COMPILING, CAPTURING, WARMING, READY)
TERMINAL = (DRAINING, FAILED)

# vLLM 0.21.0's line per torch.compile'd graph (the model, then MTP's drafter): compiled now, or loaded from its
# compile cache. On a cache hit every graph should load; one compiled means vLLM's compile key moved.
GRAPH_COMPILED = "Compiling a graph for compile range"
GRAPH_LOADED = "Directly load the compiled graph"

# Substrings of vLLM 0.21.0 log lines (vllm/v1/worker/gpu_model_runner.py, compilation/*.py,
# model_executor/model_loader/*.py, v1/engine/core.py). Checked in order; the first match wins.
# Several per stage so a reworded message or a skipped step (eager mode, AOT cache hit) still
# moves the stage on.
LOG_STAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("Capturing CUDA graphs", CAPTURING),                 # tqdm description in capture_model
    ("Capturing model for Eagle", CAPTURING),
    ("Graph capturing finished", CAPTURING),
    ("init engine (profile, create kv cache, warmup model) took", CAPTURING),
    ("Dynamo bytecode transform time", COMPILING),
    (GRAPH_COMPILED, COMPILING),
    (GRAPH_LOADED, COMPILING),
    ("Directly load AOT compilation", COMPILING),
    ("torch.compile took", COMPILING),                     # monitor_torch_compile
    ("torch.compile and initial profiling/warmup", COMPILING),
    ("for vLLM's torch.compile", COMPILING),              # "Using cache directory: ... for vLLM's torch.compile"
    ("Initial profiling/warmup run took", COMPILING),
    ("Model loading took", COMPILING),                    # weights done: profiling/compile is next
    ("Available KV cache memory", COMPILING),
    ("GPU KV cache size", COMPILING),
    ("Starting to load model", LOADING),
    ("Loading model from scratch", LOADING),
    ("Loading weights", LOADING),
    ("Loading safetensors checkpoint shards", LOADING),
    ("Loading drafter model", LOADING),
)

# Typical stage lengths in seconds (DESIGN: warm start ~78 s, empty caches ~384 s on an H200).
# Used only for the estimate shown while starting; the cache status picks warm or cold. Downloading has
# no typical length: while it runs, its estimate comes from the bytes left and this run's rate.
TYPICAL_SECONDS = {
    "warm": {PLANNING: 2, STARTING: 45, LOADING: 10, COMPILING: 15, CAPTURING: 10, WARMING: 10},
    "cold": {PLANNING: 2, STARTING: 45, LOADING: 30, COMPILING: 300, CAPTURING: 30, WARMING: 30},
}


# What /health/ready says while a stage is in progress (a failure states its own reason).
DESCRIPTIONS = {
    PLANNING: "turingbox is reading the GPUs and planning the engine settings.",
    DOWNLOADING: "turingbox is downloading the model from the Hugging Face hub into the models volume.",
    STARTING: "vLLM is starting (caches, imports, tokenizer, engine processes).",
    LOADING: "vLLM is loading the model weights.",
    COMPILING: "vLLM is compiling the model and profiling memory.",
    CAPTURING: "vLLM is capturing CUDA graphs and starting its API server.",
    WARMING: "turingbox is warming the engine with real requests and checking the workers.",
    READY: "ready.",
    DRAINING: "turingbox is draining: no new requests are accepted.",
}


def compile_cache_missed(profile: str, graphs_compiled: int) -> bool:
    """The compile caches were a hit ("warm"), but vLLM compiled graphs while starting (its compile key moved)."""
    return profile == "warm" and graphs_compiled > 0


def compile_cache_warning(profile: str, graphs_compiled: int, graphs_loaded: int, entry: str | None,
                          cache_disabled: bool = False) -> str | None:
    """One sentence when the compile caches were a hit but vLLM compiled its graphs anyway, else None.
    cache_disabled: VLLM_DISABLE_COMPILE_CACHE is set in vLLM's environment (then it compiles every start)."""
    if not compile_cache_missed(profile, graphs_compiled):
        return None
    if cache_disabled:
        return (f"VLLM_DISABLE_COMPILE_CACHE is set, so vLLM compiled {graphs_compiled} torch.compile graph(s) instead "
                f"of loading them from the cache; unset it to start from the cache.")
    where = f" in {entry}" if entry else ""
    return (f"the compile cache was a hit, but vLLM compiled {graphs_compiled} torch.compile graph(s) and loaded "
            f"{graphs_loaded}: its compile key differs from the run that filled the cache (compare the "
            f"cache_key_factors.json files under vllm/torch_compile_cache{where}); every start pays this "
            f"compile until the key matches again.")


def download_reason(progress: dict) -> str:
    """/health/ready's reason while downloading, with the numbers (progress: turingbox.model.hub.Progress.to_dict())."""
    rate = progress.get("bytes_per_s")
    return (f"turingbox is downloading {progress.get('model')} from the Hugging Face hub into the models volume: "
            f"{progress.get('percent', 0.0):.0f}% ({progress.get('bytes', 0) / 2**30:.2f} of "
            f"{progress.get('total_bytes', 0) / 2**30:.2f} GiB, {progress.get('files', 0)} of "
            f"{progress.get('total_files', 0)} files" + (f", {rate / 1e6:.1f} MB/s)." if rate else ")."))


def download_seconds_left(progress: dict | None) -> float | None:
    """Bytes left at this run's rate, or None before bytes arrived."""
    if not progress or not progress.get("bytes_per_s"):
        return None
    return max(0.0, (progress["total_bytes"] - progress["bytes"]) / progress["bytes_per_s"])


def stage_from_log_line(line: str) -> str | None:
    """The stage a vLLM log line announces, or None."""
    for needle, stage in LOG_STAGE_PATTERNS:
        if needle in line:
            return stage
    return None


def estimate_remaining(stage: str, seconds_in_stage: float, typical: dict[str, float],
                       rest_of_stage: float | None = None) -> float:
    """Seconds left until ready: the rest of this stage (at least 1 s; rest_of_stage when known, e.g. a
    download's bytes left at its rate) plus every later stage."""
    if stage not in ORDER or stage == READY:
        return 0.0
    i = ORDER.index(stage)
    if rest_of_stage is None:
        rest_of_stage = typical.get(stage, 0.0) - seconds_in_stage
    rest_of_stage = max(rest_of_stage, 1.0)
    return rest_of_stage + sum(typical.get(s, 0.0) for s in ORDER[i + 1:] if s != READY)


@dataclass
class StartupTracker:
    """Current stage, when it began, the closed stages' durations and the failure reason."""

    clock: Callable[[], float] = time.monotonic
    started_at: float = 0.0
    stage: str = PLANNING
    stage_started_at: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    profile: str = "cold"              # "warm" when the compile caches were found
    ready_after_s: float | None = None
    on_change: Callable[[str, str], None] | None = None
    graphs_compiled: int = 0           # vLLM's torch.compile graphs while starting: compiled / loaded from cache
    graphs_loaded: int = 0
    # while downloading: turingbox.model.hub.Progress.to_dict(), replaced whole by the download thread
    download: dict | None = None

    def __post_init__(self) -> None:
        now = self.clock()
        self.started_at = self.started_at or now
        self.stage_started_at = self.stage_started_at or now

    @property
    def compile_cache_missed(self) -> bool:
        return compile_cache_missed(self.profile, self.graphs_compiled)

    @property
    def finished(self) -> bool:
        return self.stage in (READY,) + TERMINAL

    def advance(self, stage: str, reason: str | None = None) -> bool:
        """Move to a later stage (never back; terminal stages stay). Returns whether it moved."""
        if self.stage in TERMINAL:
            return False
        if stage in ORDER and self.stage in ORDER and ORDER.index(stage) <= ORDER.index(self.stage):
            return False
        now = self.clock()
        if self.stage in ORDER and self.stage != READY:
            self.durations[self.stage] = self.durations.get(self.stage, 0.0) + now - self.stage_started_at
        old, self.stage, self.stage_started_at = self.stage, stage, now
        if reason is not None:
            self.reason = reason
        if stage == READY:
            self.ready_after_s = now - self.started_at
            self.reason = None
        if self.on_change:
            self.on_change(old, stage)
        return True

    def observe_log_line(self, line: str) -> None:
        """Move on when a vLLM log line announces a later stage (only while vLLM is starting)."""
        if self.stage not in (STARTING, LOADING, COMPILING, CAPTURING):
            return
        self.graphs_compiled += GRAPH_COMPILED in line
        self.graphs_loaded += GRAPH_LOADED in line
        stage = stage_from_log_line(line)
        if stage is not None:
            self.advance(stage)

    def fail(self, reason: str) -> None:
        self.advance(FAILED, reason)

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def stage_elapsed(self) -> float:
        return self.clock() - self.stage_started_at

    def estimate(self) -> float | None:
        """Seconds until ready, or None when it will not become ready."""
        if self.stage in TERMINAL:
            return None
        rest = download_seconds_left(self.download) if self.stage == DOWNLOADING else None
        return round(estimate_remaining(self.stage, self.stage_elapsed(), TYPICAL_SECONDS[self.profile], rest), 1)

    def snapshot(self) -> dict:
        body = {
            "stage": self.stage,
            "elapsed_s": round(self.elapsed(), 1),
            "stage_elapsed_s": round(self.stage_elapsed(), 1),
            "estimate_s": self.estimate(),
            "reason": self.reason or DESCRIPTIONS.get(self.stage),
        }
        download = self.download
        if self.stage == DOWNLOADING and download:
            body["progress"] = dict(download)
            if not self.reason:
                body["reason"] = download_reason(download)
        return body
