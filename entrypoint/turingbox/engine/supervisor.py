"""Run vLLM as a child in its own process group, pass its output through and keep its last lines.

Like TGI's launcher: the child leads a new session, so stopping it reaches the engine core and
every worker it spawned (SIGTERM to the group, a grace period, then SIGKILL to the group). The
child also gets SIGKILL if serve itself dies without cleaning up (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import re
import signal
import sys
import time
from typing import Callable, Iterable

log = logging.getLogger("turingbox.serve")

LAST_LINES = 50
_PR_SET_PDEATHSIG = 1
_LINE_END = re.compile(rb"(?<=[\r\n])")   # split after \n and after tqdm's \r, keeping them


def describe_exit(returncode: int | None) -> str:
    """'exit code 3' or 'signal 9 (SIGKILL)' from an asyncio/subprocess return code."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent dies (Linux only, best effort)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


class Supervisor:
    """One upstream process: start, stream its output, wait, stop, kill."""

    def __init__(self, on_line: Callable[[str], None] | None = None,
                 redact: Callable[[str], str] | None = None,
                 output=None, last_lines: int = LAST_LINES) -> None:
        self.on_line = on_line
        self.redact = redact or (lambda s: s)
        self.output = output if output is not None else sys.stdout.buffer
        self.last = collections.deque(maxlen=last_lines)
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.started_at: float | None = None
        self.stopping = False          # set when serve asked it to stop (not a crash)
        self._pump: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def start(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            limit=1 << 20)
        self.pid = self.proc.pid
        self.started_at = time.monotonic()
        self._pump = asyncio.create_task(self._pump_output(), name="vllm-output")

    async def _pump_output(self) -> None:
        """Forward output as it comes (lines, and tqdm's \\r updates) and remember the last lines."""
        assert self.proc and self.proc.stdout
        pending = b""
        while True:
            chunk = await self.proc.stdout.read(65536)
            if not chunk:
                break
            pending += chunk
            parts = _LINE_END.split(pending)
            pending = parts.pop() if not parts[-1].endswith((b"\n", b"\r")) else b""
            self._emit(p for p in parts if p)
            if len(pending) > 65536:      # a very long line without an end: pass it on anyway
                self._emit([pending])
                pending = b""
        if pending:
            self._emit([pending])

    def _emit(self, parts: Iterable[bytes]) -> None:
        out = []
        for raw in parts:
            text = self.redact(raw.decode("utf-8", "replace"))
            out.append(text.encode("utf-8"))
            line = text.rstrip("\r\n")
            if line.strip():
                self.last.append(line)
                if self.on_line:
                    try:
                        self.on_line(line)
                    except Exception:            # a stage-detection bug must not stop the pump
                        log.exception("error while reading a vLLM log line")
        try:
            self.output.write(b"".join(out))
            self.output.flush()
        except (OSError, ValueError):
            pass

    async def wait(self) -> int:
        """Wait for the leader to exit and its output to end; return the exit code."""
        assert self.proc
        code = await self.proc.wait()
        if self._pump:
            # Workers may hold the pipe open after the leader died: don't wait for them forever.
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=2.0)
            except asyncio.TimeoutError:
                pass
        return code

    def signal_group(self, sig: int) -> bool:
        """Send sig to the whole process group; False when nothing is left to signal."""
        if self.pid is None:
            return False
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    async def stop(self, grace_seconds: float) -> int | None:
        """SIGTERM to the group, up to grace_seconds for the leader to exit, then SIGKILL to the group."""
        if self.proc is None:
            return None
        self.stopping = True
        if self.proc.returncode is None:
            log.info("stopping vLLM (process group %d): SIGTERM, SIGKILL after %.0f s", self.pid, grace_seconds)
            self.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=grace_seconds)
            except asyncio.TimeoutError:
                log.warning("vLLM did not exit within %.0f s of SIGTERM: sending SIGKILL", grace_seconds)
        # Whatever is left of the group (engine core, workers) goes now.
        self.signal_group(signal.SIGKILL)
        return await self.wait()

    def kill_now(self) -> None:
        """Synchronous SIGKILL to the group, for a forced exit."""
        self.stopping = True
        self.signal_group(signal.SIGKILL)

    def last_lines_text(self) -> str:
        return "\n".join(self.last)
