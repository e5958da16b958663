"""Compile, before ready, every specialization of the launched Triton kernels that a batch can reach.

Triton compiles one binary per kernel and specialization key: an int argument by class (== 1,
divisible by 16, anything else), a pointer by 16-byte alignment, a constexpr by value. The strict
warmup's waves reach the classes of their own batch shapes; a real batch can give the same argument
another class (issue 15: `_causal_conv1d_fwd_kernel`'s `seqlen`, the number of prefill tokens in a
step, compiled after ready in 5 of 6 starts under a varied client mix).

`LaunchRecorder` wraps `JITFunction.run` while vLLM's own warmup and the strict warmup's waves run
(worker process only). Per kernel it keeps which values each int argument took and, per distinct
launch shape, one stand-in launch: tensors replaced by a stub with the same dtype and alignment (no
memory kept alive), everything else as passed. An int argument is *batch-dependent* when one
kernel's launches gave it more than one value: the waves vary requests, tokens per step, prompt
lengths and padding, so every argument that follows the batch moves, while shapes of the model
(hidden sizes, strides, block sizes) stay put. `sweep()` then compiles each stand-in launch with
every batch-dependent int in each class {1, 16, 17} (their cross product up to three such ints,
each one alone beyond that), through `JITFunction.run(..., warmup=True)`: compile and cache only,
no launch, so the values need not be valid for the kernel's memory. What the sweep cannot reach
(a constexpr or pointer alignment that no warmup launch showed) is what `jit_report` names after
a soak.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

log = logging.getLogger("vllm.turingbox_plugin.specializations")

CLASS_VALUES = {"one": 1, "div16": 16, "other": 17}   # a representative of each Triton int class
I32_MAX = 2**31 - 1
MAX_CROSS = 3            # batch-dependent ints swept as a full cross product; beyond it one at a time
MAX_VALUES = 64          # distinct values remembered per argument (only "more than one" matters)
MAX_SHAPES = 64          # stand-in launches kept per kernel


def int_class(x: int) -> str:
    if x == 1:
        return "one"
    if x % 16 == 0:
        return "div16"
    return "other"


class TensorStub:
    """What Triton's binder reads of a tensor argument: its dtype and where its data starts."""

    __slots__ = ("dtype", "_ptr")

    def __init__(self, dtype: Any, aligned: bool):
        self.dtype = dtype
        self._ptr = 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._ptr

    def __repr__(self) -> str:
        return f"TensorStub({self.dtype}, {'aligned' if self._ptr == 0 else 'unaligned'})"


def _stub(value: Any) -> tuple[Any, Any]:
    """(stand-in, shape descriptor) of one argument; ints describe as their class (values kept apart)."""
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value, value
    if isinstance(value, int):
        return value, ("int", int_class(value))
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        aligned = value.data_ptr() % 16 == 0
        return TensorStub(value.dtype, aligned), ("tensor", str(value.dtype), aligned)
    if isinstance(value, tuple):
        parts = [_stub(v) for v in value]
        return tuple(p[0] for p in parts), ("tuple",) + tuple(p[1] for p in parts)
    # Anything else (a tensor descriptor, a callable) is kept as passed: described by its type only, so
    # that each launch does not count as a new shape.
    return value, ("object", type(value).__name__)


