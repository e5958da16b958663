"""Drive a vLLM 0.21 worker through real engine steps with vLLM's own scheduler (worker process only).

Why this and not direct kernel calls: the kernels a first request compiles (`_zero_kv_blocks_kernel`,
`_compute_slot_mapping_kernel`, `eagle_*`, the greedy `rejection_greedy_sample_kernel`,
FlashInfer's `_copy_page_indices_kernel`, GDN prefill/decode, sampler kernels) are specialised on
shapes, alignment and None-ness that only the real code path produces. Re-creating each call site
with hand-made tensors would copy vLLM internals and drift with every release; running the same
`Scheduler.schedule() -> Worker.execute_model() -> Worker.sample_tokens() ->
Scheduler.update_from_output()` loop the engine core runs (`EngineCore.step`) produces the exact
specialisations by construction. The loop mirrors `vllm/v1/worker/gpu/warmup.py` (the V2 runner's
own warmup, which hand-builds SchedulerOutputs) but lets the real scheduler build them, so block
allocation, zeroing lists, spec-decode tokens and async placeholders are what production produces.

Every rank of a TP group runs the identical deterministic sequence (requests use ignore_eos and
fixed lengths), so collectives inside the forward pass stay matched.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Any

from turingbox_plugin.warmup_plan import RequestSpec, Wave

log = logging.getLogger("vllm.turingbox_plugin.warmup")

MAX_STEPS_PER_WAVE = 4096


class WarmupError(RuntimeError):
    pass


class _NoStructuredOutput:
    """Stand-in for StructuredOutputManager: warmup requests use no grammar, and the real manager
    would load the tokenizer (seconds) in every worker. The grammar bitmask kernel is warmed
    separately, with every specialisation a grammar request can reach (structured.py)."""

    def grammar_init(self, request: Any) -> None:
        return None

    def should_advance(self, request: Any) -> bool:
        return False

    def grammar_bitmask(self, *args: Any, **kwargs: Any) -> None:
        return None

    def clear_backend(self) -> None:
        return None


class _TextOnlyRegistry:
    """Scheduler's mm_registry: warmup prompts are text, so no encoder budget (and no processor)."""

    def supports_multimodal_inputs(self, model_config: Any) -> bool:
        return False


def unsupported_reason(vllm_config: Any) -> str | None:
    """Why the scheduler-driven warmup cannot run in this configuration (None when it can)."""
    pc = vllm_config.parallel_config
    if getattr(pc, "pipeline_parallel_size", 1) > 1:
        return "pipeline parallelism is not supported by the turingbox warmup"
    if getattr(pc, "data_parallel_size", 1) > 1:
        # vLLM 0.21 leaves data_parallel_size > 1 only for MoE engines, which step in lockstep; a dense model's DP
        # engines run independently (data_parallel_size 1 each) and each warms up on its own
        return "a MoE model's data-parallel engines step in lockstep, which the turingbox warmup does not drive"
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return "a KV connector is configured; the turingbox warmup would send dummy KV through it"
    if getattr(vllm_config.model_config, "runner_type", "generate") != "generate":
        return "only generative models are warmed up"
    return None


