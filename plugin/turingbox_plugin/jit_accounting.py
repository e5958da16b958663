"""Count Triton compilations per kernel, before and after the worker declares itself ready.

Triton calls `knobs.runtime.jit_post_compile_hook` once per in-process compile of a
specialisation, including compiles served from the on-disk cache, so a count of hook events after
ready is a sound "no cold kernel on the request path" check. The hook is chained: whatever hook was
installed before ours is called with the same kwargs, and vLLM's jit_monitor (installed after ours,
at the end of warmup) chains to ours the same way, so neither replaces the other.
"""
from __future__ import annotations

import ast
import json
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

log = logging.getLogger("vllm.turingbox_plugin.jit")


def kernel_name(fn: Any) -> str:
    """Name of the kernel in a hook call (`fn` is Triton's JitFunctionInfo; tolerate anything)."""
    name = getattr(fn, "name", None)
    if name:
        return str(name).rsplit(".", 1)[-1]
    inner = getattr(fn, "jit_function", None) or getattr(fn, "fn", None)
    name = getattr(inner, "__name__", None)
    return str(name) if name else "<unknown>"


def compile_record(name: str, phase: str, kwargs: dict) -> dict[str, Any]:
    """What one compile was specialised on, from the hook's kwargs (Triton 3.6).

    `params` maps each argument to its specialisation as the launch's in-memory cache key has it
    (`key`: str(specialization) + str(options)): the signature type, then `:D` (divisible by 16) or
    `=value` (a constexpr, or an annotated int equal to 1: the same binary on disk, a new in-memory
    key, so a compile event). jit_report compares these.
    """
    fn = getattr(kwargs.get("fn"), "jit_function", None)
    names = [p.name for p in getattr(fn, "params", [])]
    specialization, options = _split_key(kwargs.get("key"))
    params = ({n: _spec_text(sp) for n, sp in zip(names, specialization)}
              if specialization is not None and len(specialization) == len(names) else {})
    return {"kernel": name, "phase": phase, "t": round(time.time(), 3), "params": params,
            "options": options[:400]}


def _split_key(key: Any) -> tuple[list | None, str]:
    """Triton's cache key string -> (specialization list, options text)."""
    if not isinstance(key, str) or "]{" not in key:
        return None, ""
    cut = key.rindex("]{") + 1
    try:
        spec = ast.literal_eval(key[:cut])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None, key[cut:]
    return (spec if isinstance(spec, list) else None), key[cut:]


def _spec_text(entry: Any) -> str:
    if not isinstance(entry, tuple) or not entry:
        return repr(entry)
    ty, *rest = entry
    spec = rest[0] if rest else None
    if spec is None or spec == "":
        return str(ty)
    if spec == "D":
        return f"{ty}:D"
    return f"{ty}={spec!r}"


class JitAccountant:
    """Per-kernel compile counts; `mark_ready()` switches counting to the after-ready bucket.

    With `key_log`, every compile is also appended to that JSON-lines file (compile_record), so a
    miss after ready can be compared with what warmup compiled (`turingbox-plugin jit-report`).
    """

    def __init__(self, on_jit_after_ready: Callable[[str, dict], None] | None = None,
                 key_log: str | None = None):
        self.key_log = key_log
        self.before_ready: Counter[str] = Counter()
        self.after_ready: Counter[str] = Counter()
        self.ready = False
        self.installed = False
        self._previous: Callable[..., Any] | None = None
        self._on_after_ready = on_jit_after_ready
        self._lock = threading.Lock()

    # -- the hook --------------------------------------------------------------------------
    def hook(self, **kwargs: Any) -> Any:
        try:
            self.record(kernel_name(kwargs.get("fn")), kwargs)
        except Exception:  # accounting must never break a kernel launch
            log.exception("turingbox JIT accounting failed")
        previous = self._previous
        if previous is not None:
            return previous(**kwargs)
        return None

    def record(self, name: str, kwargs: dict | None = None) -> None:
        with self._lock:
            bucket = self.after_ready if self.ready else self.before_ready
            bucket[name] += 1
            after = self.ready
            if self.key_log:
                try:
                    line = json.dumps(compile_record(name, "after_ready" if after else "warmup", kwargs or {}),
                                      default=str)
                    with open(self.key_log, "a") as f:
                        f.write(line + "\n")
                except (OSError, TypeError, ValueError):
                    log.debug("turingbox: compile key not logged", exc_info=True)
        if after and self._on_after_ready is not None:
            self._on_after_ready(name, kwargs or {})

    # -- lifecycle -------------------------------------------------------------------------
    def install(self, runtime_knobs: Any = None) -> bool:
        """Chain into Triton's post-compile hook; idempotent. False when Triton is absent."""
        if self.installed:
            return True
        if runtime_knobs is None:
            try:
                from triton import knobs
            except ImportError:
                return False
            runtime_knobs = knobs.runtime
        current = getattr(runtime_knobs, "jit_post_compile_hook", None)
        if getattr(current, "__self__", None) is self:
            self.installed = True
            return True
        self._previous = current
        runtime_knobs.jit_post_compile_hook = self.hook
        self.installed = True
        return True

    def mark_ready(self) -> None:
        with self._lock:
            self.ready = True

    def kernels_before_ready(self) -> int:
        return sum(self.before_ready.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "kernels_before_ready": sum(self.before_ready.values()),
                "distinct_kernels_before_ready": len(self.before_ready),
                "jit_after_ready": dict(self.after_ready),
                "jit_after_ready_total": sum(self.after_ready.values()),
            }
