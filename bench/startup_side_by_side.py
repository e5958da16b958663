#!/usr/bin/env python3
"""Two recorded starts, step by step, in one PNG: a `turingbox serve` log and a plain `vllm serve` log (issue 18).

Each log is read by bench/startup_timeline.py. Matching steps share a row, so a step that only one of the
two runs has (turingbox's own, or a recompile) shows as a single bar. Each run's bars start at its own t0.
The harness's start time and ready time are passed for both runs: plain vLLM's log says neither.

  python3 bench/startup_side_by_side.py \
      --a docs/data/2026-12-02-h200-s8/turingbox-soak64.log.gz --a-t0 "2026-12-02 04:53:09.92" --a-ready-s 107.9 \
      --b docs/data/2026-12-02-h200-s8/plain-soak64.log.gz --b-t0 "2026-12-02 05:06:37.4" --b-ready-s 113.6 \
      --png docs/img/startup-s8-side-by-side.png
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import startup_timeline  # noqa: E402  (bench/ is not a package)

# A run's own caveats go in --caption (session 8's: docs/startup.md); the default says only what holds for every run.
CAPTION = "vLLM's own lines carry whole seconds: each step is known to about 1 s."


def read(path: str, t0: str | None, ready_s: float | None) -> dict:
    with startup_timeline.open_log(path) as f:
        return startup_timeline.parse(f.readlines(), t0, ready_s)


def rows(a: dict, b: dict) -> list[str]:
    """Step names in start order, the two runs merged (a step of one run only keeps its place)."""
    order: list[str] = []
    for run in (a, b):
        prev = None
        for s in run["steps"]:
            name = s["step"]
            if name not in order:
                order.insert(order.index(prev) + 1 if prev in order else len(order), name)
            prev = name
    return order


def chart(a: dict, b: dict, labels: tuple[str, str], path: str, title: str, caption: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = rows(a, b)
    colors = ("#4c72b0", "#dd8452")
    fig, ax = plt.subplots(figsize=(13, 0.55 * len(names) + 2.6))
    for r, (run, color, off) in enumerate(zip((a, b), colors, (-0.19, 0.19))):
        for s in run["steps"]:
            y = names.index(s["step"]) + off
            ax.barh(y, max(s["seconds"], 0.3), left=s["start_s"], height=0.36, color=color)
            ax.text(s["start_s"] + max(s["seconds"], 0.3) + 0.6, y, f'{s["seconds"]:.1f} s', va="center", fontsize=7)
        ax.axvline(run["ready_s"], color=color, ls="--", lw=1)
        last = run["ready_s"] == max(a["ready_s"], b["ready_s"])     # the later line's label goes left of it
        ax.text(run["ready_s"] + (-0.6 if last else 0.6), -0.9 + 0.45 * r, f'{labels[r]}: ready {run["ready_s"]:.1f} s',
                color=color, fontsize=8, va="center", ha="right" if last else "left")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -1.2)
    ax.set_xlim(0, max(a["ready_s"], b["ready_s"]) * 1.25)
    ax.set_xlabel("seconds since the process was started (harness clock)")
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=l) for c, l in zip(colors, labels)], loc="center right", fontsize=8)
    fig.text(0.01, 0.01, caption, fontsize=7.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k in ("a", "b"):
        ap.add_argument(f"--{k}", required=True, help=f"log {k} (.log or .log.gz)")
        ap.add_argument(f"--{k}-t0", help="when the harness started it ('2026-12-02 05:06:37.4')")
        ap.add_argument(f"--{k}-ready-s", type=float, help="seconds from t0 to ready, harness-measured")
        ap.add_argument(f"--{k}-label", default="turingbox serve" if k == "a" else "plain vllm serve")
    ap.add_argument("--png", required=True)
    ap.add_argument("--title", default="Time to ready by step, turingbox vs plain vLLM")
    ap.add_argument("--caption", default=CAPTION)
    x = ap.parse_args(argv)
    a = read(x.a, x.a_t0, x.a_ready_s)
    b = read(x.b, x.b_t0, x.b_ready_s)
    chart(a, b, (x.a_label, x.b_label), x.png, x.title, x.caption)
    for label, run in ((x.a_label, a), (x.b_label, b)):
        print(f"{label}: ready {run['ready_s']} s" + (" (recompiled)" if run["recompiled"] else ""))
        for s in run["steps"]:
            print(f'  {s["start_s"]:7.1f} {s["seconds"]:6.1f}  {s["process"]:<10} {s["step"]}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
