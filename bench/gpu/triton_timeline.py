"""Which Triton kernels a start compiled, and when: a timeline from the cache directories' files.

A cold start's log goes silent for minutes while kernels compile (session 17: ~140 s between the drafter's
profile run and the KV cache sizing, in both servers). Triton writes each compiled kernel into its own cache
directory (`<hash>/<kernel>.json` metadata beside the binary), so the files' modification times are the
compile times. Autotune results (`*.autotune.json`) and FlashInfer's JIT modules (`cached_ops/<uri>/<uri>.so`, built
with nvcc at first use) are listed too. Usage:

    python3 bench/gpu/triton_timeline.py ROOT [ROOT ...] [--json OUT]

ROOT is searched recursively for Triton cache folders (a turingbox cache root or a plain vLLM HOME).
Prints one line per kernel (seconds after the first, name, variants compiled), and the gaps between
consecutive compiles over 5 s, which is where something other than Triton held the start.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict


def kernel_files(root: str):
    """(mtime, kernel name, kind, path) of every compiled kernel and autotune record under root."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if name.endswith(".autotune.json"):
                yield os.path.getmtime(path), name[:-len(".autotune.json")], "autotune", path
            elif name.endswith(".json") and not name.startswith("__grp__") and \
                    any(f.endswith((".cubin", ".hsaco")) for f in files):
                yield os.path.getmtime(path), name[:-len(".json")], "kernel", path
            elif name.endswith(".so") and os.sep + "cached_ops" + os.sep in path:
                # a FlashInfer JIT module (nvcc), <workspace>/.cache/flashinfer/<ver>/<arch>/cached_ops/<uri>/<uri>.so
                yield os.path.getmtime(path), name[:-len(".so")], "flashinfer", path


def timeline(roots: list[str]) -> dict:
    rows = sorted(r for root in roots for r in kernel_files(root))
    if not rows:
        return {"roots": roots, "kernels": 0, "first": None, "by_kernel": [], "gaps": []}
    t0 = rows[0][0]
    by_kernel: dict[tuple[str, str], list[float]] = defaultdict(list)
    for mtime, name, kind, _ in rows:
        by_kernel[(name, kind)].append(mtime - t0)
    gaps = [{"after_s": round(a[0] - t0, 1), "gap_s": round(b[0] - a[0], 1), "before": b[1], "after": a[1]}
            for a, b in zip(rows, rows[1:]) if b[0] - a[0] > 5]
    return {"roots": roots, "kernels": sum(1 for r in rows if r[2] == "kernel"),
            "flashinfer_modules": sum(1 for r in rows if r[2] == "flashinfer"),
            "autotune_records": sum(1 for r in rows if r[2] == "autotune"),
            "first": t0, "span_s": round(rows[-1][0] - t0, 1),
            "by_kernel": sorted(({"name": n, "kind": k, "count": len(ts), "first_s": round(ts[0], 1),
                                  "last_s": round(ts[-1], 1)} for (n, k), ts in by_kernel.items()),
                                key=lambda r: r["first_s"]),
            "gaps": gaps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="+")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    out = timeline([r for r in a.roots if os.path.isdir(r)])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{out['kernels']} kernels, {out.get('autotune_records', 0)} autotune records, "
          f"{out.get('flashinfer_modules', 0)} FlashInfer modules over {out.get('span_s')} s")
    for r in out["by_kernel"]:
        print(f"{r['first_s']:8.1f} {r['last_s']:8.1f} {r['count']:4d} {r['kind']:8s} {r['name']}")
    for g in out["gaps"]:
        print(f"gap {g['gap_s']:6.1f} s after {g['after_s']} s ({g['after']} -> {g['before']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
