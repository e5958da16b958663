#!/usr/bin/env python3
"""Where the seconds of one start went, read from a recorded `turingbox serve` log (issue 18's profile).

The sidecar's lines carry milliseconds; vLLM's carry whole seconds ("INFO 12-02 02:29:49"), so each step is
known to about a second. Steps are the gaps between milestones that vLLM 0.21 and turingbox print in every
start; a milestone missing from the log (another vLLM version) leaves its step out rather than guessing.

  python3 bench/startup_timeline.py docs/data/2026-12-02-h200-s7/turingbox-soak64.log.gz \
      --json docs/data/2026-12-02-h200-s7/startup-timeline-soak64.json --png docs/img/startup-timeline-s7.png
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

# (step name ending at this milestone, process, pattern); in the order a start prints them
MILESTONES = [
    ("planning (turingbox)", "sidecar", r"starting vLLM: "),
    ("vLLM CLI + API-server imports", "APIServer", r"non-default args"),
    ("API server: model config, processor + tokenizer", "APIServer", r"running in text-only mode|registry\.py"),
    ("engine-core process spawn + imports", "EngineCore", r"Initializing a V1 LLM engine"),
    ("engine core: processor + tokenizer again", "EngineCore", r"running in text-only mode|registry\.py"),
    ("distributed init, sampler", "EngineCore", r"Starting to load model"),
    ("weights (dummy) + drafter", "EngineCore", r"Model loading took"),
    ("torch.compile from the cache (model + drafter)", "EngineCore", r"torch\.compile took .* in total"),
    ("KV cache profiling", "EngineCore", r"Available KV cache memory"),
    ("CUDA graph capture", "EngineCore", r"Graph capturing finished"),
    ("strict warmup (plugin)", "EngineCore", r"turingbox warmup: \d+ kernels"),
    ("active warmup + checks (turingbox)", "sidecar", r"stage: warming -> ready"),
]


def parse(lines: list[str]) -> dict:
    year = None
    events: list[tuple[float, str, str]] = []   # (epoch seconds, process, text)
    for line in lines:
        m = SIDECAR.match(line)
        if m:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            year = t.year
            events.append((t.timestamp(), "sidecar", line))
            continue
        m = VLLM.match(line)
        if m and year:
            t = dt.datetime.strptime(f"{year}-{m.group(2)}", "%Y-%m-%d %H:%M:%S")
            events.append((t.timestamp(), m.group(1), line))
    if not events:
        print("startup_timeline: no timestamped turingbox/vLLM lines in the log.", file=sys.stderr)
        raise SystemExit(2)
    t0 = events[0][0]
    steps, last, i = [], t0, 0
    for name, proc, pat in MILESTONES:
        rx = re.compile(pat)
        for j in range(i, len(events)):
            t, p, text = events[j]
            if p == proc and rx.search(text):
                if name.startswith("torch.compile"):   # the model's, then the drafter's: the step ends at the last one
                    k = next((k for k in range(j + 1, len(events)) if events[k][1] == proc
                              and rx.search(events[k][2])), None)
                    if k is not None and not any(re.search(r"Available KV cache", e[2]) for e in events[j:k]):
                        j, t = k, events[k][0]
                steps.append({"step": name, "process": proc, "start_s": round(last - t0, 1),
                              "seconds": round(t - last, 1)})
                last, i = t, j + 1
                break
    return {"t0": dt.datetime.fromtimestamp(t0).isoformat(), "ready_s": round(last - t0, 1), "steps": steps}


def chart(result: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"sidecar": "#4c72b0", "APIServer": "#dd8452", "EngineCore": "#55a868"}
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
    names = {"sidecar": "turingbox", "APIServer": "vLLM API server", "EngineCore": "vLLM engine core"}
    ax.legend(handles=[Patch(color=c, label=names[p]) for p, c in colors.items()], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a turingbox serve log (.log or .log.gz)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    opener = gzip.open if a.log.endswith(".gz") else open
    with opener(a.log, "rt", errors="replace") as f:
        result = parse(f.readlines())
    result["log"] = a.log
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.png:
        chart(result, a.png, a.title or f"turingbox serve, {result['t0']}: ready in {result['ready_s']} s")
    for s in result["steps"]:
        print(f'{s["start_s"]:7.1f} {s["seconds"]:6.1f}  {s["process"]:<10} {s["step"]}')
    print(f'{result["ready_s"]:7.1f}         ready')
    return 0


if __name__ == "__main__":
    sys.exit(main())
