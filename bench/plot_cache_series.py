#!/usr/bin/env python3
"""Chart for docs/benchmarks.md: time to ready per start of one plan, split into turingbox's stages.

Reads `side_by_side-<phase>.json` (bench/gpu/side_by_side.py) for each phase given, in order:

  python3 bench/plot_cache_series.py docs/data/2026-11-30-h200x2-tp2 docs/img/cache-series-h200-tp2.png \\
      tp2cold:"empty caches" tp2seeded:"seeded copy" tp2warm:"all warm" tp2baked:"from baked layer"
"""
from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = ("planning", "starting", "loading", "compiling", "capturing", "warming")


def main(run_dir: str, out_png: str, phases: list[str]) -> None:
    labels, rows, ready = [], [], []
    for spec in phases:
        phase, _, label = spec.partition(":")
        rec = json.load(open(os.path.join(run_dir, f"side_by_side-{phase}.json")))["turingbox"]
        stages = rec.get("startup_stage_seconds") or {}
        labels.append(label or phase)
        rows.append([stages.get(s, 0.0) for s in STAGES])
        ready.append(rec["ready_s"])
    fig, ax = plt.subplots(figsize=(8, 0.7 * len(labels) + 1.6))
    left = [0.0] * len(labels)
    for i, stage in enumerate(STAGES):
        widths = [r[i] for r in rows]
        ax.barh(labels, widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    for y, t in enumerate(ready):
        ax.text(t + 5, y, f"{t:.0f} s", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch to /health/ready = 200")
    ax.set_xlim(0, max(ready) * 1.15)
    ax.legend(ncol=3, fontsize=8, loc="lower right")
    ax.set_title(os.path.basename(run_dir.rstrip("/")) + ": turingbox serve, one plan, four starts")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"wrote {out_png}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
