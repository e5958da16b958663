#!/usr/bin/env python3
"""Stand-in for a profiler that wraps a command (`py-spy record ... -- CMD`): runs CMD as its child, and on SIGINT
(py-spy's stop) waits for the child, which got the same signal from its process group, then writes its record:
{"signal": "SIGINT", "child_exit": N} to the path after -o."""
import json
import signal
import subprocess
import sys

out = sys.argv[sys.argv.index("-o") + 1]
cmd = sys.argv[sys.argv.index("--") + 1:]
got: list[str] = []
signal.signal(signal.SIGINT, lambda *_: got.append("SIGINT"))
child = subprocess.Popen(cmd)
code = child.wait()          # PEP 475: the wait resumes after the SIGINT handler
with open(out, "w") as f:
    json.dump({"signal": got[0] if got else None, "child_exit": code}, f)
