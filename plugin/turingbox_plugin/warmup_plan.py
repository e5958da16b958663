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
    if max_num_seqs >= 2:
        # Short prompts joining running decodes one per step: the step's prefill then has exactly 1, 16 or 17
        # tokens beside the (speculative) decodes, the GDN prefill path that splits spec from non-spec tokens
        # (index_select, then fused_post_conv_prep with L = prefill tokens). Issue 15's second soak compiled
        # `_fused_post_conv_kernel` after ready on a 1-token prompt that arrived while three requests decoded;
        # no other wave has a prefill that short beside decodes. The decoders run long enough for all three
        # joiners even when every draft is accepted.
        joiners = tuple(RequestSpec(plen(n), max_tokens, "greedy", 70_000 + n, delay_steps=2 + 2 * i)
                        for i, n in enumerate((1, 16, 17)))
        long_tokens = min(3 * max_tokens, max_model_len - plen(40) - 1)    # >= max_tokens: plen leaves room
        decoders = (RequestSpec(plen(37), long_tokens, "greedy", 70_101),
                    RequestSpec(plen(40), long_tokens, "sampled", 70_102))
        waves.append(Wave("short-prompts-join-decodes", decoders[:max(1, min(2, max_num_seqs - 1))] + joiners))
    if concurrencies:
        top = concurrencies[-1]
        for preset in ("greedy", "sampled"):
            waves.append(Wave(f"batch-{top}-all-{preset}", tuple(
                RequestSpec(plen(21 + i), max_tokens, preset, 50_000 + top * 10 + i) for i in range(top))))
    return waves


def summarize(waves: list[Wave]) -> str:
    return ", ".join(f"{w.name}({len(w.requests)})" for w in waves)


# -- structured output ------------------------------------------------------------------------
# vLLM 0.21 applies a request's grammar in `apply_grammar_bitmask`
# (vllm/v1/structured_output/utils.py), called from GPUModelRunner.sample_tokens, which launches
# xgrammar's `apply_token_bitmask_inplace_kernel` (Triton) on the GPU logits as they are: no cast,
# so in the model's logits dtype (bf16 for the demo model), shape (sampled rows, vocab). Its
# arguments per launch: logits, the bitmask re-ordered to (logits rows, ceil(vocab / 32)) int32,
# `indices` (None when every sampled row belongs to a structured request, else an int32 tensor of
# those rows), num_rows = number of structured rows, vocab_size, the two row strides. Per model
# only `indices` None-ness and num_rows' class vary, so there are at most 2 x 3 variants. A request
# owns 1 + (scheduled draft tokens) logits rows, which is where MTP depth comes in.
BITMASK_KERNEL = "apply_token_bitmask_inplace_kernel"


def bitmask_cols(vocab_size: int) -> int:
    """Columns of xgrammar's token bitmask: one int32 per 32 tokens (xgr.allocate_token_bitmask)."""
    return -(-vocab_size // 32)


@dataclass(frozen=True)
class BitmaskCase:
    """One engine step with structured requests, as apply_grammar_bitmask sees it."""
    drafts: tuple[int, ...]        # scheduled draft tokens per request, in batch order
    structured: tuple[bool, ...]   # which of those requests carry a grammar
    vocab_size: int

    @property
    def logits_rows(self) -> int:
        return sum(1 + d for d in self.drafts)

    @property
    def mask_rows(self) -> int:
        """Rows of the scheduler's bitmask = the kernel's num_rows."""
        return sum(1 + d for d, s in zip(self.drafts, self.structured) if s)

    @property
    def uses_indices(self) -> bool:
        return self.mask_rows != self.logits_rows

    @property
    def grammar_bitmask_shape(self) -> tuple[int, int]:
        """What the scheduler sends (GrammarOutput.grammar_bitmask, int32)."""
        return (self.mask_rows, bitmask_cols(self.vocab_size))

    @property
    def kernel_bitmask_shape(self) -> tuple[int, int]:
        """What the kernel gets after apply_grammar_bitmask re-orders it to the logits rows."""
        return (self.logits_rows, bitmask_cols(self.vocab_size))

    @property
    def key(self) -> tuple[bool, str]:
        """The launch's specialisation inside one model: indices None-ness and num_rows' class."""
        return (self.uses_indices, int_class(self.mask_rows))

    @property
    def name(self) -> str:
        return (f"bitmask-{self.mask_rows}of{self.logits_rows}rows-"
                f"{'indices' if self.uses_indices else 'noindices'}")


def _structured_drafts(rows: int, k: int) -> tuple[int, ...]:
    """Fewest requests owning `rows` logits rows at draft depth <= k (full drafts first)."""
    n = -(-rows // (k + 1))
    left = rows - n
    drafts = []
    for _ in range(n):
        d = min(k, left)
        drafts.append(d)
        left -= d
    return tuple(drafts)


def plan_bitmask_cases(vocab_size: int, max_num_seqs: int, num_spec_tokens: int) -> list[BitmaskCase]:
    """One step per reachable (indices None-ness, num_rows class), with the smallest batch that has it.

    All-structured batches can own 1 .. max_num_seqs * (k + 1) rows; a batch that mixes in one
    unstructured request (its rows are skipped through `indices`) needs max_num_seqs >= 2. "other"
    prefers k + 1 rows (one request decoding with a full draft, the commonest real step).
    """
    if vocab_size < 1 or max_num_seqs < 1:
        raise ValueError(f"cannot plan structured-output warmup for vocab_size={vocab_size}, "
                         f"max_num_seqs={max_num_seqs}")
    k = max(0, num_spec_tokens)
    per_req = k + 1
    cases: list[BitmaskCase] = []
    for uses_indices in (False, True):
        max_rows = (max_num_seqs - (1 if uses_indices else 0)) * per_req
        for rows in (1, per_req if int_class(per_req) == "other" else 2, 16):  # classes one, other, div16
            if rows > max_rows:
                continue
            drafts = _structured_drafts(rows, k)
            structured = (True,) * len(drafts)
            if uses_indices:  # an unstructured request mid-decode ahead of the structured ones
                drafts, structured = (k,) + drafts, (False,) + structured
            cases.append(BitmaskCase(drafts, structured, vocab_size))
    return cases


def summarize_bitmask(cases: list[BitmaskCase]) -> str:
    return ", ".join(c.name for c in cases)
