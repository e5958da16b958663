"""Fixes to vLLM 0.21.0 behaviour that a client can trigger, applied in the worker process (`apply_all`),
and patches register() applies in every vLLM process (`apply_at_register`): `fix_allowed_vs_grammar`, a
request validation (API server), `fix_terminated_grammar` (the scheduler's grammars, engine core),
`fix_allowed_ids_dead_end` (a mid-output dead end of allowed_token_ids: engine core and API server), and two startup
shortcuts: `skip_text_only_model_import` for `--language-model-only` and `defer_tokenizer_pool` (API server).

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
dropped from the output by `parse_output` anyway, so its logprob is never read. `prompt_logprobs_slices` keeps
a prompt_logprobs request from needing GiBs that vLLM's memory profile never reserved (session 10's soak).
`compile_key_locations` keeps vLLM's compile cache valid under another HOME (session 11's startup A/B), and
`kv_size_out_of_compile_key` under `--kv-cache-memory-bytes` (issue 35: the KV size a seed measured).
`tokenizer_pool_after_engine_start` takes the API server's tokenizer copies off the path to ready (session 12).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import queue
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger("vllm.turingbox_plugin.vllm_fixes")   # under vLLM's configured logger, or INFO lines vanish

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


# vLLM 0.21.0's RejectionSampler.forward: the kernel's output ids go on unchecked (to the next step's input and the
# drafter's).
FORWARD_CALLS_REJECTION_SAMPLE = "output_token_ids = rejection_sample("


def fix_out_of_vocab_ids() -> str:
    """An id past the vocabulary never leaves MTP's rejection sampler: it becomes 0, the id vLLM samples from an
    all -inf row without speculative decoding.

    Whatever leaves a row with no token (a grammar beside allowed_token_ids or bad_words mid-output; min_tokens is
    handled by fix_min_tokens_vs_grammar), the rejection sampler's Triton kernel turns its NaNs into the id
    `vocab_size` (vllm#44744, #45060). `parse_output` drops it from the answer, but the next forward embeds it as the
    request's input, and the drafter's: a device-side assert that ends every request on the engine. As id 0 the
    request fares as it would without MTP (its grammar, if any, rejects the token and ends that request alone). One
    masked_fill on the [batch, drafts + 1] ids, no host sync; the logprobs gather then reads id 0 (fix_logprobs_ids
    stays for ids from elsewhere).
    """
    from vllm.v1.sample import rejection_sampler

    if getattr(rejection_sampler.rejection_sample, "_turingbox_vocab", False):
        return "applied"
    if not _unchanged(rejection_sampler.RejectionSampler.forward, FORWARD_CALLS_REJECTION_SAMPLE):
        return "skipped: RejectionSampler.forward is not vLLM 0.21.0's"
    original = rejection_sampler.rejection_sample
    at = list(inspect.signature(original).parameters).index("target_logits")   # found once, not on every step

    @functools.wraps(original)
    def rejection_sample(*args: Any, **kwargs: Any) -> Any:
        ids = original(*args, **kwargs)
        vocab = (args[at] if len(args) > at else kwargs["target_logits"]).shape[-1]
        return ids.masked_fill_(ids >= vocab, 0)

    rejection_sample._turingbox_vocab = True         # type: ignore[attr-defined]
    rejection_sampler.rejection_sample = rejection_sample
    return "applied"


# The validation the next fix extends, and the engine's grammar compile it reuses, verbatim from vLLM 0.21.0
# (vllm/sampling_params.py SamplingParams.verify, vllm/v1/structured_output/backend_xgrammar.py).
VERIFY_VALIDATES_STRUCTURED = "self._validate_structured_outputs(structured_outputs_config, tokenizer)"
XGRAMMAR_COMPILES_JSON = "ctx = self.compiler.compile_json_schema("
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")

# (id(tokenizer), vocab_size, disable_any_whitespace) -> [tokenizer, XgrammarBackend or None, built Event]:
# one backend per tokenizer, built once on a thread (_xgrammar_backend).
_xgrammar_backends: dict[tuple, list[Any]] = {}
_xgrammar_lock = threading.Lock()
# Tests set it to wait for the backend instead of letting the first requests through unchecked.
_WAIT_FOR_BACKEND = False


def _structured_kind(params: Any) -> str | None:
    so = params.structured_outputs
    if so is None:
        return None
    return next((k for k in STRUCTURED_KINDS if getattr(so, k, None) not in (None, False)), None)


def _xgrammar_backend(tokenizer: Any, vocab_size: int, so_config: Any, wait: bool = False) -> Any:
    """vLLM's own XgrammarBackend for this tokenizer, or None while it is being built. Building it (xgrammar's
    TokenizerInfo over a 248K vocabulary) takes seconds: on a thread, never on the API server's event loop;
    the requests before it is ready go unchecked (the active warmup sends one before ready, so none do)."""
    from types import SimpleNamespace

    key = (id(tokenizer), vocab_size, bool(getattr(so_config, "disable_any_whitespace", False)))
    with _xgrammar_lock:
        hit = _xgrammar_backends.get(key)
        if hit is None or hit[0] is not tokenizer:
            done = threading.Event()
            hit = _xgrammar_backends[key] = [tokenizer, None, done]

            def build() -> None:
                try:
                    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

                    if _unchanged(XgrammarBackend.compile_grammar, XGRAMMAR_COMPILES_JSON):
                        # the engine's own backend (same TokenizerInfo, same compile options); the fields it reads
                        config = SimpleNamespace(structured_outputs_config=so_config, speculative_config=None)
                        hit[1] = XgrammarBackend(config, tokenizer=tokenizer, vocab_size=vocab_size)
                    else:
                        log.warning("turingbox allowed_vs_grammar: XgrammarBackend.compile_grammar is not "
                                    "vLLM 0.21.0's; requests are not checked")
                except Exception:
                    log.debug("turingbox allowed_vs_grammar: backend not built", exc_info=True)
                finally:
                    done.set()

            threading.Thread(target=build, name="turingbox-xgrammar-backend", daemon=True).start()
    if wait:
        hit[2].wait()
    return hit[1] if hit[2].is_set() else None


def _first_step_allows(params: Any, model_config: Any, so_config: Any, tokenizer: Any) -> bool:
    """Whether any allowed id passes the grammar's first-step bitmask (the engine's grammar, on CPU)."""
    from vllm.v1.structured_output.request import get_structured_output_key

    vocab_size = model_config.get_vocab_size()
    backend = _xgrammar_backend(tokenizer, vocab_size, so_config, wait=_WAIT_FOR_BACKEND)
    if backend is None:          # still being built (or vLLM changed under it): this request goes unchecked
        return True
    grammar = backend.compile_grammar(*get_structured_output_key(params.structured_outputs))
    return _grammar_accepts_any(grammar, params.allowed_token_ids)


def _grammar_accepts_any(grammar: Any, allowed: Any) -> bool:
    """Whether an XgrammarGrammar, where it stands, accepts any of the allowed ids: its next-token bitmask in a CPU
    int32 tensor, as the engine's scheduler fills it. The first step (fix_allowed_vs_grammar) or mid-output
    (fix_allowed_ids_dead_end)."""
    import xgrammar as xgr

    vocab_size = grammar.vocab_size
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    grammar.fill_bitmask(bitmask, 0)
    row = bitmask[0].tolist()
    return any(0 <= t < vocab_size and (row[t >> 5] >> (t & 31)) & 1 for t in allowed)


# Where vLLM 0.21.0 settles whether a request's grammar starts at its first output token (AsyncLLM.add_request
# sets the serving layer's reasoning_ended on the request, then assigns the request id; the engine's structured-
# output manager reads the same field, or the prompt, vllm/v1/structured_output/__init__.py should_fill_bitmask).
ADD_REQUEST_SETS_REASONING_ENDED = """        if reasoning_ended is not None:
            request.reasoning_ended = reasoning_ended"""
ADD_REQUEST_ASSIGNS_ID = "self.input_processor.assign_request_id(request)"

# reasoning-parser name -> a parser instance (built once, in verify, with the API server's tokenizer)
_reasoners: dict[str, Any] = {}


class _DeadStart:
    """Left on a request's StructuredOutputsParams by verify (it survives SamplingParams.clone): its allowed ids
    cannot start the grammar. Whether that is a dead end depends on the prompt, known only later."""

    def __init__(self, n: int, kind: str, reasoning_parser: str) -> None:
        self.n, self.kind, self.reasoning_parser = n, kind, reasoning_parser

    def __deepcopy__(self, memo: dict) -> "_DeadStart":
        return self

    def error(self, allowed: Any) -> Exception:
        from vllm.exceptions import VLLMValidationError
        return VLLMValidationError(
            f"allowed_token_ids and structured_outputs leave no token to generate: none of the {self.n} "
            f"allowed ids can start the {self.kind} output.",
            parameter="allowed_token_ids", value=allowed)


def _reasoner(name: str, tokenizer: Any) -> Any:
    if name not in _reasoners:
        from vllm.reasoning import ReasoningParserManager
        _reasoners[name] = ReasoningParserManager.get_reasoning_parser(name)(tokenizer=tokenizer)
    return _reasoners[name]


def _grammar_starts_at_first_token(request: Any, dead: _DeadStart) -> bool:
    """vLLM's own rule: with a reasoning parser the grammar waits until reasoning has ended. The chat server
    says whether the prompt ended it (request.reasoning_ended); otherwise the engine reads the prompt."""
    if request.reasoning_ended is not None:
        return bool(request.reasoning_ended)
    reasoner = _reasoners.get(dead.reasoning_parser)
    if reasoner is None:
        return True
    try:
        return bool(reasoner.is_reasoning_end(request.prompt_token_ids or []))
    except Exception:      # the check is an aid: the request proceeds as vLLM would take it
        log.debug("turingbox allowed_token_ids/structured_outputs: reasoning end not decided", exc_info=True)
        return False


_gate = {"state": None}          # None: not tried yet; then "applied" or "skipped: why" (_add_request_gate)


def _add_request_gate() -> str:
    """Wrap InputProcessor.assign_request_id, which AsyncLLM.add_request calls once the request's prompt and
    reasoning_ended are set: there a deferred dead start is refused or let through. Installed on the first
    request that needs it (the API server has imported AsyncLLM by then; the engine core never pays for it)."""
    if _gate["state"] is not None:
        return _gate["state"]
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.input_processor import InputProcessor

    try:
        source = inspect.getsource(AsyncLLM.add_request)
    except (OSError, TypeError):
        source = ""
    if not (ADD_REQUEST_SETS_REASONING_ENDED in source and ADD_REQUEST_ASSIGNS_ID in source
            and source.index(ADD_REQUEST_SETS_REASONING_ENDED) < source.index(ADD_REQUEST_ASSIGNS_ID)):
        _gate["state"] = "skipped: AsyncLLM.add_request is not vLLM 0.21.0's"
        log.warning("turingbox allowed_vs_grammar: %s; such requests are refused whatever the prompt",
                    _gate["state"])
        return _gate["state"]
    assign_request_id = InputProcessor.assign_request_id     # a staticmethod: the plain function

    def checked_assign_request_id(request: Any) -> None:
        so = getattr(getattr(request, "sampling_params", None), "structured_outputs", None)
        dead = getattr(so, "_turingbox_dead_start", None)
        if dead is not None and _grammar_starts_at_first_token(request, dead):
            raise dead.error(request.sampling_params.allowed_token_ids)
        return assign_request_id(request)

    checked_assign_request_id.__wrapped__ = assign_request_id    # type: ignore[attr-defined]
    InputProcessor.assign_request_id = staticmethod(checked_assign_request_id)
    _gate["state"] = "applied"
    return _gate["state"]


def fix_allowed_vs_grammar() -> str:
    """A request whose allowed_token_ids and structured output leave no first token is a 400, not a 500.

    vLLM 0.21 accepts the pair, the sampler's row is all -inf, the engine samples id 0, the grammar rejects
    it and the API server answers 500 (kin to vllm#53665, min_tokens). Applied in the API-server process:
    after vLLM's own `SamplingParams.verify` (which resolves the backend), a request with both parameters
    and the xgrammar backend gets its grammar compiled by vLLM's own XgrammarBackend on CPU. When the
    grammar's first step permits none of the allowed ids, the request is refused with VLLMValidationError
    (parameter="allowed_token_ids"), which the server maps to 400 — if the grammar starts at the first output
    token. With a reasoning parser (and not enable_in_reasoning) vLLM applies the grammar only once reasoning
    has ended: a prompt that leaves reasoning open (thinking on, or a raw completions prompt) is generated
    unconstrained by the grammar and vLLM answers 200, so such a request proceeds. That is decided where vLLM
    decides it, in `AsyncLLM.add_request` once the prompt is rendered (`_add_request_gate`).
    Only the first step is checked here (a later dead end: `fix_allowed_ids_dead_end`). Any other failure of the check
    is logged at debug and the request proceeds as before. Other backends (guidance, outlines) are not checked.
    """
    from vllm.sampling_params import SamplingParams

    if getattr(SamplingParams, "_turingbox_allowed_vs_grammar", False):
        return "applied"
    if not _unchanged(SamplingParams.verify, VERIFY_VALIDATES_STRUCTURED):
        return "skipped: SamplingParams.verify is not vLLM 0.21.0's"
    verify = SamplingParams.verify

    def checked_verify(self: Any, model_config: Any, speculative_config: Any, structured_outputs_config: Any,
                       tokenizer: Any) -> None:
        kind = _structured_kind(self)           # before verify, which turns a choice into a grammar
        if self.structured_outputs is not None:    # params verified again (offline reuse) are decided afresh
            self.structured_outputs.__dict__.pop("_turingbox_dead_start", None)
        verify(self, model_config, speculative_config, structured_outputs_config, tokenizer)
        if not (kind and self.allowed_token_ids and tokenizer is not None and structured_outputs_config
                and self.structured_outputs._backend == "xgrammar"):
            return
        parser = structured_outputs_config.reasoning_parser
        deferred = bool(parser) and not structured_outputs_config.enable_in_reasoning
        try:
            if _first_step_allows(self, model_config, structured_outputs_config, tokenizer):
                return
            if deferred:
                _reasoner(parser, tokenizer)
                deferred = _add_request_gate() == "applied"
        except Exception:  # the check is an aid: whatever it trips on, vLLM proceeds as it would have
            log.debug("turingbox allowed_token_ids/structured_outputs check failed; not checked", exc_info=True)
            return
        dead = _DeadStart(len(self.allowed_token_ids), kind, parser or "")
        if not deferred:
            raise dead.error(self.allowed_token_ids)       # the grammar starts at the first token: refuse now
        self.structured_outputs._turingbox_dead_start = dead

    checked_verify.__wrapped__ = verify          # type: ignore[attr-defined]
    SamplingParams.verify = checked_verify
    SamplingParams._turingbox_allowed_vs_grammar = True
    return "applied"


# vLLM 0.21.0's MultiModalRegistry.supports_multimodal_inputs: it builds the model's processing info (importing
# the model class) before it looks at the limits, and with every limit 0 it answers False unless mm embeds are on.
MM_CHECK_LIMITS_AFTER_IMPORT = ("info = self._create_processing_info(model_config, tokenizer=None)",
                                "mm_config.get_limit_per_prompt(modality) == 0",
                                "if mm_config.enable_mm_embeds:")


def skip_text_only_model_import() -> str:
    """`--language-model-only` answers "no multimodal inputs" without importing the model class.

    vLLM's API server asks `supports_multimodal_inputs` while it builds its renderer and input processor. For an
    architecture registered as multimodal (Qwen3.5/3.6) that imports the model module first: qwen3_5, qwen3_vl,
    FLA's GDN ops, transformers' Qwen-VL modules. FLA runs `torch.cuda.get_device_name(0)` at import, so the API
    server, which never runs the model, initialises CUDA. `vllm serve` spawns its engine core by default (a
    fresh interpreter that imports everything again); with VLLM_WORKER_MULTIPROC_METHOD=fork it forks it only
    while CUDA is not initialised in the API server (vLLM's _maybe_force_spawn; docs/startup.md). With
    `language_model_only` every modality's limit is 0 (MultiModalConfig.get_limit_per_prompt), so vLLM's answer
    is False whatever the model supports, unless `enable_mm_embeds`: this returns that False before the import.
    Other configurations go to vLLM's method unchanged.
    """
    from vllm.multimodal.registry import MultiModalRegistry

    if getattr(MultiModalRegistry, "_turingbox_text_only", False):
        return "applied"
    original = MultiModalRegistry.supports_multimodal_inputs
    if not all(_unchanged(original, needle) for needle in MM_CHECK_LIMITS_AFTER_IMPORT):
        return "skipped: MultiModalRegistry.supports_multimodal_inputs is not vLLM 0.21.0's"

    said = []

    def supports_multimodal_inputs(self: Any, model_config: Any) -> bool:
        if model_config.is_multimodal_model:
            mm_config = model_config.get_multimodal_config()
            if mm_config.language_model_only and not mm_config.enable_mm_embeds:
                if not said:        # vLLM's own line (once per process), which startup timelines use as a step end
                    said.append(True)
                    log.info("All limits of multimodal modalities supported by the model are set to 0, running in "
                             "text-only mode (turingbox: --language-model-only, the model class is not imported).")
                return False
        return original(self, model_config)

    supports_multimodal_inputs.__wrapped__ = original     # type: ignore[attr-defined]
    MultiModalRegistry.supports_multimodal_inputs = supports_multimodal_inputs
    MultiModalRegistry._turingbox_text_only = True
    return "applied"



# Where vLLM 0.21.0 ends a request whose grammar rejects a sampled token, and what carries the engine's word on it to
# the API server (vllm/v1/core/sched/scheduler.py update_from_output; vllm/v1/structured_output/__init__.py;
# vllm/entrypoints/openai/engine/serving.py).
SCHEDULER_ENDS_ON_REJECTION = "request.status = RequestStatus.FINISHED_ERROR"
SCHEDULER_SENDS_STOP_REASON = "stop_reason=request.stop_reason"
CREATE_GRAMMAR_COMPILES = "return self.backend.compile_grammar(request_type, grammar_spec)"
RAISE_IF_ERROR_500 = 'raise GenerationError("Internal server error")'
# The engine's stop_reason for such a request starts with this; the API server turns it into the 400's sentence.
DEAD_END_MARK = "turingbox:allowed_token_ids:"
_DEAD_ENDS_KEPT = 256                      # request ids waiting for their serving code to raise (API server)
_dead_ends: "dict[str, str]" = {}
_dead_end_state = {"engine": None, "api": None}


def _dead_end_sentence(allowed: tuple[int, ...], generated: int) -> str:
    return (f"allowed_token_ids and structured_outputs leave no token to generate after {generated} token"
            f"{'s' if generated != 1 else ''} of the structured output: none of the {len(allowed)} allowed ids can "
            "continue it.")


def _dead_end_engine_half() -> str:
    import weakref

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    if getattr(XgrammarGrammar, "_turingbox_dead_end", False):
        return "applied"
    if not (_unchanged(Scheduler.update_from_output, SCHEDULER_ENDS_ON_REJECTION)
            and _unchanged(Scheduler.update_from_output, SCHEDULER_SENDS_STOP_REASON)
            and _unchanged(StructuredOutputManager._create_grammar, CREATE_GRAMMAR_COMPILES)):
        return "skipped: the scheduler's grammar rejection is not vLLM 0.21.0's"
    create_grammar, accept_tokens = StructuredOutputManager._create_grammar, XgrammarGrammar.accept_tokens

    @functools.wraps(create_grammar)
    def creating(self: Any, request: Any) -> Any:
        grammar = create_grammar(self, request)
        allowed = getattr(request.sampling_params, "allowed_token_ids", None)
        if allowed and isinstance(grammar, XgrammarGrammar):
            grammar._turingbox_allowed = (tuple(allowed), weakref.ref(request))
        return grammar

    @functools.wraps(accept_tokens)
    def accepting(self: Any, request_id: str, tokens: list[int]) -> bool:
        if accept_tokens(self, request_id, tokens):
            return True
        hint = self.__dict__.get("_turingbox_allowed")
        request = hint[1]() if hint else None
        try:
            if request is not None and not self.is_terminated() and not _grammar_accepts_any(self, hint[0]):
                # the client's ids, not the engine, left the row empty: the API server answers 400 with this
                request.stop_reason = DEAD_END_MARK + _dead_end_sentence(hint[0], self.num_processed_tokens)
                log.info("turingbox: request %s: %s", request_id, request.stop_reason[len(DEAD_END_MARK):])
        except Exception:      # the check is an aid: the request ends as vLLM ends it
            log.debug("turingbox allowed_token_ids dead end: not decided", exc_info=True)
        return False

    StructuredOutputManager._create_grammar = creating
    XgrammarGrammar.accept_tokens = accepting
    XgrammarGrammar._turingbox_dead_end = True
    return "applied"


def _dead_end_api_half() -> str:
    """Only where vLLM's OpenAI serving code is loaded (the API server; a forked engine core inherits it unused)."""
    if "vllm.entrypoints.openai.engine.serving" not in sys.modules:
        return "not needed: no OpenAI serving code in this process"      # nothing answers a client here
    from http import HTTPStatus

    from vllm.entrypoints.openai.engine.protocol import GenerationError
    from vllm.entrypoints.openai.engine.serving import OpenAIServing
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import RequestState

    if getattr(OpenAIServing, "_turingbox_dead_end", False):
        return "applied"
    if not _unchanged(OpenAIServing._raise_if_error, RAISE_IF_ERROR_500):
        return "skipped: OpenAIServing._raise_if_error is not vLLM 0.21.0's"

    class AllowedIdsDeadEnd(GenerationError, VLLMValidationError):
        """A GenerationError (every serving path catches it, streams included) that vLLM's error mapping reads as
        a validation error: 400, BadRequestError, param allowed_token_ids."""

        def __init__(self, message: str) -> None:
            GenerationError.__init__(self, message)
            self.parameter, self.value = "allowed_token_ids", None
            self.status_code = HTTPStatus.BAD_REQUEST

    make_output, raise_if_error = RequestState.make_request_output, OpenAIServing._raise_if_error
    convert = OpenAIServing._convert_generation_error_to_streaming_response

    @functools.wraps(make_output)
    def making(self: Any, new_token_ids: Any, pooling_output: Any, finish_reason: Any, stop_reason: Any,
               *args: Any, **kwargs: Any) -> Any:
        if (finish_reason == FinishReason.ERROR and isinstance(stop_reason, str)
                and stop_reason.startswith(DEAD_END_MARK)):
            while len(_dead_ends) >= _DEAD_ENDS_KEPT:          # ids whose serving code never asked (a dropped client)
                _dead_ends.pop(next(iter(_dead_ends)))
            sentence = stop_reason[len(DEAD_END_MARK):]
            _dead_ends[self.external_req_id] = sentence
            if self.parent_req is not None:
                _dead_ends[self.parent_req.external_req_id] = sentence
        return make_output(self, new_token_ids, pooling_output, finish_reason, stop_reason, *args, **kwargs)

    @functools.wraps(raise_if_error)
    def raising(self: Any, finish_reason: str | None, request_id: str) -> None:
        if finish_reason == "error" and _dead_ends:
            # the engine's ids are the serving id itself (chat, n > 1), or it plus "-{i}" (completions, one per
            # prompt) or "_{i}" (responses, batch chat): every one of them is answered by this raise
            keys = [k for k in _dead_ends if k == request_id or k.startswith((request_id + "-", request_id + "_"))]
            if keys:
                sentence = _dead_ends[keys[0]]
                for k in keys:
                    del _dead_ends[k]
                raise AllowedIdsDeadEnd(sentence)
        return raise_if_error(self, finish_reason, request_id)

    @functools.wraps(convert)
    def converting(self: Any, e: Any) -> str:
        if isinstance(e, AllowedIdsDeadEnd):
            return self.create_streaming_error_response(e)      # vLLM's mapping: 400, BadRequestError, param
        return convert(self, e)

    RequestState.make_request_output = making
    OpenAIServing._raise_if_error = raising
    OpenAIServing._convert_generation_error_to_streaming_response = converting
    OpenAIServing._turingbox_dead_end = True
    return "applied"


def fix_allowed_ids_dead_end() -> str:
    """A request whose allowed_token_ids leave its structured output no next token mid-output is a 400, not a 500.

    `fix_allowed_vs_grammar` refuses the pair when no allowed id can start the output. A later dead end is only
    known once generated: allowed_token_ids [90] ("{") with json_object starts the object, then nothing allowed can
    follow it. The row is all -inf, the engine samples id 0 (`fix_out_of_vocab_ids` keeps it inside the
    vocabulary), the grammar rejects it and vLLM 0.21 ends the request as an internal error, 500
    ("Unexpected: grammar rejected tokens [0]"; session 27's `mintokens` on an H100; vllm#18783). Here, where the
    scheduler runs, a rejection is checked against the request's allowed ids at the grammar's state: when none of
    them can continue, the engine's stop_reason carries the sentence, and the API server answers 400 in vLLM's
    error shape (param allowed_token_ids; an error event with code 400 in a stream). A rejection of a token the
    allowed ids could have replaced is the engine's own fault and stays a 500. Other backends, and bad_words, are
    not checked.
    """
    engine = _dead_end_state["engine"] = _dead_end_engine_half()
    api = _dead_end_state["api"] = _dead_end_api_half()
    if engine != "applied":
        return engine
    return "applied" if api == "applied" or api.startswith("not needed") else api


# vLLM 0.21.0's XgrammarGrammar.accept_tokens: a grammar that has terminated rejects every later token.
ACCEPT_REJECTS_AFTER_END = """        if self._is_terminated:
            return False"""


def fix_terminated_grammar() -> str:
    """Tokens after a structured output's end are not the grammar's: accepted without advancing (vllm#52805).

    With `ignore_eos`, or MTP drafts accepted past the stop token, the engine hands the grammar tokens after the
    one that terminated it. vLLM 0.21's xgrammar backend rejects them, and the scheduler ends the request with
    "Unexpected: grammar rejected tokens ... Terminating request": an internal server error, in the middle of a
    stream (session 8's soak: a regex with ignore_eos). Upstream fixed it after 0.21 (vllm#52805): a batch stops
    at termination and later calls return True. Here each token goes to vLLM's own accept_tokens one at a time,
    so the grammar stops at its end exactly as vLLM advances it; what follows is not fed to it. Applied where the
    scheduler runs (the engine core).
    """
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    if getattr(XgrammarGrammar, "_turingbox_terminated", False):
        return "applied"
    original = XgrammarGrammar.accept_tokens
    if not _unchanged(original, ACCEPT_REJECTS_AFTER_END):
        return "skipped: XgrammarGrammar.accept_tokens is not vLLM 0.21.0's"

    def accept_tokens(self: Any, request_id: str, tokens: list[int]) -> bool:
        for token in tokens:
            if self.is_terminated():
                return True                    # the rest came after the end of the grammar
            if not original(self, request_id, [token]):
                return False
        return True

    accept_tokens.__wrapped__ = original       # type: ignore[attr-defined]
    XgrammarGrammar.accept_tokens = accept_tokens
    XgrammarGrammar._turingbox_terminated = True
    return "applied"


# vLLM 0.21.0's MinTokensLogitsProcessor (vllm/v1/sample/logits_processor/builtin.py): a request short of its
# min_tokens gets its stop tokens set to -inf, whatever else its row still permits.
MIN_TOKENS_MASKS = "logits.index_put_(self.logits_slice, self.neg_inf_tensor)"
MIN_TOKENS_MASKS_DRAFTS = "logits.index_put_(logits_slice, self.neg_inf_tensor)"


def fix_min_tokens_vs_grammar() -> str:
    """A row that min_tokens leaves with no token keeps its stop tokens (vllm#53665, worse with MTP).

    A structured output that is complete permits only the end of the sequence: after `{"a": 1}` a json_object
    grammar allows `<|im_end|>` alone. With `min_tokens` not yet reached, vLLM 0.21 also masks that token, and the
    row is all -inf. Without speculative decoding the sampler then draws id 0, xgrammar rejects it and the request
    ends as an internal error; with MTP the rejection sampler turns the row's NaNs into the id `vocab_size`, which
    the next forward embeds: a device-side assert that kills the engine and every request on it (session 22's soak
    on an H100, 144 s in: a chat request with `response_format: json_object`, `min_tokens` 25, `n` 2). The same
    holds for allowed_token_ids or bad_words that leave only stop tokens, which are applied before min_tokens.
    Here min_tokens yields: where its mask leaves a row with nothing, the row gets its stop tokens' values back,
    and `fix_stop_before_min_tokens` ends the request on that token. No host sync: the stop-token columns are cached
    on the device, the rest are tensor ops.
    """
    import torch
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor as processor

    if getattr(processor, "_turingbox_min_tokens", False):
        return "applied"
    if not (_unchanged(processor.apply, MIN_TOKENS_MASKS)
            and _unchanged(processor.apply_with_spec_decode, MIN_TOKENS_MASKS_DRAFTS)):
        return "skipped: MinTokensLogitsProcessor is not vLLM 0.21.0's"

    def stop_columns(self: Any, device: Any) -> Any:
        ids = tuple(sorted({t for _, _, stops in self.min_toks.values() for t in stops}))
        cached = getattr(self, "_turingbox_stop_columns", None)
        if cached is None or cached[0] != ids or cached[1].device != device:
            cached = (ids, torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True))
            self._turingbox_stop_columns = cached
        return cached[1]

    def keeping_stop_tokens(original: Callable) -> Callable:
        @functools.wraps(original)
        def apply(self: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.min_toks:
                return original(self, logits, *args, **kwargs)
            columns = stop_columns(self, logits.device)
            if columns.numel() == 0:
                return original(self, logits, *args, **kwargs)
            before = logits.index_select(1, columns)
            logits = original(self, logits, *args, **kwargs)
            nothing_left = logits.amax(dim=-1, keepdim=True) == float("-inf")    # [rows, 1], no [rows, vocab] mask
            logits.index_copy_(1, columns, torch.where(nothing_left, before, logits.index_select(1, columns)))
            return logits
        return apply

    processor.apply = keeping_stop_tokens(processor.apply)
    processor.apply_with_spec_decode = keeping_stop_tokens(processor.apply_with_spec_decode)
    processor._turingbox_min_tokens = True
    return "applied"


# vLLM 0.21.0's check_stop (vllm/v1/core/sched/utils.py): no stop before min_tokens, whatever was sampled.
CHECK_STOP_MIN_TOKENS_FIRST = """    if request.num_output_tokens < sampling_params.min_tokens:
        return False"""


def fix_stop_before_min_tokens() -> str:
    """A stop token sampled before min_tokens ends the request (finish_reason "stop"): it was only sampleable
    because nothing else was (`fix_min_tokens_vs_grammar`), e.g. a complete json_object. vLLM 0.21 would go on,
    and, the grammar having ended, generate unconstrained text after the JSON until min_tokens. Applied where the
    scheduler runs (the engine core); the scheduler module imported the name, so it is replaced there too.
    """
    from vllm.v1.core.sched import utils
    from vllm.v1.request import RequestStatus

    original = utils.check_stop
    if getattr(original, "_turingbox_min_tokens", False):
        return "applied"
    if not _unchanged(original, CHECK_STOP_MIN_TOKENS_FIRST):
        return "skipped: check_stop is not vLLM 0.21.0's"

    @functools.wraps(original)
    def check_stop(request: Any, max_model_len: int) -> bool:
        params = request.sampling_params
        if params is not None and request.num_output_tokens < params.min_tokens and request.output_token_ids:
            last = request.output_token_ids[-1]
            if last == params.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in (params.stop_token_ids or ()):
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = last
                return True
        return original(request, max_model_len)

    check_stop._turingbox_min_tokens = True          # type: ignore[attr-defined]
    utils.check_stop = check_stop
    scheduler = sys.modules.get("vllm.v1.core.sched.scheduler")
    if scheduler is not None and getattr(scheduler, "check_stop", None) is original:
        scheduler.check_stop = check_stop
    return "applied"


# vLLM 0.21.0's GPUModelRunner._get_prompt_logprobs_dict: one request's whole scheduled chunk at once.
PROMPT_LOGITS_WHOLE_CHUNK = "logits = self.model.compute_logits(prompt_hidden_states)"
PROMPT_LOGPROBS_WHOLE_CHUNK = "logprobs = self.sampler.compute_logprobs(logits)"
PROMPT_LOGPROBS_GATHER = "self.sampler.gather_logprobs("
# What one slice of prompt logprobs may hold on a GPU at once, per prompt token and vocabulary entry: the bf16 logits
# (2 bytes), the fp32 copy log_softmax makes of a bf16 input (4) and its fp32 output (4): 10 bytes; inside
# compute_logits, tensor parallelism's all-gather buffers (at most 6, freed on return). 12 is the bound. The planner
# keeps POST_KV_SLACK_MIB (384) outside vLLM's budget for buffers like this one.
PROMPT_LOGPROBS_SLICE_MIB = 128
PROMPT_LOGPROBS_BYTES_PER_ENTRY = 12


def prompt_logprobs_rows(vocab_size: int) -> int:
    """Prompt tokens per slice: PROMPT_LOGPROBS_SLICE_MIB over the vocabulary (45 for Qwen3.6's 248,320)."""
    return max(1, (PROMPT_LOGPROBS_SLICE_MIB << 20) // (max(1, vocab_size) * PROMPT_LOGPROBS_BYTES_PER_ENTRY))


_MISSING = object()


class _DeferredLogits:
    """The hidden states a prompt-logprobs call would have turned into logits: computed later, slice by slice."""

    def __init__(self, hidden_states: Any) -> None:
        self.hidden_states = hidden_states


def fix_prompt_logprobs_slices() -> str:
    """A request's prompt logprobs are computed in slices of a few dozen tokens, not its whole chunk at once.

    vLLM 0.21 turns every scheduled prompt token of such a request into a row of logits over the whole vocabulary,
    log-softmaxed in fp32: 7-12 bytes x 248,320 per token, up to 5.7 GiB for the 2,048-token chunk of a 2080 Ti
    plan. Its memory profile never runs prompt logprobs, so that peak lies outside the budget it sized the KV cache
    with. On the H200 the AWQ soak's engine held 7.6 GiB over its budget after a 3,667-token prompt_logprobs
    request (benchmarks.md, session 10); on a 22 GB card such a request is a CUDA out-of-memory error in the
    engine, which ends every request it serves (vllm#5907, the tracking issue; vllm#45327, open, avoids the fp32
    tensor upstream). Here the three calls vLLM makes per request (compute_logits,
    compute_logprobs, gather_logprobs) run per slice of `prompt_logprobs_rows` tokens. Each row is computed as vLLM
    computes it; on a GPU the lm_head GEMM over fewer rows may round a bf16 logit's last bit differently, as vLLM's
    own chunk sizes already do. Every tensor-parallel rank slices the same chunk the same way (the all-gather inside
    compute_logits stays matched). Applied in the worker, to vLLM 0.21's default (v1) GPUModelRunner.
    """
    import torch
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_turingbox_prompt_logprobs", False):
        return "applied"
    original = GPUModelRunner._get_prompt_logprobs_dict
    for needle in (PROMPT_LOGITS_WHOLE_CHUNK, PROMPT_LOGPROBS_WHOLE_CHUNK, PROMPT_LOGPROBS_GATHER):
        if not _unchanged(original, needle):
            return "skipped: GPUModelRunner._get_prompt_logprobs_dict is not vLLM 0.21.0's"

    def sliced(self: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
        if not self.num_prompt_logprobs:
            return original(self, hidden_states, num_scheduled_tokens)
        model, sampler = self.model, self.sampler
        compute_logits, compute_logprobs, gather = model.compute_logits, sampler.compute_logprobs, \
            sampler.gather_logprobs
        rows = prompt_logprobs_rows(self.model_config.get_vocab_size())

        def gather_sliced(logprobs: Any, num_logprobs: int, token_ids: Any) -> Any:
            if not isinstance(logprobs, _DeferredLogits):
                return gather(logprobs, num_logprobs, token_ids)
            h, parts = logprobs.hidden_states, []
            for start in range(0, h.shape[0], rows):
                part = compute_logprobs(compute_logits(h[start:start + rows]))
                parts.append(gather(part, num_logprobs, token_ids[start:start + rows]))
                del part                                     # the slice's logits go before the next are made
            return LogprobsTensors(*(torch.cat([p[i] for p in parts]) for i in range(3)))

        # Instance attributes for the length of this call only: vLLM's own body runs unchanged around them.
        swaps = ((model, "compute_logits", _DeferredLogits),
                 (sampler, "compute_logprobs", lambda x: x if isinstance(x, _DeferredLogits) else compute_logprobs(x)),
                 (sampler, "gather_logprobs", gather_sliced))
        before = [(obj, name, getattr(obj, "__dict__", {}).get(name, _MISSING)) for obj, name, _ in swaps]
        for obj, name, value in swaps:
            setattr(obj, name, value)
        try:
            return original(self, hidden_states, num_scheduled_tokens)
        finally:
            for obj, name, value in before:
                if value is _MISSING:
                    with contextlib.suppress(AttributeError):
                        delattr(obj, name)          # back to the class's method
                else:
                    setattr(obj, name, value)

    sliced.__wrapped__ = original                  # type: ignore[attr-defined]
    GPUModelRunner._get_prompt_logprobs_dict = sliced
    GPUModelRunner._turingbox_prompt_logprobs = True
    return "applied"


# vLLM 0.21's sample_tokens runs an EAGLE/MTP drafter on the GPU's sampled tokens before its bookkeeping, which is
# where the prompt logprobs are computed from the target model's hidden states.
DRAFTER_BEFORE_BOOKKEEPING = "does not need to wait for bookkeeping to finish"
PROMPT_LOGPROBS_FROM_HIDDEN_STATES = "prompt_logprobs_dict = self._get_prompt_logprobs_dict(\n            hidden_states[:num_scheduled_tokens],"


def keep_prompt_rows(propose: Callable, prompt_logprobs: Callable, hidden_at: int) -> tuple[Callable, Callable]:
    """(propose_draft_token_ids, _get_prompt_logprobs_dict) wrapped: while a request wants prompt logprobs and the
    step is small enough to have run as a CUDA graph, the target's hidden states are copied before the drafter runs,
    and the prompt logprobs read the copy. `hidden_at`: hidden_states' position among propose's arguments."""

    def propose_keeping_prompt_rows(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        kept = None
        if self.num_prompt_logprobs:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[hidden_at - 1]
            n = scheduler_output.total_num_scheduled_tokens
            # Only a graph's output lies in the pool the drafter's graphs replay into; an eager step's is its own.
            if n <= (self.compilation_config.max_cudagraph_capture_size or 0):
                kept = (hidden.data_ptr(), hidden[:n].clone())      # at most the largest graph's rows
        self._turingbox_prompt_rows = kept       # one step's: never read in a later step
        return propose(self, scheduler_output, *args, **kwargs)

    def prompt_logprobs_from_kept_rows(self: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
        kept = self.__dict__.pop("_turingbox_prompt_rows", None)
        if kept is not None and kept[0] == hidden_states.data_ptr() and kept[1].shape[0] >= hidden_states.shape[0]:
            hidden_states = kept[1][:hidden_states.shape[0]]
        return prompt_logprobs(self, hidden_states, num_scheduled_tokens)

    propose_keeping_prompt_rows.__wrapped__ = propose                 # type: ignore[attr-defined]
    prompt_logprobs_from_kept_rows.__wrapped__ = prompt_logprobs      # type: ignore[attr-defined]
    return propose_keeping_prompt_rows, prompt_logprobs_from_kept_rows


def fix_prompt_logprobs_vs_drafter() -> str:
    """Prompt logprobs under MTP are computed from the target's hidden states, not from what the drafter left there.

    vLLM 0.21 runs the MTP drafter before computing prompt logprobs (sample_tokens: the drafter takes the sampled
    tokens on the GPU, then _bookkeeping_sync computes them). When the target step ran as a CUDA graph its hidden
    states live in the graph pool, weakly referenced, and the drafter's graphs replay into the same pool: the prompt
    logprobs then come from overwritten memory, mostly finite garbage answered with 200, sometimes NaN, which vLLM
    cannot render ("Out of range float values are not JSON compliant: nan", answered as a 400). Session 23's soak got
    that for two completions of 2-token prompts (graph-sized steps). vllm#53488, fix proposed in vllm#53520. The copy
    is made only in such steps (at most max_cudagraph_capture_size rows) and only while a request wants prompt
    logprobs. Applied in the worker, to vLLM 0.21's GPUModelRunner.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_turingbox_prompt_rows_kept", False):
        return "applied"
    if not _unchanged(GPUModelRunner.sample_tokens, DRAFTER_BEFORE_BOOKKEEPING) or \
            not _unchanged(GPUModelRunner._bookkeeping_sync, PROMPT_LOGPROBS_FROM_HIDDEN_STATES):
        return "skipped: GPUModelRunner's drafter and prompt-logprobs order is not vLLM 0.21.0's"
    params = list(inspect.signature(GPUModelRunner.propose_draft_token_ids).parameters)
    if params[:2] != ["self", "scheduler_output"] or "hidden_states" not in params:
        return "skipped: GPUModelRunner.propose_draft_token_ids' arguments are not vLLM 0.21.0's"
    propose, prompt_logprobs = keep_prompt_rows(GPUModelRunner.propose_draft_token_ids,
                                                GPUModelRunner._get_prompt_logprobs_dict,
                                                params.index("hidden_states") - 1)
    GPUModelRunner.propose_draft_token_ids = propose
    GPUModelRunner._get_prompt_logprobs_dict = prompt_logprobs
    GPUModelRunner._turingbox_prompt_rows_kept = True
    return "applied"


# Where vLLM 0.21's compile cache key ignores where files live (envs.compile_factors): VLLM_CACHE_ROOT is in its list.
COMPILE_FACTORS_IGNORES_CACHE_ROOT = '"VLLM_CACHE_ROOT",'
# Two locations it hashes all the same; they default to paths under HOME (XDG_CONFIG_HOME, XDG_CACHE_HOME) and change
# no compiled code (the usage-stats folder; a TPU-only cache).
COMPILE_KEY_LOCATIONS = ("VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH")


def fix_compile_key_locations() -> str:
    """vLLM's torch.compile cache is found again under another HOME: two file locations leave its key.

    vLLM 0.21 names its compile cache folder (torch_compile_cache/<hash>, and torch_aot_compile/<hash>) after a
    hash of every vLLM environment variable except a list of ones that do not change compiled code, VLLM_CACHE_ROOT
    among them. VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH are not on that list, and they default to folders under
    HOME (XDG_CONFIG_HOME, XDG_CACHE_HOME). So a cache seeded under one HOME (a seeding Job, an image build, a
    bench phase) was a turingbox hit but a vLLM miss under another: session 11's startup A/B recompiled every graph
    on its seeded copy (63 s of a 120 s ready). With these two out of the key, the folder depends on what vLLM compiles only.
    Applied in the worker, where vLLM computes the key.
    """
    import vllm.envs as envs

    current = envs.compile_factors
    if getattr(current, "_turingbox_locations", False):
        return "applied"
    source = inspect.getsource(current)
    if COMPILE_FACTORS_IGNORES_CACHE_ROOT not in source:
        return "skipped: vllm.envs.compile_factors is not vLLM 0.21.0's"
    if any(f'"{name}"' in source for name in COMPILE_KEY_LOCATIONS):
        return "skipped: vLLM already leaves these locations out of its compile key"

    def compile_factors() -> dict[str, object]:
        factors = current()
        for name in COMPILE_KEY_LOCATIONS:
            factors.pop(name, None)
        return factors

    compile_factors.__wrapped__ = current                  # type: ignore[attr-defined]
    compile_factors._turingbox_locations = True            # type: ignore[attr-defined]
    envs.compile_factors = compile_factors
    return "applied"


# vLLM 0.21.0's CacheConfig.compute_hash leaves these out of the compile key; kv_cache_memory_bytes is not among them.
CACHE_HASH_IGNORES_UTILIZATION = '"gpu_memory_utilization",'


def fix_kv_size_out_of_compile_key() -> str:
    """`--kv-cache-memory-bytes` no longer moves vLLM's compile cache: the KV size leaves its key, as
    `--gpu-memory-utilization` already does.

    vLLM 0.21's CacheConfig.compute_hash hashes every field but a list that sizes memory without changing the graph
    (gpu_memory_utilization, num_gpu_blocks, ...); kv_cache_memory_bytes, the same allocation in bytes, is missing
    from it. So a start given the KV size its seed measured, which skips vLLM's CUDA-graph memory profile, found
    another compile folder and recompiled every graph. Fixed upstream after 0.21 (vllm#47356). Here the hash is the
    one vLLM computes without the flag, so an entry seeded without it loads at a start with it, and plain vLLM (no
    plugin, no flag) on a copy of that entry loads too. Applied in the worker, where vLLM computes the key.
    """
    from vllm.config.cache import CacheConfig

    current = CacheConfig.compute_hash
    if getattr(current, "_turingbox_kv_size", False):
        return "applied"
    source = inspect.getsource(current)
    if CACHE_HASH_IGNORES_UTILIZATION not in source:
        return "skipped: vllm.config.cache.CacheConfig.compute_hash is not vLLM 0.21.0's"
    if '"kv_cache_memory_bytes"' in source:
        return "skipped: vLLM already leaves kv_cache_memory_bytes out of its compile key"

    @functools.wraps(current)
    def compute_hash(self: Any) -> str:
        if getattr(self, "kv_cache_memory_bytes", None) is None:
            return current(self)
        flagless = copy.copy(self)              # a shallow copy: the config the engine uses stays as it is
        object.__setattr__(flagless, "kv_cache_memory_bytes", None)
        return current(flagless)

    compute_hash._turingbox_kv_size = True                 # type: ignore[attr-defined]
    CacheConfig.compute_hash = compute_hash
    return "applied"


# vLLM 0.21.0's maybe_make_thread_pool (vllm/tokenizers/hf.py): the copies it makes before it returns.
POOL_FILLED_AT_ONCE = """    for _ in range(copies):
        tokenizer_pool.put(copy.deepcopy(og_tokenizer))"""
_pool_fills: list[Callable[[], int]] = []      # filled once the engine processes run (this process's renderers)
_engines_started = threading.Event()


def _pool_of(tokenizer: Any) -> tuple[Any, Any] | None:
    """(queue, the tokenizer it copies) of a tokenizer vLLM's maybe_make_thread_pool turned into a pool: the cells
    of its borrow helper, which every pooled method closes over. None when vLLM's pool looks different."""
    method = type(tokenizer).__dict__.get("encode")
    for cell in getattr(method, "__closure__", None) or ():
        borrow = getattr(cell.cell_contents, "__wrapped__", None)     # contextlib.contextmanager keeps it there
        cells = [c.cell_contents for c in getattr(borrow, "__closure__", None) or ()]
        pools = [c for c in cells if isinstance(c, queue.Queue)]
        originals = [c for c in cells if c is not None and not isinstance(c, queue.Queue) and hasattr(c, "encode")]
        if len(pools) == 1 and len(originals) == 1:
            return pools[0], originals[0]
    return None


def fill_tokenizer_pools(when: str = "after the engine processes started (off the startup path)") -> int:
    """Make the deferred copies now, in this thread; returns how many were made."""
    made = 0
    while _pool_fills:
        t0 = time.perf_counter()
        made += _pool_fills.pop(0)()
        log.info("turingbox: tokenizer pool filled %s in %.2f s", when, time.perf_counter() - t0)
    return made


def defer_tokenizer_pool() -> str:
    """The API server copies its tokenizer for the renderer's thread pool after the engine core starts, not before.

    vLLM 0.21's HfRenderer hands its tokenizer to maybe_make_thread_pool, which deep-copies it twice
    (renderer_num_workers + 1; the Rust tokenizer is pickled and rebuilt, then its vocab caches again) before it
    returns. That runs before the API server starts the engine core: 4.9 s of the API server's 66 s in session 12's
    py-spy profile (H200 host, 248K-token tokenizer), all on the path to ready. Then the API server only waits (31.9 s
    in the same profile). Here the pool is built empty (vLLM's own code, copies=0) and the copies are made in a
    thread started once CoreEngineProcManager has started the engine processes: after the fork, because forking
    beside a thread inside the Rust tokenizer is not safe. A request that finds the pool empty makes its own copy,
    as in vLLM. A pool built once the engines run is filled at once, as vLLM does. An engine client that started
    no engine process in this process (an API server among several, Ray, an in-process engine) fills the pool when
    it is constructed, before the server serves.
    """
    import vllm.tokenizers.hf as tokenizers_hf

    current = tokenizers_hf.maybe_make_thread_pool
    if getattr(current, "_turingbox_deferred", False):
        return "applied"
    if not _unchanged(current, POOL_FILLED_AT_ONCE):
        return "skipped: vllm.tokenizers.hf.maybe_make_thread_pool is not vLLM 0.21.0's"

    @functools.wraps(current)                 # pickled by vLLM's name, as before
    def maybe_make_thread_pool(tokenizer: Any, copies: int = 1) -> Any:
        eligible = (isinstance(tokenizer, tokenizers_hf.PreTrainedTokenizerFast)
                    and not isinstance(tokenizer, tokenizers_hf.ThreadSafeHFTokenizerMixin))
        if _engines_started.is_set() or copies < 1 or not eligible:
            return current(tokenizer, copies)
        try:
            _hook_engine_start()              # here, not at register: only a process that renders imports the client
        except Exception as exc:              # vLLM's engine start moved: its own pool, filled now, as before
            log.warning("turingbox: tokenizer pool filled at once (%s: %s)", type(exc).__name__, exc)
            return current(tokenizer, copies)
        result = current(tokenizer, 0)        # vLLM's pool, empty: a borrower that finds it empty makes its own copy
        found = _pool_of(tokenizer)
        if found is None:
            log.warning("turingbox: vLLM's tokenizer pool has no queue where 0.21.0 keeps it; it fills on demand")
            return result
        queue_, original = found

        def fill() -> int:
            for _ in range(copies):
                queue_.put(copy.deepcopy(original))
            return copies
        _pool_fills.append(fill)
        return result

    maybe_make_thread_pool._turingbox_deferred = True              # type: ignore[attr-defined]
    tokenizers_hf.maybe_make_thread_pool = maybe_make_thread_pool
    for name in ("vllm.tokenizers", "vllm.renderers.hf"):     # modules that imported the name already
        module = sys.modules.get(name)
        if module is not None and getattr(module, "maybe_make_thread_pool", None) is current:
            module.maybe_make_thread_pool = maybe_make_thread_pool
    return "applied"


def _hook_engine_start() -> None:
    """Fill the deferred pools once vLLM has started its engine processes (a thread, after the fork), or, for an
    engine client that started none here, when the client is built (synchronously: nothing forks later)."""
    from vllm.v1.engine.core_client import InprocClient, MPClient
    from vllm.v1.engine.utils import CoreEngineProcManager

    if getattr(CoreEngineProcManager.__init__, "_turingbox_pool", False):
        return

    def start_engines(self: Any, *args: Any, **kwargs: Any) -> None:
        start_engines.__wrapped__(self, *args, **kwargs)       # vLLM's: starts (forks or spawns) the engine cores
        _engines_started.set()
        if _pool_fills:
            threading.Thread(target=fill_tokenizer_pools, name="turingbox-tokenizer-pool", daemon=True).start()

    def client_ready(init: Callable) -> Callable:
        # an API server among several (its parent started the engines), Ray's data parallelism, an in-process engine
        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if _pool_fills and not _engines_started.is_set():
                fill_tokenizer_pools("when the engine client was built (its engines run elsewhere)")
        return __init__

    start_engines.__wrapped__ = CoreEngineProcManager.__init__     # type: ignore[attr-defined]
    start_engines._turingbox_pool = True                           # type: ignore[attr-defined]
    CoreEngineProcManager.__init__ = start_engines
    MPClient.__init__ = client_ready(MPClient.__init__)
    InprocClient.__init__ = client_ready(InprocClient.__init__)


# Applied by register() in every vLLM process the plugin is active in (the API server validates requests and
# builds its renderer; the engine core runs the scheduler's grammars); each is cheap and never touches CUDA.
REGISTER_FIXES: dict[str, Callable[[], str]] = {"allowed_vs_grammar": fix_allowed_vs_grammar,
                                                "text_only_model_import": skip_text_only_model_import,
                                                "terminated_grammar": fix_terminated_grammar,
                                                "allowed_ids_dead_end": fix_allowed_ids_dead_end,
                                                "stop_before_min_tokens": fix_stop_before_min_tokens,
                                                "tokenizer_pool_after_engine_start": defer_tokenizer_pool}


def apply_at_register() -> dict[str, str]:
    """The fixes register() applies in every vLLM process (REGISTER_FIXES); never raises."""
    return _apply(REGISTER_FIXES)


FIXES: dict[str, Callable[[], str]] = {"mask_rows": fix_mask_rows, "logprobs_ids": fix_logprobs_ids,
                                       "out_of_vocab_ids": fix_out_of_vocab_ids,
                                       "min_tokens_vs_grammar": fix_min_tokens_vs_grammar,
                                       "prompt_logprobs_slices": fix_prompt_logprobs_slices,
                                       "prompt_logprobs_vs_drafter": fix_prompt_logprobs_vs_drafter,
                                       "compile_key_locations": fix_compile_key_locations,
                                       "kv_size_out_of_compile_key": fix_kv_size_out_of_compile_key}


def apply_all() -> dict[str, str]:
    """Apply every worker fix; {name: "applied" | "skipped: why" | "failed: why"}. Never raises."""
    return _apply(FIXES)


def _apply(fixes: dict[str, Callable[[], str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, fix in fixes.items():
        try:
            out[name] = fix()
        except Exception as exc:  # an import that moved: vLLM keeps running unpatched, and we say so
            out[name] = f"failed: {type(exc).__name__}: {exc}"
        if out[name] != "applied":
            log.warning("turingbox vLLM fix %s not applied (%s)", name, out[name])
    return out
