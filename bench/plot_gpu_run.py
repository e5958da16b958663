#!/usr/bin/env python3
"""Charts for docs/benchmarks.md from one GPU run's records (docs/data/<run>/).

Reads the side-by-side JSON of the cold phase and the stage lines of the serve/vLLM logs (the seeded
phase's JSON was not written: the device time ran out during its benchmarks, so its ready times come
from the logs, which carry every stage with a timestamp).

  python3 bench/plot_gpu_run.py docs/data/2026-11-30-h200x2 docs/img
"""
from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGE_RE = re.compile(r"ready after ([\d.]+) s \(stages: ([^;)]*)")   # then "; vLLM graphs: ..." (session 11 on)


def turingbox_stages(log_path: str) -> tuple[float, dict[str, float]]:
    m = STAGE_RE.search(open(log_path, errors="replace").read())
    if not m:
        raise SystemExit(f"{log_path}: no 'ready after' line")
    stages = {k: float(v.rstrip(" s")) for k, v in (p.split(" ", 1) for p in m.group(2).split(", "))}
    return float(m.group(1)), stages


def _stamp(line: str) -> datetime:
    return datetime.strptime("2026 " + re.search(r"(\d\d-\d\d \d\d:\d\d:\d\d)", line).group(1), "%Y %m-%d %H:%M:%S")


def plain_ready(plain_log: str, tb_log: str) -> float:
    """Seconds from launch to vLLM's routes being served; both servers were launched together with
    turingbox's sidecar, whose first line carries the launch time."""
    tb_first = next(l for l in open(tb_log, errors="replace") if "turingbox.serve: sidecar listening" in l)
    launched = datetime.strptime(tb_first[:19], "%Y-%m-%d %H:%M:%S")
    routes = [l for l in open(plain_log, errors="replace") if "Route: /metrics" in l]
    return (_stamp(routes[-1]) - launched).total_seconds()


def main(run_dir: str, img_dir: str) -> None:
    os.makedirs(img_dir, exist_ok=True)
    rows = []
    for phase in ("cold", "seeded"):
        tb_log = os.path.join(run_dir, f"turingbox-{phase}.log")
        total, stages = turingbox_stages(tb_log)
        rows.append((phase, total, stages, plain_ready(os.path.join(run_dir, f"plain-{phase}.log"), tb_log)))

    fig, ax = plt.subplots(figsize=(8, 3.8))
    colors = {"planning": "#999", "starting": "#4c72b0", "loading": "#55a868", "compiling": "#c44e52",
              "capturing": "#8172b2", "warming": "#ccb974"}
    y = 0
    labels = []
    for phase, total, stages, plain in rows:
        left = 0.0
        for name, secs in stages.items():
            ax.barh(y, secs, left=left, color=colors.get(name, "#777"), label=name if y == 0 else None)
            left += secs
        ax.text(left + 3, y, f"{total:.0f} s", va="center")
        labels.append(f"turingbox, {phase}")
        y += 1
        ax.barh(y, plain, color="#bbb", label="plain vllm serve" if y == 1 else None)
        ax.text(plain + 3, y, f"{plain:.0f} s", va="center")
        labels.append(f"plain vLLM, {phase}")
        y += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch to ready (H200, Qwen3.6-27B demo, MTP=3)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(img_dir, "startup-h200.png"), dpi=120)

    cold = json.load(open(os.path.join(run_dir, "side_by_side-cold.json")))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, name in enumerate(("turingbox", "plain")):
        r = cold[name]
        ax.bar(i * 3, r["first_ttft_s"], color="#c44e52", label="first request" if i == 0 else None)
        ax.bar(i * 3 + 1, r["later_ttft_median_s"], color="#4c72b0", label="median of next ten" if i == 0 else None)
        ax.text(i * 3, r["first_ttft_s"], f"{r['first_ttft_s']:.2f} s", ha="center", va="bottom")
        ax.text(i * 3 + 1, r["later_ttft_median_s"], f"{r['later_ttft_median_s']:.3f} s", ha="center", va="bottom")
    ax.set_xticks([0.5, 3.5], ["turingbox serve", "plain vllm serve"])
    ax.set_ylabel("TTFT (s), streaming chat")
    ax.set_title("First request after a cold start (H200)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(img_dir, "first-ttft-h200.png"), dpi=120)
    print(json.dumps([{"phase": p, "turingbox_ready_s": t, "stages": s, "plain_ready_s": pl} for p, t, s, pl in rows]))


if __name__ == "__main__":
    main(*sys.argv[1:3])
