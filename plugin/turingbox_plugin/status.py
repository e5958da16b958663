"""Worker status files: `<runtime_dir>/worker-<rank>.json`, written atomically.

Schema: turingbox_plugin.contract (STATUS_KEYS, STATUS_STAGES, status_path); this module writes and reads it.
"""
from __future__ import annotations

import glob
import json
import os
import re
import tempfile
import threading
from typing import Any

from turingbox_plugin.contract import status_path   # the file layout is the contract's (STATUS_STAGES, STATUS_KEYS)

_FILE_RE = re.compile(r"worker-(\d+)\.json$")


def write_status_atomic(path: str, status: dict[str, Any]) -> None:
    """Write JSON to a temp file in the same directory and rename it over `path`."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".worker-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(status, f, sort_keys=True, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_worker_status(runtime_dir: str) -> list[dict[str, Any]]:
    """Every worker's status, ordered by rank; an unreadable file yields {"rank", "error"}."""
    out: list[dict[str, Any]] = []
    for path in glob.glob(os.path.join(runtime_dir, "worker-*.json")):
        m = _FILE_RE.search(path)
        if not m:
            continue
        rank = int(m.group(1))
        try:
            with open(path) as f:
                data = json.load(f)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            data = {"rank": rank, "stage": "unreadable", "error": f"{path}: {exc}"}
        data.setdefault("rank", rank)
        out.append(data)
    return sorted(out, key=lambda d: int(d.get("rank", 0)))


def check_all_ready(statuses: list[dict[str, Any]], world_size: int) -> str | None:
    """None when `world_size` workers are ready with warmup ok, else one sentence saying why not."""
    ranks = {int(s.get("rank", -1)) for s in statuses}
    missing = sorted(set(range(world_size)) - ranks)
    if missing:
        return (f"the turingbox plugin did not report from worker rank(s) {missing} of {world_size}; "
                f"it is not loaded there (is --worker-cls turingbox_plugin.worker.TuringboxWorker set?).")
    for s in statuses:
        if s.get("stage") != "ready":
            err = (s.get("warmup") or {}).get("error") or s.get("error")
            return f"worker rank {s.get('rank')} is at stage {s.get('stage')!r}" + (f": {err}" if err else ".")
        if not (s.get("warmup") or {}).get("ok"):
            return f"worker rank {s.get('rank')} finished without a passing warmup: {(s.get('warmup') or {}).get('error')}"
    return None


class StatusWriter:
    """Holds one worker's status dict and rewrites its file on every change (thread-safe)."""

    def __init__(self, runtime_dir: str | None, rank: int, base: dict[str, Any]):
        self.path = status_path(runtime_dir, rank) if runtime_dir else None
        self._lock = threading.Lock()
        self.status: dict[str, Any] = dict(base)
        self.status.setdefault("rank", rank)
        self.status.setdefault("pid", os.getpid())
        self.status.setdefault("jit_after_ready", {})
        self.status.setdefault("warmup", {"kernels": 0, "seconds": 0.0, "ok": False, "error": None})

    def update(self, **fields: Any) -> None:
        with self._lock:
            for k, v in fields.items():
                if isinstance(v, dict) and isinstance(self.status.get(k), dict):
                    merged = dict(self.status[k])
                    merged.update(v)
                    self.status[k] = merged
                else:
                    self.status[k] = v
            if self.path:
                write_status_atomic(self.path, self.status)