@dataclass
class KernelRecord:
    fn: Any                                        # the JITFunction
    name: str
    values: dict[Any, set] = field(default_factory=dict)       # argument position/name -> ints seen
    shapes: dict[tuple, tuple] = field(default_factory=dict)   # shape descriptor -> (args, kwargs) stand-ins
    launches: int = 0

    def add(self, args: tuple, kwargs: dict) -> None:
        self.launches += 1
        stub_args, desc = [], []
        for i, a in enumerate(args):
            s, d = _stub(a)
            stub_args.append(s)
            desc.append(d)
            self._seen(i, a)
        stub_kwargs = {}
        for k in sorted(kwargs):
            s, d = _stub(kwargs[k])
            stub_kwargs[k] = s
            desc.append((k, d))
            if k in self.fn.arg_names:         # not launch options (num_warps, ...)
                self._seen(k, kwargs[k])
        key = tuple(desc)
        if key not in self.shapes and len(self.shapes) < MAX_SHAPES:
            self.shapes[key] = (tuple(stub_args), stub_kwargs)

    def _seen(self, pos: Any, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool):
            vals = self.values.setdefault(pos, set())
            if len(vals) < MAX_VALUES:
                vals.add(value)

    def batch_dependent(self) -> list[Any]:
        """Int arguments that took more than one value, sweepable (not do_not_specialize, not constexpr, i32)."""
        out = []
        for pos, vals in self.values.items():
            if len(vals) < 2 or max(vals) > I32_MAX or min(vals) < -I32_MAX:
                continue
            param = self._param(pos)
            if param is None or param.is_constexpr or param.do_not_specialize:
                continue
            out.append(pos)
        return sorted(out, key=str)

    def _param(self, pos: Any) -> Any:
        params = self.fn.params
        if isinstance(pos, int):
            return params[pos] if pos < len(params) else None
        return next((p for p in params if p.name == pos), None)

    def param_name(self, pos: Any) -> str:
        p = self._param(pos)
        return p.name if p is not None else str(pos)


def _combinations(positions: list[Any]) -> Iterator[dict[Any, str]]:
    classes = tuple(CLASS_VALUES)
    if len(positions) <= MAX_CROSS:
        for combo in itertools.product(classes, repeat=len(positions)):
            yield dict(zip(positions, combo))
    else:
        for pos in positions:
            for c in classes:
                yield {pos: c}


@dataclass
class SweepReport:
    kernels: int = 0                 # kernels with at least one batch-dependent int
    variants: int = 0                # specializations asked for (already compiled ones cost nothing)
    compiled: int = 0                # of them new to this process (the JIT hook counts these too)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    arguments: dict[str, list[str]] = field(default_factory=dict)   # kernel -> its batch-dependent ints

    def to_dict(self) -> dict[str, Any]:
        return {"wave": "specialization-sweep", "kernels": self.kernels, "variants": self.variants,
                "compiled": self.compiled, "failed": self.failed[:20], "seconds": round(self.seconds, 3),
                "arguments": self.arguments}


