"""What /proc says about a process: open file descriptors, sockets, resident memory."""
from __future__ import annotations

import os


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_count(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            continue
    return n


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