def _sampling_params(preset: str, max_tokens: int, seed: int):
    from vllm.sampling_params import SamplingParams

    common = dict(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    if preset == "greedy":
        return SamplingParams(temperature=0.0, **common)
    if preset == "sampled":
        return SamplingParams(temperature=0.7, top_p=0.95, top_k=20, **common)
    if preset == "penalized":
        return SamplingParams(temperature=1.0, top_p=0.9, presence_penalty=0.5,
                              frequency_penalty=0.3, repetition_penalty=1.05, **common)
    if preset == "seeded":
        return SamplingParams(temperature=0.8, seed=seed, **common)
    raise ValueError(f"unknown sampling preset {preset!r}")


def _prompt(spec: RequestSpec, vocab_size: int) -> list[int]:
    rng = random.Random(spec.prompt_seed)
    hi = max(16, min(vocab_size, 150_000)) - 1
    return [rng.randint(10, hi) for _ in range(spec.prompt_len)]


class SchedulerDriver:
    def __init__(self, worker: Any):
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

        self.worker = worker
        self.vllm_config = worker.vllm_config
        runner = worker.model_runner
        kv_cache_config = runner.kv_cache_config
        sched_cls = self.vllm_config.scheduler_config.get_scheduler_cls()
        block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, self.vllm_config)
        self.scheduler = sched_cls(
            vllm_config=self.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=_NoStructuredOutput(),
            block_size=block_size,
            hash_block_size=hash_block_size,
            mm_registry=_TextOnlyRegistry(),
            include_finished_set=False,
            log_stats=False,
        )
        self.block_hasher = None
        cache_config = self.vllm_config.cache_config
        if cache_config.enable_prefix_caching:
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(hash_block_size, hash_fn)
        self.async_scheduling = bool(self.vllm_config.scheduler_config.async_scheduling)
        self.spec_decode = self.vllm_config.speculative_config is not None
        self.vocab_size = self.vllm_config.model_config.get_vocab_size()
        self.steps = 0
        self._ids = 0

    def _request(self, spec: RequestSpec):
        from vllm.v1.request import Request

        self._ids += 1
        return Request(
            request_id=f"turingbox-warmup-{self._ids}",
            prompt_token_ids=_prompt(spec, self.vocab_size),
            sampling_params=_sampling_params(spec.sampling, spec.max_tokens, spec.prompt_seed),
            pooling_params=None,
            block_hasher=self.block_hasher,
        )

    def step(self) -> None:
        """One EngineCore.step(): schedule, execute, sample, update (and feed drafts back)."""
        sched = self.scheduler
        scheduler_output = sched.schedule()
        output = self.worker.execute_model(scheduler_output)
        if output is None:
            output = self.worker.sample_tokens(sched.get_grammar_bitmask(scheduler_output))
        if hasattr(output, "get_output"):  # AsyncModelRunnerOutput
            output = output.get_output()
        sched.update_from_output(scheduler_output, output)
        if not self.async_scheduling and self.spec_decode and scheduler_output.total_num_scheduled_tokens:
            drafts = self.worker.take_draft_token_ids()
            if drafts is not None:
                sched.update_draft_token_ids(drafts)
        self.steps += 1

    def run_wave(self, wave: Wave) -> dict[str, Any]:
        start, steps0 = time.monotonic(), self.steps
        pending = sorted(wave.requests, key=lambda r: r.delay_steps)
        local_step = 0
        while pending or self.scheduler.has_requests():
            while pending and pending[0].delay_steps <= local_step:
                self.scheduler.add_request(self._request(pending.pop(0)))
            self.step()
            local_step += 1
            if local_step > MAX_STEPS_PER_WAVE:
                raise WarmupError(f"warmup wave {wave.name} did not finish within {MAX_STEPS_PER_WAVE} steps")
        return {"wave": wave.name, "requests": len(wave.requests), "steps": self.steps - steps0,
                "seconds": round(time.monotonic() - start, 3)}


def describe_waves(results: list[dict[str, Any]]) -> str:
    """One log line with each wave's seconds: where a start's strict warmup goes."""
    total = sum(r["seconds"] for r in results)
    return f"waves in {total:.1f} s: " + ", ".join(
        f"{r['wave']} {r['seconds']:.2f} s ({r['steps']} steps)" for r in results)


def run_waves(worker: Any, waves: list[Wave]) -> list[dict[str, Any]]:
    import torch

    driver = SchedulerDriver(worker)
    results = []
    with torch.inference_mode():
        for wave in waves:
            try:
                results.append(driver.run_wave(wave))
            except WarmupError:
                raise
            except Exception as exc:
                raise WarmupError(f"warmup wave {wave.name} failed: {type(exc).__name__}: {exc}") from exc
            log.debug("turingbox warmup wave %s", results[-1])
    torch.accelerator.synchronize() if hasattr(torch, "accelerator") else torch.cuda.synchronize()
    return results
