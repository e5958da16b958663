"""Which requests the strict worker warmup runs: a pure function of the plan's shape limits.

Triton specialises integer arguments by value class (== 1, divisible by 16, anything else) and
pointer arguments by alignment/None-ness, so a request compiles a new kernel variant exactly when it
reaches a kernel with a new combination of those classes. The warmup therefore runs small "waves"
of real requests through vLLM's own scheduler and model runner (prefill, decode, MTP draft and
verify, greedy / sampled / mixed batches, staggered arrivals for mixed prefill+decode steps, a
chunked long prompt and its prefix-cache hit) at the smallest set of concurrencies that covers
every reachable class of (requests, tokens per step, CUDA-graph padded tokens).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

SAMPLING_PRESETS = ("greedy", "sampled", "penalized", "seeded")


def int_class(x: int) -> str:
    """Triton's integer specialisation class."""
    if x == 1:
        return "one"
    if x % 16 == 0:
        return "div16"
    return "other"


def padded_size(n: int, capture_sizes: tuple[int, ...]) -> int:
    """The CUDA-graph size a batch of n tokens is padded to (n itself beyond the largest)."""
    if not capture_sizes:
        return n
    i = bisect.bisect_left(capture_sizes, n)
    return capture_sizes[i] if i < len(capture_sizes) else n


def choose_concurrencies(max_num_seqs: int, num_spec_tokens: int, capture_sizes: tuple[int, ...] = (),
                         scan_limit: int = 512, max_count: int = 6) -> list[int]:
    """Smallest concurrencies covering every reachable specialisation key of a decode step."""
    tokens_per_req = 1 + max(0, num_spec_tokens)
    sizes = tuple(sorted(set(capture_sizes)))
    seen: set[tuple[str, str, str]] = set()
    chosen: list[int] = []
    for n in range(1, min(max_num_seqs, scan_limit) + 1):
        t = n * tokens_per_req
        key = (int_class(n), int_class(t), int_class(padded_size(t, sizes)))
        if key not in seen:
            seen.add(key)
            chosen.append(n)
            if len(chosen) >= max_count:
                break
    return chosen


@dataclass(frozen=True)
class RequestSpec:
    prompt_len: int
    max_tokens: int
    sampling: str          # one of SAMPLING_PRESETS
    prompt_seed: int       # same seed + length => same prompt (prefix-cache hit)
    delay_steps: int = 0   # join the batch after this many engine steps


@dataclass(frozen=True)
class Wave:
    name: str
    requests: tuple[RequestSpec, ...] = field(default_factory=tuple)


def plan_waves(max_num_seqs: int, num_spec_tokens: int, max_model_len: int,
               max_num_batched_tokens: int, capture_sizes: tuple[int, ...] = ()) -> list[Wave]:
    if max_num_seqs < 1 or max_model_len < 4 or max_num_batched_tokens < 1:
        raise ValueError(f"cannot plan warmup for max_num_seqs={max_num_seqs}, max_model_len={max_model_len}, "
                         f"max_num_batched_tokens={max_num_batched_tokens}")
    k = max(0, num_spec_tokens)
    # Enough tokens for several draft+verify rounds even when every draft is accepted.
    max_tokens = max(8, 3 * (k + 1) + 2)
    budget = max_model_len - max_tokens - 1

    def plen(n: int) -> int:
        return max(1, min(n, budget))

    waves: list[Wave] = [
        Wave("single-greedy-1tok", (RequestSpec(1, max_tokens, "greedy", 1),)),
        Wave("single-sampled-32tok", (RequestSpec(plen(32), max_tokens, "sampled", 2),)),
    ]
    long_len = plen(max_num_batched_tokens + 37)   # > one step's token budget: chunked prefill
    if long_len > 64:
        waves.append(Wave("long-prompt-chunked", (RequestSpec(long_len, max_tokens, "greedy", 3),)))
        waves.append(Wave("long-prompt-prefix-hit", (RequestSpec(long_len, max_tokens, "sampled", 3),)))
    concurrencies = [n for n in choose_concurrencies(max_num_seqs, k, capture_sizes) if n > 1]
    for n in concurrencies:
        reqs = tuple(
            RequestSpec(plen(37 + 3 * i), max_tokens, SAMPLING_PRESETS[i % len(SAMPLING_PRESETS)],
                        100 + n * 1000 + i, delay_steps=2 if i >= (n + 1) // 2 else 0)
            for i in range(n))
        waves.append(Wave(f"batch-{n}-mixed-staggered", reqs))
    if concurrencies:
        top = concurrencies[-1]
        for preset in ("greedy", "sampled"):
            waves.append(Wave(f"batch-{top}-all-{preset}", tuple(
                RequestSpec(plen(21 + i), max_tokens, preset, 50_000 + top * 10 + i) for i in range(top))))
    return waves


def summarize(waves: list[Wave]) -> str:
    return ", ".join(f"{w.name}({len(w.requests)})" for w in waves)
