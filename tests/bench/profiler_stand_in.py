#!/usr/bin/env python3
"""Stand-in for a profiler that wraps a command, shaped like `py-spy record -o OUT -- CMD` (0.4.3): runs CMD as its
child; when the child exits it writes its record and exits; on SIGINT (Ctrl-C) it writes its record and SIGKILLs the
child, as py-spy does. The record: {"stopped_by": "child exit" | "SIGINT", "child_exit": N or None}."""
import json
import os
import signal
import subprocess
import sys

out = sys.argv[sys.argv.index("-o") + 1]
cmd = sys.argv[sys.argv.index("--") + 1:]
child = subprocess.Popen(cmd)


def write(stopped_by: str, code) -> None:
    with open(out, "w") as f:
        json.dump({"stopped_by": stopped_by, "child_exit": code}, f)


def interrupted(*_) -> None:
    write("SIGINT", None)
    os.kill(child.pid, signal.SIGKILL)          # py-spy: "kill it so we don't have dangling processes"
    os._exit(0)


signal.signal(signal.SIGINT, interrupted)
write("child exit", child.wait())
