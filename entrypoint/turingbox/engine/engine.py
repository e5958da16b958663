"""One vLLM start, the sequence serve and warmup share: start -> wait -> check -> stop.

start: vLLM under a Supervisor (its own process group) with the plan's argv and the environment the caller built,
plus a status directory of this start's own (two instances on one host must not read each other's worker files).
wait: until vLLM answers /health and /v1/models, with a deadline, failing fast if the process died. check: the
workers' plugin reports. stop: SIGTERM to the group, a grace period, SIGKILL. Each step reports its stage to the
caller's callback (ENGINE_STAGES), so serve advances its startup stages and warmup prints its stage lines; what
runs between the steps (the active warmup) is the caller's.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import BinaryIO, Callable, Mapping, Sequence

from turingbox.engine.diagnosis import FailureDiagnosis
from turingbox.engine.launch import (EngineNotAnswering, flag_value, free_loopback_port, instance_runtime_dir,
                                     read_workers, strict_warmup_problems, vllm_argv, wait_until_answering,
                                     worker_check)
from turingbox.engine.supervisor import Supervisor, describe_exit
from turingbox.plan.types import Plan
from turingbox_plugin.contract import RUNTIME_DIR_ENV    # where the plugin in vLLM's workers writes its status files

# The stages a start reports, in order (also lines of the seed's stage protocol: warmup prints them as they come).
ENGINE_START = "engine-start"          # the process is about to be spawned
ENGINE_READY = "engine-ready"          # it answers /health and /v1/models
ENGINE_CHECK = "strict-warmup"         # the workers' plugin reports are being checked
ENGINE_STOP = "engine-stop"            # it is being stopped
ENGINE_STAGES = (ENGINE_START, ENGINE_READY, ENGINE_CHECK, ENGINE_STOP)

__all__ = ["Engine", "EngineNotAnswering", "EngineUnfit", "ENGINE_STAGES"]


class EngineUnfit(Exception):
    """vLLM answers, but its workers' plugin reports say it must not serve; the message is one sentence."""


class Engine:
    """One vLLM process of one plan: start() -> wait_until_answering() -> check() -> stop().

    The constructor makes the start's own status directory (runtime_dir, under runtime_base); the caller removes it
    (remove_runtime_dir) once nothing reads the workers' files any more. A caller that must reach the process group
    before the plan exists (serve's signal handlers) passes its own supervisor, and then feeds its output lines to
    the failure diagnosis itself; otherwise the engine makes one whose lines go to the diagnosis, then on_line.
    """

    def __init__(self, plan: Plan, *, env: Mapping[str, str], runtime_base: str, kind: str,
                 vllm_command: str | None, passthrough: Sequence[str] = (), extra_args: Sequence[str] = (),
                 upstream_port: int | None = None,
                 answer_timeout_s: float, stop_grace_s: float,
                 on_stage: Callable[[str], None] | None = None, on_line: Callable[[str], None] | None = None,
                 supervisor: Supervisor | None = None, diagnosis: FailureDiagnosis | None = None,
                 output: BinaryIO | None = None) -> None:
        self.plan = plan
        self.answer_timeout_s = answer_timeout_s
        self.stop_grace_s = stop_grace_s
        self.on_stage = on_stage or (lambda name: None)
        self.on_line = on_line
        self.api_key = flag_value(list(passthrough), "--api-key")    # a key vLLM itself was given (after --)
        self.port = upstream_port or free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # extra_args: what this start adds to the plan's (a recorded KV size), before the operator's `--` args
        self.argv = vllm_argv([*plan.vllm_args, *extra_args], self.port, list(passthrough), vllm_command)
        self.diagnosis = diagnosis or FailureDiagnosis()
        self.supervisor = supervisor or Supervisor(on_line=self._observe_line,
                                                   output=output if output is not None else sys.stdout.buffer)
        self.runtime_dir = instance_runtime_dir(runtime_base, kind)
        self.env = {**env, RUNTIME_DIR_ENV: self.runtime_dir}
        self.deadline: float | None = None          # of the wait; set when it begins
        self.served_models: list[str] = []          # what /v1/models answered

    @property
    def served_model(self) -> str:
        """The model name requests use."""
        return self.plan.served_model_name or self.plan.model

    @property
    def running(self) -> bool:
        return self.supervisor.running

    def _observe_line(self, line: str) -> None:
        self.diagnosis.observe(line)          # first: a caller's error must not hide a cause
        if self.on_line:
            self.on_line(line)

    async def start(self) -> None:
        self.on_stage(ENGINE_START)
        await self.supervisor.start(self.argv, self.env)

    async def wait_until_answering(self, timed_out: Callable[[], str], fail_on_exit: bool = True) -> list[str]:
        """Until vLLM answers, at most answer_timeout_s from now; returns the served model ids. Raises
        EngineNotAnswering with timed_out()'s sentence past the deadline, and, with fail_on_exit, at once when
        the process exits (serve watches the process itself and says why it died)."""
        self.deadline = time.monotonic() + self.answer_timeout_s
        running = (lambda: self.supervisor.running) if fail_on_exit else (lambda: True)
        self.served_models = await wait_until_answering(self.url, self.deadline, running, self.api_key,
                                                        what_timed_out=timed_out, exit_sentence=self.exit_sentence)
        self.on_stage(ENGINE_READY)
        return self.served_models

    def exit_sentence(self) -> str:
        return " ".join(filter(None, (
            f"vLLM exited before it was ready ({describe_exit(self.supervisor.returncode)}).",
            self.diagnosis.sentence)))

    def seconds_left(self) -> float:
        """Until the wait's deadline (negative once past)."""
        return (self.deadline if self.deadline is not None else time.monotonic()) - time.monotonic()

    def workers(self) -> list[dict]:
        """The workers' plugin reports of this start (their status files)."""
        return read_workers(self.runtime_dir)

    def check(self, strict: bool) -> list[dict]:
        """The workers' plugin reports, checked; returns them, or raises EngineUnfit with one sentence.

        strict (a seed, which must prove a warm engine): every rank of TP x DP reported a passing warmup and none
        compiled a kernel after ready, whatever require_plugin says. Otherwise (serve): as the plan's
        require_plugin asks (launch.worker_check)."""
        self.on_stage(ENGINE_CHECK)
        plan, workers = self.plan, self.workers()
        if strict:
            problems = strict_warmup_problems(workers, plan.tensor_parallel_size, plan.data_parallel_size)
            if problems:
                raise EngineUnfit("Strict warmup did not pass: " + "; ".join(problems) + ".")
        else:
            problem = worker_check(workers, plan.tensor_parallel_size, plan.plugin.require_plugin,
                                   plan.data_parallel_size)
            if problem:
                raise EngineUnfit(problem)
        return workers

    async def stop(self) -> int | None:
        """SIGTERM to the process group, stop_grace_s for it to exit, then SIGKILL; the exit code (None: never
        started, and nothing reported)."""
        if self.supervisor.proc is None:
            return None
        self.on_stage(ENGINE_STOP)
        return await self.supervisor.stop(self.stop_grace_s)

    def remove_runtime_dir(self) -> None:
        """Delete this start's status directory (the engine is stopped: nothing reads it any more)."""
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
