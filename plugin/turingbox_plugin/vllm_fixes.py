"""Fixes to vLLM 0.21.0 behaviour that a client can trigger, applied in the worker process only.

Each fix names the upstream report, checks that vLLM's source still contains the code it corrects (so a vLLM
upgrade makes it step aside, logged, instead of patching code it does not know), and is idempotent.

The engine crash our traffic soak found (docs/data/2026-12-01-h200-s5/crash-analysis.md):
 1. `InputBatch` keeps `allowed_token_ids` masks in one persistent CPU tensor, one row per batch slot.
    - `swap_states` swaps two rows by assigning row views, so both rows end up with one mask (vllm#48419).
    - `condense` moves a row down without clearing the old row (vllm#43894).
    - `add_request` writes a row only for a request that has `allowed_token_ids`.
    The GDN backend reorders every step (decodes first), so masks land on other requests: silently wrong
    outputs, and a row with no allowed token when the mask meets that request's grammar.
 2. MTP's rejection sampler turns that all -inf row into the token id `vocab_size` (vllm#44744 and #45060,
    fixed after 0.21). With a logprobs request in the batch, `_get_logprobs_tensors` gathers at that id, and
    the device-side assert kills the engine.
`mask_rows` fixes 1. `logprobs_ids` keeps 2 from killing the engine whatever produced the id: the id is
dropped from the output by `parse_output` anyway, so its logprob is never read.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

log = logging.getLogger("turingbox_plugin.vllm_fixes")

# The code each fix corrects, verbatim from vLLM 0.21.0 (vllm/v1/worker/gpu_input_batch.py and
# vllm/v1/sample/rejection_sampler.py).
SWAP_ROW_VIEWS = """            (
                self.allowed_token_ids_mask_cpu_tensor[i1],
                self.allowed_token_ids_mask_cpu_tensor[i2],
            ) = (
                self.allowed_token_ids_mask_cpu_tensor[i2],
                self.allowed_token_ids_mask_cpu_tensor[i1],
            )"""
CONDENSE_KEEPS_OLD_ROW = """                self.allowed_token_ids_mask_cpu_tensor[empty_index] = (
                    self.allowed_token_ids_mask_cpu_tensor[last_req_index]
                )"""
ADD_WRITES_ONLY_ALLOWED = """            if sampling_params.allowed_token_ids:
                self.has_allowed_token_ids.add(req_id)"""
LOGPROBS_GATHER_UNGUARDED = "accepted_tokens[accepted_tokens == PLACEHOLDER_TOKEN_ID] = 0"


def _unchanged(fn: Callable, needle: str) -> bool:
    try:
        return needle in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def fix_mask_rows() -> str:
    """vllm#48419 + #43894: every batch row's allowed_token_ids mask follows its own request."""
    from vllm.v1.worker import gpu_input_batch

    batch = gpu_input_batch.InputBatch
    if getattr(batch, "_turingbox_mask_rows", False):
        return "applied"
    for fn, needle in ((batch.swap_states, SWAP_ROW_VIEWS), (batch.condense, CONDENSE_KEEPS_OLD_ROW),
                       (batch.add_request, ADD_WRITES_ONLY_ALLOWED)):
        if not _unchanged(fn, needle):
            return f"skipped: InputBatch.{fn.__name__} is not vLLM 0.21.0's"
    swap_states, condense, add_request = batch.swap_states, batch.condense, batch.add_request

    def fixed_swap_states(self: Any, i1: int, i2: int) -> None:
        mask = self.allowed_token_ids_mask_cpu_tensor
        rows = None if mask is None else (mask[i1].clone(), mask[i2].clone())
        swap_states(self, i1, i2)
        if rows is not None:
            mask[i1].copy_(rows[1])
            mask[i2].copy_(rows[0])

    def fixed_condense(self: Any, *args: Any, **kwargs: Any) -> None:
        condense(self, *args, **kwargs)
        mask = self.allowed_token_ids_mask_cpu_tensor
        if mask is not None:
            mask[self.num_reqs:].fill_(False)     # rows past the batch hold no request

    def fixed_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> int:
        index = add_request(self, request, *args, **kwargs)
        mask = self.allowed_token_ids_mask_cpu_tensor
        params = getattr(request, "sampling_params", None)
        if mask is not None and not (params is not None and params.allowed_token_ids):
            mask[index].fill_(False)               # a recycled row may hold an earlier request's mask
        return index

    batch.swap_states, batch.condense, batch.add_request = fixed_swap_states, fixed_condense, fixed_add_request
    batch._turingbox_mask_rows = True
    return "applied"


def fix_logprobs_ids() -> str:
    """An out-of-vocabulary sampled id (vllm#44744/#53029) is not gathered for logprobs: it is dropped anyway."""
    from vllm.v1.sample import rejection_sampler

    sampler = rejection_sampler.RejectionSampler
    if getattr(sampler, "_turingbox_logprobs_ids", False):
        return "applied"
    original = sampler._get_logprobs_tensors
    if not _unchanged(original, LOGPROBS_GATHER_UNGUARDED):
        return "skipped: RejectionSampler._get_logprobs_tensors is not vLLM 0.21.0's"
    placeholder = rejection_sampler.PLACEHOLDER_TOKEN_ID
    placeholder = int(getattr(placeholder, "value", placeholder))      # a tl.constexpr in 0.21

    def guarded(self: Any, max_num_logprobs: int, metadata: Any, logits: Any, target_logits: Any,
                bonus_logits: Any, sampled_token_ids: Any) -> Any:
        # no host sync: an id past the vocabulary becomes the placeholder, which vLLM already maps to 0
        safe = sampled_token_ids.masked_fill(sampled_token_ids >= logits.shape[-1], placeholder)
        return original(self, max_num_logprobs, metadata, logits, target_logits, bonus_logits, safe)

    sampler._get_logprobs_tensors = guarded
    sampler._turingbox_logprobs_ids = True
    return "applied"


FIXES: dict[str, Callable[[], str]] = {"mask_rows": fix_mask_rows, "logprobs_ids": fix_logprobs_ids}


def apply_all() -> dict[str, str]:
    """Apply every fix; {name: "applied" | "skipped: why" | "failed: why"}. Never raises."""
    out: dict[str, str] = {}
    for name, fix in FIXES.items():
        try:
            out[name] = fix()
        except Exception as exc:  # an import that moved: vLLM keeps running unpatched, and we say so
            out[name] = f"failed: {type(exc).__name__}: {exc}"
        if out[name] != "applied":
            log.warning("turingbox vLLM fix %s not applied (%s)", name, out[name])
    return out