class LaunchRecorder:
    """Wraps `JITFunction.run` while active; re-entrant install/uninstall around the warmup only."""

    def __init__(self) -> None:
        self.kernels: dict[int, KernelRecord] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._original: Any = None

    @contextlib.contextmanager
    def recording(self) -> Iterator["LaunchRecorder"]:
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            yield self
            return
        original = JITFunction.run
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            if not warmup and not getattr(recorder._local, "sweeping", False):
                try:
                    recorder._record(fn_self, args, kwargs)
                except Exception:          # recording must never break a launch
                    log.debug("turingbox: launch not recorded", exc_info=True)
            return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        # An autotuner's benchmark launches every config; only the config it picks serves requests.
        try:
            from triton.runtime.autotuner import Autotuner
            bench = Autotuner._bench
        except (ImportError, AttributeError):
            Autotuner, bench = None, None

        def quiet_bench(tuner_self, *args, **kwargs):
            previous = getattr(recorder._local, "sweeping", False)
            recorder._local.sweeping = True
            try:
                return bench(tuner_self, *args, **kwargs)
            finally:
                recorder._local.sweeping = previous

        JITFunction.run = run
        if bench is not None:
            Autotuner._bench = quiet_bench
        self._original = original
        try:
            yield self
        finally:
            JITFunction.run = original
            if bench is not None:
                Autotuner._bench = bench
            self._original = None

    def _record(self, fn: Any, args: tuple, kwargs: dict) -> None:
        with self._lock:
            rec = self.kernels.get(id(fn))
            if rec is None:
                rec = self.kernels[id(fn)] = KernelRecord(fn, getattr(fn.fn, "__name__", repr(fn)))
            rec.add(args, dict(kwargs))

    def sweep(self) -> SweepReport:
        """Compile every class combination of each kernel's batch-dependent ints (compile only).

        Compiles run on a thread pool through Triton's AsyncCompileMode where it exists (ptxas and
        most of MLIR run outside the GIL): a cold start pays the new variants in parallel.
        """
        report = SweepReport()
        start = time.monotonic()
        todo = []
        for rec in list(self.kernels.values()):
            positions = rec.batch_dependent()
            if positions:
                report.kernels += 1
                report.arguments[rec.name] = [rec.param_name(p) for p in positions]
                todo.append((rec, positions))
        before = {id(rec.fn): len(_kernel_cache(rec.fn)) for rec, _ in todo}
        pending: list[tuple[str, dict, Any]] = []     # async compiles: (kernel, combo, FutureKernel)
        self._local.sweeping = True
        try:
            with _compile_pool():
                for rec, positions in todo:
                    for args, kwargs, combo in variants(rec, positions):
                        report.variants += 1
                        try:
                            result = rec.fn.run(*args, grid=None, warmup=True, **kwargs)
                        except Exception as exc:   # a combination the kernel cannot compile: reported, not fatal
                            report.failed.append(_failure(rec.name, combo, exc))
                            continue
                        if hasattr(result, "future"):
                            pending.append((rec.name, combo, result))
        finally:
            self._local.sweeping = False
        for name, combo, future_kernel in pending:     # errors of pool compiles surface only here
            if future_kernel.kernel is None:
                exc = future_kernel.future.exception() if future_kernel.future.done() else None
                report.failed.append(_failure(name, combo, exc))
        report.compiled = sum(len(_kernel_cache(rec.fn)) - before[id(rec.fn)] for rec, _ in todo)
        report.seconds = time.monotonic() - start
        return report


def _failure(name: str, combo: dict, exc: BaseException | None) -> str:
    if exc is None:
        return f"{name}{combo}: not compiled"
    first = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{name}{combo}: {type(exc).__name__}: {first}"


@contextlib.contextmanager
def _compile_pool() -> Iterator[None]:
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:
        yield
        return
    if active_mode.get() is not None:
        yield
        return
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) - 1))) as pool:
        try:
            with AsyncCompileMode(pool, ignore_errors=True):
                yield
        finally:
            # Triton's __exit__ resets the mode only when every finalize hook returned: never leave later
            # request-path compiles pointed at this (then shut down) pool.
            active_mode.set(None)


def variants(rec: KernelRecord, positions: list[Any]) -> Iterator[tuple[list, dict, dict]]:
    """(args, kwargs, {argument: class}) for each stand-in launch x class combination, deduplicated."""
    seen: set = set()
    for stub_args, stub_kwargs in list(rec.shapes.values()):
        for combo in _combinations(positions):
            args = list(stub_args)
            kwargs = dict(stub_kwargs)
            for pos, cls in combo.items():
                if isinstance(pos, int):
                    if pos < len(args):
                        args[pos] = CLASS_VALUES[cls]
                else:
                    kwargs[pos] = CLASS_VALUES[cls]
            key = (tuple(_stub(a)[1] for a in args), tuple((k, _stub(v)[1]) for k, v in sorted(kwargs.items())))
            if key in seen:
                continue
            seen.add(key)
            yield args, kwargs, {rec.param_name(p): c for p, c in combo.items()}


def _kernel_cache(fn: Any) -> dict:
    """The in-memory binaries of the current device (what a launch looks its key up in)."""
    try:
        from triton.runtime.driver import driver

        return fn.device_caches[driver.active.get_current_device()][0]
    except Exception:
        return {}
