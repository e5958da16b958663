#!/usr/bin/env python3
"""Where the seconds of one start went, read from a recorded `turingbox serve` log (issue 18's profile).

The sidecar's lines carry milliseconds; vLLM's carry whole seconds ("INFO 12-02 02:29:49"), so each step is
known to about a second. Steps are the gaps between milestones that vLLM 0.21 and turingbox print in every
start; a milestone missing from the log (another vLLM version) leaves its step out rather than guessing.

  python3 bench/startup_timeline.py docs/data/2026-12-02-h200-s7/turingbox-soak64.log.gz \
      --json docs/data/2026-12-02-h200-s7/startup-timeline-soak64.json --png docs/img/startup-timeline-s7.png

A plain `vllm serve` log has no sidecar lines to give the year and the start: pass --t0 (when the harness
started the process) and --ready-s (when the harness saw it ready); the same two put the sidecar's own
start-up (Python and its imports, before its first line) into a turingbox log's first step.
Two logs side by side, one PNG (see bench/startup_side_by_side.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import re
import sys

SIDECAR = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
VLLM = re.compile(r"^\((APIServer|EngineCore)[^)]*\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) ")
# bench/startup.py --copy-logs: each line prefixed with the seconds since the harness started the process (ms)
OFFSET = re.compile(r"^\s*(\d+\.\d+) (.*)$", re.S)

# (step name ending at this milestone, process, pattern); in the order a start prints them
# The two "registry.py" steps were named "processor + tokenizer" until session 8: with every multimodal limit at 0
# no HF processor is built; the ~9 s are the tokenizer (~2 s) and importing the model module (qwen3_5, FLA),
# in the engine core after the worker's own imports (research report of session 8, docs/startup.md).
MILESTONES = [
    ("sidecar Python start + imports (turingbox)", "sidecar", r"sidecar listening"),
    ("planning (turingbox)", "sidecar", r"starting vLLM: "),
    ("vLLM CLI + API-server imports", "APIServer", r"non-default args"),
    # ~0 s when the cache entry holds vLLM's model infos, 44-66 s of subprocess imports when not (docs/startup.md)
    ("API server: model-class inspection (subprocesses without cached model infos)", "APIServer",
     r"Resolved architecture"),
    ("API server: config, tokenizer + model-module import", "APIServer", r"running in text-only mode|registry\.py"),
    ("engine-core process spawn + imports", "EngineCore", r"Initializing a V1 LLM engine"),
    ("engine core: worker + model-module imports, tokenizer", "EngineCore",
     r"running in text-only mode|registry\.py"),
    ("distributed init, sampler", "EngineCore", r"Starting to load model"),
    ("weights (dummy) + drafter", "EngineCore", r"Model loading took"),
    ("torch.compile from the cache (model + drafter)", "EngineCore", r"torch\.compile took .* in total"),
    # given --kv-cache-memory-bytes (the size its cache entry recorded), vLLM skips the profile and says so instead
    ("KV cache profiling", "EngineCore", r"Available KV cache memory|as specified by kv_cache_memory_bytes config"),
    ("CUDA graph capture", "EngineCore", r"Graph capturing finished"),
    ("strict warmup (plugin)", "EngineCore", r"turingbox warmup: \d+ kernels"),
    ("engine handshake, API server routes + chat template", "APIServer", r"Starting vLLM server on"),
    ("active warmup + checks (turingbox)", "sidecar", r"stage: warming -> ready"),
]
# Milestones printed once for the model and once for the MTP drafter.
ENDS_AT_LAST = {"API server: model-class inspection (subprocesses without cached model infos)",
                "torch.compile from the cache (model + drafter)"}
RECOMPILED = re.compile(r"Compiling a graph for compile range|saved AOT compiled function")


def open_log(path: str):
    """A recorded log, plain or gzipped, as text (the bench tools read .log and .log.gz alike)."""
    # newline="\n": a progress bar's "\r" redraws stay inside their line (and behind its harness offset)
    return (gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace", newline="\n")


def parse(lines: list[str], t0: str | None = None, ready_s: float | None = None) -> dict:
    """Steps of one start. t0 ("2026-12-02 05:06:37.4"): when the process was started, if the log does not
    say (plain vLLM); ready_s: seconds from t0 to ready as the harness measured it (adds a last step)."""
    start = dt.datetime.fromisoformat(t0) if t0 else None
    year = start.year if start else None
    events: list[tuple[float, str, str, int]] = []   # (epoch seconds, process, text, line index)
    first = next((line for line in lines if line.strip()), "")
    offsets = OFFSET.match(first) is not None       # bench/startup.py --copy-logs stamps every line it copies
    for n, line in enumerate(lines):
        offset = None
        if offsets:                                   # the harness' clock: ms, where vLLM's lines carry whole seconds
            o = OFFSET.match(line)
            if not o:
                continue                              # one clock per log: a line without the offset has no time
            offset, line = float(o.group(1)), o.group(2)
        m = SIDECAR.match(line)
        if m:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            year = t.year
            events.append((t.timestamp() if offset is None else offset, "sidecar", line, n))
            continue
        m = VLLM.match(line)
        if m and offset is not None:
            events.append((offset, m.group(1), line, n))
        elif m and year:
            t = dt.datetime.strptime(f"{year}-{m.group(2)}", "%Y-%m-%d %H:%M:%S")
            events.append((t.timestamp(), m.group(1), line, n))
    if not events:
        print("startup_timeline: no timestamped turingbox/vLLM lines in the log.", file=sys.stderr)
        raise SystemExit(2)
    t_start = 0.0 if offsets else start.timestamp() if start else events[0][0]
    recompiled = any(RECOMPILED.search(e[2]) for e in events)
    steps, last, i = [], t_start, 0
    for idx, (name, proc, pat) in enumerate(MILESTONES):
        rx = re.compile(pat)
        for j in range(i, len(events)):
            t, p, text, n = events[j]
            if p == proc and rx.search(text):
                if name in ENDS_AT_LAST:   # the model's line, then the drafter's: the step ends at the last one
                    j = _last_before_next_milestone(events, j, proc, rx, MILESTONES[idx + 1:])
                    t, n = events[j][0], events[j][3]
                if name.startswith("torch.compile") and recompiled:
                    name = "torch.compile, recompiled: cache miss (model + drafter)"
                if j == 0 and not start and not offsets:   # the log's first line starts the clock: no step before it
                    last, i = t, j + 1
                    break
                steps.append({"step": name, "process": proc, "start_s": round(last - t_start, 1),
                              "seconds": round(t - last, 1), "end_line": n + 1})
                last, i = t, j + 1
                break
    if ready_s is not None and t_start + ready_s > last:
        steps.append({"step": "until the harness saw ready", "process": "harness", "start_s": round(last - t_start, 1),
                      "seconds": round(t_start + ready_s - last, 1), "end_line": None})
        last = t_start + ready_s
    when = None if offsets else dt.datetime.fromtimestamp(t_start).isoformat()   # offsets: the harness knew when
    return {"t0": when, "ready_s": round(last - t_start, 1),
            "recompiled": recompiled, "steps": steps}


def _last_before_next_milestone(events: list, j: int, proc: str, rx: re.Pattern, following: list) -> int:
    """Index of the last event of `proc` matching rx from j on, before the first event of any later milestone
    (the next one may be absent from a log: a plain vLLM's, or a cut-short start)."""
    later = [(p, re.compile(pat)) for _name, p, pat in following]
    last = j
    for k in range(j + 1, len(events)):
        if any(events[k][1] == p and r.search(events[k][2]) for p, r in later):
            break
        if events[k][1] == proc and rx.search(events[k][2]):
            last = k
    return last


def chart(result: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"sidecar": "#4c72b0", "APIServer": "#dd8452", "EngineCore": "#55a868", "harness": "#8c8c8c"}
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(result["steps"]) + 1.4))
    for n, s in enumerate(result["steps"]):
        ax.barh(n, s["seconds"], left=s["start_s"], color=colors[s["process"]])
        ax.text(s["start_s"] + s["seconds"] + 0.8, n, f'{s["step"]}  {s["seconds"]:.0f} s', va="center", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since turingbox serve started")
    ax.set_xlim(0, result["ready_s"] * 1.45)
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch
    names = {"sidecar": "turingbox", "APIServer": "vLLM API server", "EngineCore": "vLLM engine core",
             "harness": "harness"}
    ax.legend(handles=[Patch(color=c, label=names[p]) for p, c in colors.items()], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a turingbox serve log (.log or .log.gz)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--title", default="")
    ap.add_argument("--t0", help="when the process was started, e.g. '2026-12-02 05:06:37.4' (plain vLLM logs)")
    ap.add_argument("--ready-s", type=float, help="seconds from --t0 to ready, as the harness measured it")
    a = ap.parse_args(argv)
    with open_log(a.log) as f:
        result = parse(f.readlines(), a.t0, a.ready_s)
    result["log"] = a.log
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.png:
        chart(result, a.png, a.title or f"turingbox serve{', ' + result['t0'] if result['t0'] else ''}: ready in "
                                        f"{result['ready_s']} s")
    for s in result["steps"]:
        print(f'{s["start_s"]:7.1f} {s["seconds"]:6.1f}  {s["process"]:<10} {s["step"]}')
    print(f'{result["ready_s"]:7.1f}         ready')
    return 0


if __name__ == "__main__":
    sys.exit(main())
