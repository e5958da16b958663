"""`--worker-cls turingbox_plugin.worker.TuringboxWorker`: vLLM 0.21's GPU worker plus strict warmup.

Hook point (vllm/v1/worker/gpu_worker.py, `Worker.compile_or_warm_up_model`): the parent compiles,
captures CUDA graphs, runs its dummy sampler and, as its last act, calls
`vllm.triton_utils.jit_monitor.activate()` (imported inside the method, so the module attribute is
looked up at call time). We defer that activation while the parent runs, run the strict warmup,
and only then activate vLLM's monitor and mark our own accounting ready. The engine core reports
ready only after every worker returns from this method, so no request can arrive mid-warmup.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Iterator

from vllm.v1.worker.gpu_worker import Worker

from turingbox_plugin import __version__, autotune, driver, structured
from turingbox_plugin.activation import PluginSettings, resolve_settings
from turingbox_plugin import contract
from turingbox_plugin.contract import status_rank
from turingbox_plugin.gdn import hook as gdn_hook
from turingbox_plugin.jit_accounting import JitAccountant
from turingbox_plugin.jit_report import key_log_path
from turingbox_plugin.specializations import LaunchRecorder
from turingbox_plugin.status import StatusWriter
from turingbox_plugin.vllm_fixes import apply_all
from turingbox_plugin.warmup_plan import plan_bitmask_cases, plan_waves, summarize, summarize_bitmask

log = logging.getLogger("vllm.turingbox_plugin")


class PluginStartupError(RuntimeError):
    """Startup refused: one sentence naming what failed."""


@contextlib.contextmanager
def deferred_jit_monitor() -> Iterator[list[bool]]:
    """Make vLLM's `jit_monitor.activate` a recorder while the parent warmup runs."""
    try:
        from vllm.triton_utils import jit_monitor
    except ImportError:
        yield []
        return
    calls: list[bool] = []
    real = jit_monitor.activate
    jit_monitor.activate = lambda: calls.append(True)
    try:
        yield calls
    finally:
        jit_monitor.activate = real


def _gpu_workers_on_host(vllm_config: Any) -> int:
    """GPU workers that tune at the same moment on this host: the engine's TP x PP ranks times the local
    data-parallel engines (over-counted across nodes: fewer compile threads each, never more)."""
    pc = getattr(vllm_config, "parallel_config", None)
    world = int(getattr(pc, "world_size", 1) or 1)
    local_dp = int(getattr(pc, "data_parallel_size_local", 1) or 1)
    return max(1, world * local_dp)


def _startup_fail(message: str) -> PluginStartupError:
    log.error("turingbox: %s", message)
    return PluginStartupError(f"turingbox: {message}")


class TuringboxWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        try:
            self.tb_settings: PluginSettings = resolve_settings(self.vllm_config.additional_config)
        except ValueError as exc:
            raise _startup_fail(f"bad plugin configuration: {exc}.") from None
        s = self.tb_settings
        # this worker's number across data-parallel engines (status and key-log files are per worker)
        self.tb_rank = status_rank(getattr(self.vllm_config, "parallel_config", None), self.rank)
        runtime_dir = s.runtime_dir    # the contract's engine variable (activation.py)
        key_log = None
        if s.active and runtime_dir:
            key_log = key_log_path(runtime_dir, self.tb_rank)
            with contextlib.suppress(OSError):
                os.makedirs(runtime_dir, exist_ok=True)
                open(key_log, "w").close()       # this start's compiles only
        self.tb_accountant = JitAccountant(on_jit_after_ready=self._on_jit_after_ready, key_log=key_log)
        self.tb_status: StatusWriter | None = None
        self.tb_active_paths: dict[str, Any] = {}
        if not s.active:
            return
        self.tb_status = StatusWriter(runtime_dir, self.tb_rank, {
            "plugin_version": __version__, "stage": "starting", "gdn_path": "vllm",
            "settings": s.to_dict(), "active": {}})
        # Count every compile in this process from now on; vLLM's monitor will chain to us later.
        self.tb_active_paths["jit_accounting"] = self.tb_accountant.install()
        # vLLM 0.21 faults a client can trigger (wrong allowed_token_ids masks, an engine-killing gather):
        # patched before the model runner builds its InputBatch; each says applied or why not
        self.tb_active_paths["vllm_fixes"] = apply_all()
        threads = autotune.compile_threads(s.autotune_compile_threads, autotune.usable_cpus(),
                                           _gpu_workers_on_host(self.vllm_config))
        self.tb_active_paths["autotune_patch"] = autotune.install(
            # TRITON_CACHE_DIR: set by the launcher for vLLM and Triton, read here as Triton reads it
            prune_num_stages=s.prune_autotune, stable_cache_dir=contract.variable("TRITON_CACHE_DIR"), threads=threads)
        self.tb_active_paths["autotune_compile_threads"] = threads if self.tb_active_paths["autotune_patch"] else 0
        self._require(self.tb_active_paths["jit_accounting"], "Triton's post-compile hook could not be installed")
        self.tb_status.update(stage="loading", active=self.tb_active_paths)

    # -- helpers ------------------------------------------------------------------------------
    def _require(self, ok: bool, what: str) -> None:
        if not ok and self.tb_settings.require_plugin:
            self._set_failed(what)
            raise _startup_fail(f"{what}, and require_plugin is set.")

    def _set_failed(self, error: str) -> None:
        if self.tb_status:
            self.tb_status.update(stage="failed", error=error, warmup={"ok": False, "error": error})

    def _on_jit_after_ready(self, name: str, _kwargs: dict) -> None:
        if self.tb_settings.benchmark_mode:
            log.error("turingbox: Triton JIT after ready: %s (benchmark_mode: this run fails)", name)
        else:
            log.warning("turingbox: Triton JIT after ready: %s", name)
        if self.tb_status:
            self.tb_status.update(jit_after_ready=dict(self.tb_accountant.after_ready),
                                  benchmark_failed=bool(self.tb_settings.benchmark_mode))

    def _plan_summary(self) -> dict[str, Any]:
        vc = self.vllm_config
        spec = vc.speculative_config
        backends = sorted({g.backend.get_name() for groups in getattr(self.model_runner, "attn_groups", [])
                           for g in groups}) if hasattr(self, "model_runner") else []
        return {
            "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
            "num_speculative_tokens": spec.num_speculative_tokens if spec else 0,
            "kv_cache_dtype": vc.cache_config.cache_dtype,
            "attention_backends": backends,
            "max_num_seqs": vc.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
            "max_model_len": vc.model_config.max_model_len,
            "cudagraph_capture_sizes": list(vc.compilation_config.cudagraph_capture_sizes or []),
            "enforce_eager": bool(vc.model_config.enforce_eager),
            "async_scheduling": bool(vc.scheduler_config.async_scheduling),
        }

    def _capability(self) -> tuple[int, int] | None:
        """This worker's GPU (a worker process may touch CUDA; the API server and engine core never do)."""
        try:
            import torch

            return tuple(torch.cuda.get_device_capability(self.device))  # type: ignore[return-value]
        except Exception:
            return None

    # -- vLLM hooks ---------------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        s = self.tb_settings
        gdn = s.gdn_path(self._capability()) if s.active else "vllm"
        if gdn == "turbo":
            installed = False
            try:
                installed = bool(gdn_hook.install("turbo"))
            except ImportError as exc:
                log.warning("turingbox: GDN turbo path unavailable: %s", exc)
            self.tb_active_paths["gdn_turbo"] = installed
            if self.tb_status:
                self.tb_status.update(gdn_path="turbo" if installed else "vllm", active=self.tb_active_paths)
            self._require(installed, "the plan asked for the turbo GDN path but it is not active")
        return super().load_model(*args, **kwargs)

    def determine_available_memory(self, *args: Any, **kwargs: Any) -> int:
        """vLLM's KV size for this worker, reported in the status file: a start that profiled it (no
        --kv-cache-memory-bytes) tells the appliance what to give the next start of the same plan, which then skips
        vLLM's CUDA-graph memory profile (issue 35)."""
        available = super().determine_available_memory(*args, **kwargs)
        if self.tb_status:
            given = self.cache_config.kv_cache_memory_bytes is not None
            self.tb_status.update(kv_cache={"bytes": int(available), "given": given})
        return available

    def compile_or_warm_up_model(self, *args: Any, **kwargs: Any):
        s = self.tb_settings
        if not s.active:
            return super().compile_or_warm_up_model(*args, **kwargs)
        assert self.tb_status is not None
        self.tb_status.update(stage="compiling")
        # Every Triton launch of vLLM's own warmup and of the strict warmup is recorded, so that the
        # sweep after the waves can compile the other int classes of the arguments that follow the batch.
        self.tb_launches = LaunchRecorder()
        with deferred_jit_monitor() as monitor_calls, self.tb_launches.recording():
            result = super().compile_or_warm_up_model(*args, **kwargs)
        summary = self._plan_summary()
        log.info("turingbox plugin %s active in worker %d (rank %d of its engine, pid %d)", __version__, self.tb_rank,
                 self.rank, os.getpid())
        log.info("turingbox plan: TP %d, MTP depth %d, KV dtype %s, backend %s, max_num_seqs %d, "
                 "capture sizes %s", summary["tensor_parallel_size"], summary["num_speculative_tokens"],
                 summary["kv_cache_dtype"], ",".join(summary["attention_backends"]) or "?",
                 summary["max_num_seqs"], summary["cudagraph_capture_sizes"])
        self.tb_status.update(stage="warming", plan=summary)
        error = None
        waves_report: list[dict] = []
        kernels_at_start = self.tb_accountant.kernels_before_ready()
        start = time.monotonic()
        try:
            waves_report = self._strict_warmup(summary)
        except Exception as exc:  # reported below, fatal when strict
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        finally:
            self.tb_launches = None    # the recorded stand-ins are for the sweep only
        seconds = round(time.monotonic() - start, 3)
        from vllm.utils.torch_utils import set_random_seed

        set_random_seed(self.model_config.seed)  # as the parent does: warmup must not shift RNG state
        kernels = self.tb_accountant.kernels_before_ready()
        warmup = {"kernels": kernels, "strict_warmup_kernels": kernels - kernels_at_start,
                  "seconds": seconds, "ok": error is None, "error": error, "waves": waves_report}
        if error is not None:
            self.tb_status.update(warmup=warmup)
            if s.strict_warmup:
                self._set_failed(f"strict warmup failed: {error}")
                raise _startup_fail(f"strict warmup failed on worker {self.tb_rank}: {error}")
            log.warning("turingbox: warmup failed (not strict, continuing): %s", error)
        # Ready: from here on every compile is a JIT on the request path.
        self.tb_accountant.mark_ready()
        if monitor_calls:
            from vllm.triton_utils import jit_monitor

            jit_monitor.activate()
        self.tb_status.update(stage="ready", warmup=warmup, ready_at=time.time())
        log.info("turingbox warmup: %d kernels, %d JIT (%d compiled by the strict warmup in %.1f s)",
                 kernels, sum(self.tb_accountant.after_ready.values()), kernels - kernels_at_start, seconds)
        return result

    def _strict_warmup(self, summary: dict[str, Any]) -> list[dict]:
        reason = driver.unsupported_reason(self.vllm_config)
        if reason:
            raise driver.WarmupError(reason)
        s = self.tb_settings
        # The running config is the truth; the plan's numbers are cross-checked, never trusted blindly.
        if s.num_speculative_tokens is not None and s.num_speculative_tokens != summary["num_speculative_tokens"]:
            raise driver.WarmupError(
                f"the plan asked for MTP depth {s.num_speculative_tokens} but vLLM runs depth "
                f"{summary['num_speculative_tokens']}")
        waves = plan_waves(summary["max_num_seqs"], summary["num_speculative_tokens"], summary["max_model_len"],
                           summary["max_num_batched_tokens"], tuple(summary["cudagraph_capture_sizes"]))
        log.info("turingbox strict warmup: %s", summarize(waves))
        with self.tb_launches.recording():
            report = driver.run_waves(self, waves)
            # one line with each wave's seconds: where a start's strict warmup goes (issue 18's profile)
            log.info("turingbox strict warmup: %s", driver.describe_waves(report))
            report.extend(self._structured_output_warmup(summary))
        try:
            sweep = self.tb_launches.sweep()
        except Exception as exc:       # the sweep widens coverage; it must never cost the start
            log.exception("turingbox strict warmup: specialization sweep failed")
            report.append({"wave": "specialization-sweep", "error": f"{type(exc).__name__}: {exc}"})
            return report
        log.info("turingbox strict warmup: specialization sweep: %d kernels with batch-dependent ints, %d variants, "
                 "%d new compiles in %.1f s%s", sweep.kernels, sweep.variants, sweep.compiled, sweep.seconds,
                 f"; {len(sweep.failed)} failed: {'; '.join(sweep.failed[:3])}" if sweep.failed else "")
        for name, argnames in sorted(sweep.arguments.items()):
            log.debug("turingbox sweep: %s: %s", name, ", ".join(argnames))
        report.append(sweep.to_dict())
        return report

    def _structured_output_warmup(self, summary: dict[str, Any]) -> list[dict]:
        """Grammar requests' bitmask kernel (see structured.py); skipped with one line where it cannot run."""
        reason = structured.skip_reason(self)
        if reason:
            log.info("turingbox strict warmup: structured-output bitmask skipped: %s", reason)
            return [{"wave": "structured-output-bitmask", "skipped": reason}]
        cases = plan_bitmask_cases(self.vllm_config.model_config.get_vocab_size(), summary["max_num_seqs"],
                                   summary["num_speculative_tokens"])
        log.info("turingbox strict warmup: structured-output bitmask: %s", summarize_bitmask(cases))
        compiled = self.tb_accountant.before_ready if self.tb_accountant.installed else None
        # A StructuredWarmupError is reported like any warmup failure by compile_or_warm_up_model.
        return [structured.run_bitmask_warmup(self, cases, compiled)]
