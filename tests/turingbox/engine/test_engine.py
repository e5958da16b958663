"""turingbox.engine.engine.Engine, the one start sequence serve and warmup share (start -> wait -> check -> stop),
against a real stand-in vLLM process (tests/support/fake_vllm.py) and its worker status files."""
from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import sys

import pytest

from tests.support import plan_factory
from tests.support.sidecar_harness import FAKE_VLLM, pid_alive
from turingbox.engine.engine import ENGINE_STAGES, Engine, EngineNotAnswering, EngineUnfit
from turingbox.engine.launch import vllm_env


def make_engine(tmp_path, *fake_flags: str, stages: list, answer_timeout_s: float = 30.0, **plan_changes) -> Engine:
    plan = plan_factory.planned(**plan_changes)
    parent = {k: v for k, v in os.environ.items() if not k.startswith(("TURINGBOX_", "FAKE_VLLM_"))}
    return Engine(plan, env=vllm_env(parent, plan.env), runtime_base=str(tmp_path / "runtime"), kind="warmup",
                  vllm_command=f"{sys.executable} {FAKE_VLLM}", passthrough=list(fake_flags),
                  answer_timeout_s=answer_timeout_s, stop_grace_s=5.0, on_stage=stages.append, output=io.BytesIO())


def run(coro):
    return asyncio.run(coro)


def test_a_start_answers_reports_every_worker_and_stops_with_its_stages_in_order(tmp_path):
    stages: list[str] = []
    engine = make_engine(tmp_path, stages=stages)
    assert os.path.isdir(engine.runtime_dir) and engine.env["TBPLUGIN_RUNTIME_DIR"] == engine.runtime_dir
    assert os.path.dirname(engine.runtime_dir) == str(tmp_path / "runtime")

    async def sequence():
        await engine.start()
        try:
            models = await engine.wait_until_answering(lambda: "late")
            workers = engine.check(strict=True)
            assert engine.check(strict=False) == workers
            return models, workers, engine.supervisor.pid
        finally:
            await engine.stop()
    models, workers, pid = run(sequence())
    assert models[0] == engine.served_model == engine.plan.served_model_name     # the plan names it first
    assert [w["rank"] for w in workers] == [0] and workers[0]["warmup"]["ok"]
    assert stages == [*ENGINE_STAGES[:2], ENGINE_STAGES[2], ENGINE_STAGES[2], ENGINE_STAGES[3]]
    assert not pid_alive(pid)
    engine.remove_runtime_dir()
    assert not os.path.exists(engine.runtime_dir)


def test_an_engine_never_started_stops_without_a_stage(tmp_path):
    stages: list[str] = []
    engine = make_engine(tmp_path, stages=stages)
    assert run(engine.stop()) is None and stages == []
    engine.remove_runtime_dir()


def test_the_wait_fails_fast_when_vllm_dies_and_says_why(tmp_path):
    stages: list[str] = []
    engine = make_engine(tmp_path, "--fake-fail-at", "loading", "--fake-fail-line",
                         "Available KV cache memory: -3.5 GiB", stages=stages, answer_timeout_s=120.0)

    async def sequence():
        await engine.start()
        try:
            await engine.wait_until_answering(lambda: "timed out")
        finally:
            await engine.stop()
    with pytest.raises(EngineNotAnswering) as exc:
        run(sequence())
    message = str(exc.value)
    assert message.startswith("vLLM exited before it was ready (exit code 3).")
    assert "vLLM found -3.5 GiB left for its KV cache" in message       # the diagnosis of its lines
    assert stages == ["engine-start", "engine-stop"]
    engine.remove_runtime_dir()


def test_past_its_deadline_the_wait_says_what_timed_out(tmp_path):
    engine = make_engine(tmp_path, "--fake-startup-seconds", "30", stages=[], answer_timeout_s=0.5)

    async def sequence():
        await engine.start()
        try:
            await engine.wait_until_answering(lambda: "vLLM did not answer within the test's 0.5 s.")
        finally:
            await engine.stop()
    with pytest.raises(EngineNotAnswering, match=r"^vLLM did not answer within the test's 0\.5 s\.$"):
        run(sequence())
    engine.remove_runtime_dir()


@pytest.mark.parametrize("flags, strict, sentence", [
    (("--fake-plugin", "fail"), True, "Strict warmup did not pass: worker 0 warmup failed: fake warmup failure."),
    (("--fake-plugin", "fail"), False, "The plugin's strict warmup failed on worker 0 (fake warmup failure)"),
    (("--fake-plugin", "missing"), True, "Strict warmup did not pass: 0 of 1 workers reported their warmup."),
    (("--fake-plugin", "missing"), False, "The turingbox plugin did not report from worker(s) 0 of 1"),
    (("--fake-jit-after-ready", "fused_moe=2"), True,
     "Strict warmup did not pass: worker 0 compiled after ready: fused_moe."),
])
def test_the_check_refuses_workers_unfit_to_serve(tmp_path, flags, strict, sentence):
    engine = make_engine(tmp_path, *flags, stages=[])

    async def sequence():
        await engine.start()
        try:
            await engine.wait_until_answering(lambda: "timed out")
            engine.check(strict=strict)
        finally:
            await engine.stop()
    with pytest.raises(EngineUnfit) as exc:
        run(sequence())
    assert str(exc.value).startswith(sentence), str(exc.value)
    engine.remove_runtime_dir()


def test_serve_without_require_plugin_accepts_workers_that_did_not_report(tmp_path):
    plugin = dataclasses.replace(plan_factory.planned().plugin, require_plugin=False)
    engine = make_engine(tmp_path, "--fake-plugin", "missing", stages=[], plugin=plugin)

    async def sequence():
        await engine.start()
        try:
            await engine.wait_until_answering(lambda: "timed out")
            return engine.check(strict=False)
        finally:
            await engine.stop()
    assert run(sequence()) == []
    engine.remove_runtime_dir()
