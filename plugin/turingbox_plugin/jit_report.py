"""After a soak: which Triton specializations compiled after ready, and which argument warmup missed.

Reads the compile logs the workers append to (`<runtime_dir>/jit-keys-rank<N>.jsonl`, one line per
compile with each argument's specialization: `i32:D`, `i32`, `i32=1`, `*fp16:D`, `constexpr=256`) and
compares every after-ready compile with the warmup compiles of the same kernel. A miss names the
arguments whose specialization no warmup compile of that kernel had:

    _causal_conv1d_fwd_kernel rank 0: seqlen=i32=1 (warmup had: i32, i32:D)

    turingbox-plugin jit-report --runtime-dir DIR [--json]
"""
from __future__ import annotations

import glob
import json
import os
import re
from collections import defaultdict
from typing import Any, Iterable

KEY_LOG = "jit-keys-rank{rank}.jsonl"


def key_log_path(runtime_dir: str, rank: int) -> str:
    return os.path.join(runtime_dir, KEY_LOG.format(rank=rank))


def load(runtime_dir: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(runtime_dir, "jit-keys-rank*.jsonl"))):
        m = re.search(r"rank(\d+)\.jsonl$", path)
        rank = int(m.group(1)) if m else -1
        rows = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue
        out[rank] = rows
    return out


def compare(rows: Iterable[dict]) -> dict[str, Any]:
    """Per rank's rows: distinct warmup keys per kernel, and for each after-ready compile the differing args."""
    warm: dict[str, list[dict]] = defaultdict(list)
    after: list[dict] = []
    for r in rows:
        (after if r.get("phase") == "after_ready" else warm[r.get("kernel", "?")]).append(r)
    misses = []
    for r in after:
        name = r.get("kernel", "?")
        params = r.get("params") or {}
        seen = warm.get(name, [])
        if not seen:
            misses.append({"kernel": name, "t": r.get("t"), "differs": {}, "why": "no warmup compile of this kernel"})
            continue
        differs = {}
        for arg, spec in params.items():
            had = sorted({str((w.get("params") or {}).get(arg)) for w in seen})
            if spec not in had:
                differs[arg] = {"after_ready": spec, "warmup_had": had}
        why = "" if differs else ("same argument specializations as a warmup compile; other options "
                                  f"({r.get('options')})" if r.get("options") else "same specializations")
        misses.append({"kernel": name, "t": r.get("t"), "differs": differs, "why": why})
    return {"warmup_compiles": sum(len(v) for v in warm.values()), "warmup_kernels": len(warm),
            "after_ready": len(after), "misses": misses}


def report(runtime_dir: str) -> dict[str, Any]:
    ranks = load(runtime_dir)
    return {"runtime_dir": runtime_dir, "ranks": {str(rank): compare(rows) for rank, rows in ranks.items()},
            "after_ready_total": sum(1 for rows in ranks.values() for r in rows if r.get("phase") == "after_ready")}


def format_text(rep: dict[str, Any]) -> str:
    lines = []
    if not rep["ranks"]:
        return f"no compile logs (jit-keys-rank*.jsonl) in {rep['runtime_dir']}"
    for rank, r in rep["ranks"].items():
        lines.append(f"rank {rank}: {r['warmup_compiles']} compiles of {r['warmup_kernels']} kernels before ready, "
                     f"{r['after_ready']} after ready")
        for m in r["misses"]:
            if m["differs"]:
                parts = ", ".join(f"{a}={d['after_ready']} (warmup had: {', '.join(d['warmup_had'])})"
                                  for a, d in m["differs"].items())
            else:
                parts = m["why"]
            lines.append(f"  {m['kernel']} rank {rank}: {parts}")
    return "\n".join(lines)
