#!/usr/bin/env python3
"""Per-process import profile of a recorded start (issue 18), read from a log run with PYTHONPROFILEIMPORTTIME=1.

Every Python process that inherits PYTHONPROFILEIMPORTTIME=1 writes `import time: self [us] | cumulative | module`
lines to stderr, from C, so they carry no "(APIServer pid=N)" prefix, and the processes' lines interleave in the
log (the engine core and multiprocessing's resource tracker start at the same moment). Each process begins with
the header line `import time: self [us] | cumulative | imported package`.

How lines are given to processes: a process's lines form a post-order forest. The indent is the depth. A module's
line comes after its children's. Its cumulative time equals its self time plus its children's cumulative times,
to a microsecond per child. So a line fits one process and not another. A beam search keeps the
assignments that break the fewest of these sums. Ties go to the process that wrote the previous line; a
"(APIServer pid=N)" / "(EngineCore pid=N)" line counts as its process writing. Lines that fit no process
are counted as `inconsistent_lines`. A process is named by the first vLLM prefix seen after its own lines,
by the sidecar's timestamped lines, or by what it imports (resource tracker, Inductor compile worker).
Two processes that start together import the same stdlib modules in the same order; while both are young,
a module's second line goes to the one that has not loaded it (later, a failed import legitimately prints again).

What -X importtime does not show: a module loaded through importlib.import_module (vLLM's model registry,
--worker-cls, plugins) or run by runpy/-m gets no line of its own; its imports appear as top-level lines and
its own body's time is in no line. Totals here are sums of top-level lines, so they are lower bounds.
Per process: total and before-ready import seconds, the heaviest top-level imports, self time per package
(an exact partition of the lines' time), every import over --heavy-s at any depth, the first import of some
named modules (torch, transformers, FLA ops, ...), and the seconds of imports inside each startup step.

  python3 bench/import_profile.py docs/data/2026-12-02-h200-s8/turingbox-soak64.log.gz \
      --json docs/data/2026-12-02-h200-s8/import-profile-turingbox.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import startup_timeline  # noqa: E402  (bench/ is not a package)

HEADER = re.compile(r"^import time: self \[us\] \| cumulative \| imported package\s*$")
IMPORT = re.compile(r"^(?:\((\w+) pid=(\d+)\) )?import time:\s*(\d+) \|\s*(\d+) \| ( *)(\S+)\s*$")
PREFIXED = re.compile(r"^\((\w+)[^)]*?pid=(\d+)\) ")
SIDECAR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
READY = [re.compile(r"stage: warming -> ready"), re.compile(r"Application startup complete")]

MISMATCH = 10.0   # a line whose cumulative time is not its self time plus its children's in that process
DUP = 3.0         # a module a young process already loaded, while another young process has not (see attribute)
YOUNG = 500       # log lines after its header during which a process counts as young
SWITCH = 0.01     # a line from another process than the previous line's
WAKE = 2.0        # a line from a process that wrote nothing (imports, log lines, its header) for IDLE lines
IDLE = 50
BEAM = 48
LAG = 400         # import lines after which the best hypothesis's older choices are settled

# modules whose first import is worth naming (cumulative, wherever in the tree it happens)
NOTABLE = [
    "torch", "transformers", "triton", "vllm", "vllm.entrypoints.cli", "vllm.entrypoints.cli.benchmark.main",
    "vllm.entrypoints.openai.api_server", "vllm.v1.engine.async_llm", "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm._aiter_ops",
    "vllm.model_executor.models.qwen3_5", "vllm.model_executor.models.qwen3_vl",
    "vllm.model_executor.layers.mamba.gdn_linear_attn", "vllm.model_executor.layers.fla.ops",
    "vllm.v1.attention.backends.flashinfer", "flashinfer", "xgrammar",
    "vllm.v1.structured_output.backend_xgrammar", "fastapi", "uvicorn", "pydantic",
    "sympy", "numpy", "scipy", "cv2", "PIL", "ray", "turingbox_plugin", "turingbox.serve.controller",
]


def _step(pend: tuple, self_us: int, cum_us: int, depth: int) -> tuple[tuple, bool]:
    """One line into one process's open tree. pend[d] = (sum of cumulative, count) of the finished nodes at
    depth d whose parent has not been printed yet. Returns the new pend and whether the sums broke."""
    top = len(pend) - 1
    if depth > top:                        # a new subtree's first leaf (or a sibling's, deeper)
        children, new = (0, 0), pend + ((0, 0),) * (depth - top - 1) + ((cum_us, 1),)
        broke = False
    else:
        children = pend[depth + 1] if depth + 1 <= top else (0, 0)
        broke = depth < top - 1            # skipped a level: a parent closed over a missing one
        s, n = pend[depth]
        new = pend[:depth] + ((s + cum_us, n + 1),)
    broke = broke or abs(cum_us - self_us - children[0]) > children[1] + 2
    return new, broke


def attribute(lines: list[str]) -> tuple[list[dict], list[tuple[int, int, int, int, str, int, bool]]]:
    """Returns the processes (header order) and every import line as (line no, process, self us, cum us,
    module, depth, inconsistent)."""
    procs: list[dict] = []
    imports: list[tuple[int, int, int, str, int]] = []     # (line no, self, cum, module, depth)
    seen_at: dict[str, list[int]] = {}                      # module -> its earlier import lines (any process)
    committed: list[int | None] = []                        # the process of lines older than LAG, settled
    settled = 0

    def holder(bp, j: int) -> int | None:                   # the process a hypothesis gave import line j
        if committed[j] is not None:
            return committed[j]
        while bp is not None and bp[2] > j:
            bp = bp[3]
        return bp[0] if bp is not None and bp[2] == j else None

    # hypothesis: (cost, pends per process, last process, pid map, back pointers, last line of each process)
    beam: list[tuple] = [(0.0, (), -1, (), None, ())]
    for no, line in enumerate(lines):
        if HEADER.match(line):
            procs.append({"index": len(procs), "header_line": no + 1})
            beam = [(c, pends + ((),), len(procs) - 1, pm, bp, act + (no,)) for c, pends, _, pm, bp, act in beam]
            continue
        m = IMPORT.match(line)
        if m and procs:
            self_us, cum_us, depth, mod = int(m.group(3)), int(m.group(4)), len(m.group(5)) // 2, m.group(6)
            tag = f"{m.group(1)} pid={m.group(2)}" if m.group(1) else None
            k_line = len(imports)
            imports.append((no + 1, self_us, cum_us, mod, depth))
            committed.append(None)
            earlier = seen_at.setdefault(mod, [])
            young = {p["index"] for p in procs if no + 1 - p["header_line"] < YOUNG}
            best: dict = {}
            for cost, pends, last, pm, bp, act in beam:
                forced = dict(pm).get(tag) if tag else None
                has_it = {holder(bp, j) for j in earlier} if len(young) > 1 else set()
                lacks = young - has_it
                for k in ([forced] if forced is not None else range(len(pends))):
                    new, broke = _step(pends[k], self_us, cum_us, depth)
                    # two processes that start together import the same modules: a second line for a module
                    # goes to the one that lacks it. Not later: a module whose import failed prints again.
                    dup = k in has_it and bool(lacks - {k})
                    c = cost + (MISMATCH if broke else 0.0) + (DUP if dup else 0.0) \
                        + (SWITCH if k != last else 0.0) + (WAKE if no - act[k] > IDLE else 0.0)
                    npends = pends[:k] + (new,) + pends[k + 1:]
                    key = (npends, k, pm)
                    if key not in best or best[key][0] > c:
                        best[key] = (c, npends, k, pm, (k, broke, k_line, bp), act[:k] + (no,) + act[k + 1:])
            beam = sorted(best.values(), key=lambda h: h[0])[:BEAM]
            earlier.append(k_line)
            if k_line - settled >= 2 * LAG:                 # the beam agrees on old lines: settle them
                bp, bound = beam[0][4], k_line - LAG
                while bp is not None and bp[2] >= settled:
                    if bp[2] < bound:
                        committed[bp[2]] = bp[0]
                    bp = bp[3]
                settled = bound
            continue
        tag = None
        m = PREFIXED.match(line)
        if m:
            tag = f"{m.group(1)} pid={m.group(2)}"
        elif SIDECAR.match(line):
            tag = "sidecar"
        if tag and procs:
            nb = []
            for cost, pends, last, pm, bp, act in beam:
                d = dict(pm)
                if tag not in d:
                    taken = set(d.values())
                    # the process whose import lines came just before its first log line
                    cand = last if last >= 0 and last not in taken else \
                        next((k for k in range(len(pends) - 1, -1, -1) if k not in taken), None)
                    if cand is None:
                        nb.append((cost, pends, last, pm, bp, act))
                        continue
                    d[tag] = cand
                    pm = tuple(sorted(d.items()))
                k = d[tag]
                nb.append((cost, pends, k, pm, bp, act[:k] + (no,) + act[k + 1:]))
            beam = nb
    cost, pends, last, pm, bp, act = beam[0]
    chosen = []
    while bp is not None:
        k, broke, k_line, bp = bp
        chosen.append((k_line, k, broke))
    chosen.reverse()
    out = [(imports[i][0], k, imports[i][1], imports[i][2], imports[i][3], imports[i][4], broke)
           for i, k, broke in chosen]
    for tag, k in pm:
        procs[k].setdefault("tags", []).append(tag)
    return procs, out


def _name(proc: dict, tops: list[str]) -> str:
    tags = proc.get("tags", [])
    for want in ("APIServer", "EngineCore", "sidecar"):
        for t in tags:
            if t.startswith(want):
                return "turingbox sidecar" if t == "sidecar" else t
    if tags:
        return tags[0]
    if any(t.startswith("torch._inductor.compile_worker") for t in tops):
        return "Inductor compile worker"
    if "multiprocessing.resource_tracker" in tops:
        return "multiprocessing resource tracker"
    return f"process {proc['index'] + 1}"


def profile(lines: list[str], top: int = 15, t0: str | None = None, heavy_s: float = 0.4) -> dict:
    procs, assigned = attribute(lines)
    ready_line = None
    for rx in READY:
        ready_line = next((i + 1 for i, l in enumerate(lines) if rx.search(l)), None)
        if ready_line:
            break
    try:                                       # the start's steps, to say in which step each import ran
        with contextlib.redirect_stderr(io.StringIO()):
            steps = [st for st in startup_timeline.parse(lines, t0)["steps"] if st.get("end_line")]
    except SystemExit:
        steps = []
    result = {"ready_line": ready_line, "processes": []}
    for p in procs:
        mine = [a for a in assigned if a[1] == p["index"]]
        # each line's top-level ancestor: the next depth-0 line of the same process (post-order)
        tops, ancestor = [None] * len(mine), None
        for i in range(len(mine) - 1, -1, -1):
            if mine[i][5] == 0:
                ancestor = mine[i][4]
            tops[i] = ancestor
        toplevel = [a for a in mine if a[5] == 0]
        total = sum(a[3] for a in toplevel)
        before = sum(a[3] for a in toplevel if ready_line is None or a[0] < ready_line)
        by_pkg: dict[str, int] = {}
        for a in mine:
            pkg = a[4].split(".")[0]
            by_pkg[pkg] = by_pkg.get(pkg, 0) + a[2]
        notable = {}
        for i, a in enumerate(mine):
            if a[4] in NOTABLE and a[4] not in notable:
                notable[a[4]] = {"cumulative_s": round(a[3] / 1e6, 6), "depth": a[5], "under": tops[i],
                                 "line": a[0]}
        heavy = sorted(toplevel, key=lambda a: -a[3])[:top]
        by_step: dict[str, int] = {}
        for a in toplevel:
            st = next((st["step"] for st in steps if a[0] <= st["end_line"]), "after the last step" if steps else "")
            by_step[st] = by_step.get(st, 0) + a[3]
        result["processes"].append({
            "process": _name(p, [a[4] for a in toplevel]),
            "header_line": p["header_line"],
            "import_lines": len(mine),
            "inconsistent_lines": sum(1 for a in mine if a[6]),
            "total_import_s": round(total / 1e6, 6),
            "before_ready_s": round(before / 1e6, 6),
            "after_ready_s": round((total - before) / 1e6, 6),
            "by_step_s": {k: round(v / 1e6, 6) for k, v in by_step.items()} if steps else {},
            "top_level": [{"module": a[4], "cumulative_s": round(a[3] / 1e6, 6), "line": a[0]} for a in heavy],
            # every module, at any depth, whose import took heavy_s or more, in log order: the chains
            "heavy_nodes": [{"module": a[4], "cumulative_s": round(a[3] / 1e6, 6), "depth": a[5],
                             "under": tops[i], "line": a[0]} for i, a in enumerate(mine) if a[3] >= heavy_s * 1e6],
            "self_time_by_package_s": {k: round(v / 1e6, 6) for k, v in
                                       sorted(by_pkg.items(), key=lambda kv: -kv[1])[:top]},
            "first_import_of": notable,
        })
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a serve log with -X importtime lines (.log or .log.gz)")
    ap.add_argument("--json", help="write the profile here")
    ap.add_argument("--top", type=int, default=15, help="how many top-level imports and packages per process")
    ap.add_argument("--heavy-s", type=float, default=0.4, help="list every import at least this long (any depth)")
    ap.add_argument("--t0", help="when the process was started (plain vLLM logs: gives the year for the steps)")
    a = ap.parse_args(argv)
    with startup_timeline.open_log(a.log) as f:
        lines = f.read().splitlines()
    result = profile(lines, a.top, a.t0, a.heavy_s)
    if not result["processes"]:
        print("import_profile: no 'import time:' header in the log (was PYTHONPROFILEIMPORTTIME=1 set?).",
              file=sys.stderr)
        return 2
    result["log"] = a.log
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    for p in result["processes"]:
        print(f'{p["process"]}: {p["total_import_s"]:.2f} s of imports ({p["before_ready_s"]:.2f} s before ready), '
              f'{p["import_lines"]} lines, {p["inconsistent_lines"]} inconsistent')
        for t in p["top_level"][:8]:
            print(f'  {t["cumulative_s"]:7.3f}  {t["module"]}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
