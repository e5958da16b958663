#!/usr/bin/env python3
"""Where the seconds of a start go, per process and thread, from py-spy's collapsed stacks.

Reads `py-spy record --subprocesses --threads --idle --format raw` output (plain or .gz; session.sh startupx
writes one for a warm turingbox start) and prints, for every process and thread with at least --min-s of samples,
its sampled seconds and the functions with the most inclusive time (a function counts once per stack, so a caller
and its callee both show; read them top-down). With --idle the waits are included: the main threads' seconds add up
to the wall time. --json writes the same as JSON.

  python3 bench/pyspy_summary.py docs/data/<run>/pyspy-warm.txt.gz --rate 50 --top 25
  python3 bench/pyspy_summary.py docs/data/<run>/pyspy-warm.txt.gz --tree EngineCore.__init__ --depth 6 --min-s 0.3
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter, defaultdict

PROCESS = re.compile(r'^process (\d+):"(.*)"$', re.S)
THREAD = re.compile(r"^thread \((\w+)\)(?:: (.*))?$")
LINE_NO = re.compile(r":\d+\)$")


def read_stacks(path: str) -> list[tuple[list[str], int]]:
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            out.append((stack.split(";"), int(count)))
    return out


def function(frame: str) -> str:
    """`name (file:line)` -> `name (file)`: one row per function, not per line."""
    return LINE_NO.sub(")", frame)


def split_sample(frames: list[str]) -> tuple[str, str, str, str | None, list[str]]:
    """(pid, command line, thread id, thread name, the Python frames) of one collapsed stack."""
    rest = list(frames)
    pid = cmd = thread = ""
    # --subprocesses nests a child's stacks under its parent's frame: the innermost process frame is the sampled one
    while rest and (m := PROCESS.match(rest[0])):
        pid, cmd = m.group(1), m.group(2).strip()
        rest = rest[1:]
    name = None
    if rest and (m := THREAD.match(rest[0])):
        thread, name = m.group(1), m.group(2)      # py-spy names a thread on some samples only
        rest = rest[1:]
    return pid, cmd, thread, name, rest


def summarize(stacks: list[tuple[list[str], int]], rate: float, top: int, min_s: float) -> list[dict]:
    groups: dict[tuple[str, str], dict] = {}
    inclusive: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for frames, count in stacks:
        pid, cmd, thread, name, rest = split_sample(frames)
        key = (pid, thread)
        g = groups.setdefault(key, {"process": pid, "thread": thread, "samples": 0, "names": []})
        if cmd and g["process"] == pid:              # py-spy reads a command line on some samples only
            g["process"] = f"{pid} {cmd}"
        if name and name not in g["names"]:          # a native thread id can be reused by a later thread
            g["names"].append(name)
            g["thread"] = f"{'/'.join(g['names'])} ({thread})"
        g["samples"] += count
        for name in dict.fromkeys(function(f) for f in rest):     # once per stack, in order
            inclusive[key][name] += count
    out = []
    for key, g in sorted(groups.items(), key=lambda kv: -kv[1]["samples"]):
        seconds = g["samples"] / rate
        if seconds < min_s:
            continue
        rows = [{"function": name, "seconds": round(n / rate, 2)} for name, n in inclusive[key].most_common(top)]
        out.append({"process": g["process"], "thread": g["thread"], "samples": g["samples"],
                    "seconds": round(seconds, 2), "top": rows})
    return out


def tree(stacks: list[tuple[list[str], int]], rate: float, root: str, pid: str | None = None, depth: int = 8,
         min_s: float = 0.3) -> list[dict]:
    """The call tree under every frame whose function starts with `root` (in process `pid`, if given): where that
    function's seconds went, `depth` frames down, children with fewer than min_s seconds left out. Frames that
    only pass a call on (wrappers) stay in, as in py-spy's own flame graphs."""
    nodes: dict = {}
    for frames, count in stacks:
        proc, _, _, _, rest = split_sample(frames)
        if pid is not None and proc != pid:
            continue
        names = [function(f) for f in rest]
        at = next((i for i, name in enumerate(names) if name.startswith(root)), None)
        if at is None:
            continue
        level = nodes
        for name in names[at:at + depth + 1]:            # the function, then `depth` frames below it
            node = level.setdefault(name, {"samples": 0, "children": {}})
            node["samples"] += count
            level = node["children"]

    def rows(level: dict) -> list[dict]:
        out = []
        for name, node in sorted(level.items(), key=lambda kv: -kv[1]["samples"]):
            if node["samples"] / rate >= min_s:
                out.append({"function": name, "seconds": round(node["samples"] / rate, 2),
                            "children": rows(node["children"])})
        return out
    return rows(nodes)


def print_tree(rows: list[dict], indent: int = 0) -> None:
    for row in rows:
        print(f"{'  ' * indent}{row['seconds']:7.2f} s  {row['function'][:150]}")
        print_tree(row["children"], indent + 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="py-spy raw output (.txt or .txt.gz)")
    p.add_argument("--rate", type=float, default=50.0, help="py-spy's --rate (samples per second)")
    p.add_argument("--top", type=int, default=25, help="functions per thread")
    p.add_argument("--min-s", type=float, help="leave out threads (tree: calls) with fewer sampled seconds "
                                                "(default 1.0; with --tree 0.3)")
    p.add_argument("--json", dest="json_path", help="also write the summary here")
    p.add_argument("--tree", metavar="FUNCTION", help="instead: the call tree under this function (name prefix)")
    p.add_argument("--pid", help="with --tree: only this process")
    p.add_argument("--depth", type=int, default=8, help="with --tree: frames below the function")
    a = p.parse_args(argv)
    if a.depth < 1:
        p.error(f"--depth must be at least 1 (got {a.depth}).")
    if a.min_s is None:
        a.min_s = 0.3 if a.tree else 1.0
    try:
        stacks = read_stacks(a.path)
    except OSError as exc:
        print(f"pyspy_summary: cannot read {a.path}: {exc.strerror}.", file=sys.stderr)
        return 2
    if not stacks:
        print(f"pyspy_summary: {a.path} holds no py-spy stacks.", file=sys.stderr)
        return 2
    if a.tree:
        result = tree(stacks, a.rate, a.tree, a.pid, a.depth, a.min_s)
        if not result:
            print(f"pyspy_summary: no stack in {a.path} passes through {a.tree}"
                  + (f" in process {a.pid}" if a.pid else "") + ".", file=sys.stderr)
            return 2
        print_tree(result)
    else:
        result = summarize(stacks, a.rate, a.top, a.min_s)
        for g in result:
            print(f"== {g['seconds']:.1f} s  process {g['process'][:120]}  thread {g['thread']}")
            for row in g["top"]:
                print(f"   {row['seconds']:7.2f} s  {row['function'][:150]}")
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump(result, f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
