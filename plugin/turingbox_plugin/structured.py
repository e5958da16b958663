"""Strict warmup of the structured-output path (grammar bitmask), worker process only.

A request with a grammar (response_format, a forced or required tool call, guided_* params) makes
GPUModelRunner.sample_tokens call vLLM's `apply_grammar_bitmask`, which launches xgrammar's Triton
`apply_token_bitmask_inplace_kernel` on the logits. The scheduler-driven waves (driver.py) carry no
grammar, so without this step the first such request JIT-compiles that kernel after ready.

We call vLLM's own `apply_grammar_bitmask` with a fabricated GrammarOutput, SchedulerOutput
(only `scheduled_spec_decode_tokens` is read) and input batch (only `req_ids`), on logits produced
by the model's real `compute_logits` (so dtype, vocab slice, row stride and alignment are the
request path's), once per case of `warmup_plan.plan_bitmask_cases`. Every rank runs the same cases
in the same order, so compute_logits' TP all-gather stays matched. Each case masks token 0 in its
structured rows and checks afterwards that exactly those rows were masked: proof that the launch
took the indices / no-indices branch the case was planned for.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any, Callable

from turingbox_plugin.warmup_plan import BITMASK_KERNEL, BitmaskCase

log = logging.getLogger("vllm.turingbox_plugin.warmup")

STRUCTURED_OUTPUT_KERNELS = (BITMASK_KERNEL,)


class StructuredWarmupError(RuntimeError):
    pass


def skip_reason(worker: Any) -> str | None:
    """Why the structured-output step does not apply here (None when it does)."""
    try:
        import xgrammar  # noqa: F401  (vLLM imports it lazily on the first grammar request)
    except ImportError:
        return "xgrammar is not installed"
    if getattr(worker.vllm_config, "structured_outputs_config", None) is None:
        return "structured outputs are disabled in this vLLM configuration"
    if getattr(worker, "use_v2_model_runner", False):
        return "vLLM's V2 model runner applies grammars with its own kernel, which this step does not cover"
    return None


def fabricate_inputs(case: BitmaskCase, tag: str) -> tuple[Any, Any, Any]:
    """(scheduler_output, grammar_output, input_batch) as apply_grammar_bitmask reads them.

    The bitmask allows every token except token 0, so the effect is checkable per row.
    """
    import numpy as np

    try:
        from vllm.v1.core.sched.output import GrammarOutput
    except ImportError:  # the xgrammar fallback needs only the two fields
        GrammarOutput = lambda ids, mask: SimpleNamespace(structured_output_request_ids=ids,  # noqa: E731
                                                          grammar_bitmask=mask)
    req_ids = [f"turingbox-grammar-{tag}-{i}" for i in range(len(case.drafts))]
    spec = {rid: [0] * d for rid, d in zip(req_ids, case.drafts) if d}
    structured_ids = [rid for rid, s in zip(req_ids, case.structured) if s]
    bitmask = np.full(case.grammar_bitmask_shape, -1, dtype=np.int32)
    bitmask[:, 0] = -2  # bit 0 cleared: token 0 disallowed
    return (SimpleNamespace(scheduled_spec_decode_tokens=spec), GrammarOutput(structured_ids, bitmask),
            SimpleNamespace(req_ids=req_ids))


def expected_masked_rows(case: BitmaskCase) -> list[bool]:
    return [s for d, s in zip(case.drafts, case.structured) for _ in range(1 + d)]


def _apply_with_xgrammar(scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: Any) -> None:
    """Fallback when vLLM's function cannot be imported: the same launch, built the same way."""
    import numpy as np
    import torch
    import xgrammar as xgr

    spec = scheduler_output.scheduled_spec_decode_tokens
    wanted = set(grammar_output.structured_output_request_ids)
    rows: dict[str, int] = {}
    offset = 0
    for i, rid in enumerate(input_batch.req_ids):
        if rid in wanted:
            rows[rid] = i + offset
        offset += len(spec.get(rid, ()))
    src = grammar_output.grammar_bitmask
    sorted_mask = np.full((logits.shape[0], src.shape[1]), -1, dtype=src.dtype)
    out, cum = [], 0
    for rid in grammar_output.structured_output_request_ids:
        n = 1 + len(spec.get(rid, ()))
        for j in range(n):
            sorted_mask[rows[rid] + j] = src[cum + j]
            out.append(rows[rid] + j)
        cum += n
    mask = torch.from_numpy(sorted_mask).to(logits.device, non_blocking=True)
    index = None if len(out) == logits.shape[0] else torch.tensor(out, dtype=torch.int32).to(logits.device)
    xgr.apply_token_bitmask_inplace(logits, mask, indices=index)


def resolve_apply() -> tuple[Callable[..., None], str]:
    try:
        from vllm.v1.structured_output.utils import apply_grammar_bitmask
    except ImportError as exc:
        log.warning("turingbox: vLLM's apply_grammar_bitmask is not importable (%s); warming xgrammar directly", exc)
        return _apply_with_xgrammar, "xgrammar"
    return apply_grammar_bitmask, "vllm"


def logits_template(runner: Any, rows: int) -> tuple[Any, str]:
    """Logits exactly as the request path makes them: the model's own compute_logits."""
    import torch

    vocab = runner.model_config.get_vocab_size()
    try:
        hidden = torch.zeros((rows, runner.model_config.get_hidden_size()), dtype=runner.dtype,
                             device=runner.device)
        logits = runner.model.compute_logits(hidden)
        if logits is not None and logits.dim() == 2 and logits.shape[0] == rows:
            return logits, "compute_logits"
        why = f"it returned {None if logits is None else tuple(logits.shape)}"
    except Exception as exc:  # any model quirk: fall back, JIT accounting still catches a mismatch
        why = f"{type(exc).__name__}: {exc}"
    log.warning("turingbox: compute_logits could not make warmup logits (%s); using a contiguous %s "
                "(%d, %d) tensor", str(why).splitlines()[0], runner.dtype, rows, vocab)
    return torch.zeros((rows, vocab), dtype=runner.dtype, device=runner.device), "contiguous"


def run_bitmask_warmup(worker: Any, cases: list[BitmaskCase], compiled: Counter | None = None) -> dict[str, Any]:
    """Launch every case through the real apply path; returns a report, raises StructuredWarmupError.

    `compiled` is the JIT accountant's before-ready counter: when given, the step must leave the
    bitmask kernel in it, otherwise the request path uses a kernel this warmup does not know.
    """
    import torch

    start = time.monotonic()
    runner = worker.model_runner
    apply, via = resolve_apply()
    before = Counter(compiled) if compiled is not None else Counter()
    with torch.inference_mode():
        template, source = logits_template(runner, max(c.logits_rows for c in cases))
        for i, case in enumerate(cases):
            logits = template[:case.logits_rows]
            logits.zero_()
            scheduler_output, grammar_output, input_batch = fabricate_inputs(case, str(i))
            try:
                apply(scheduler_output, grammar_output, input_batch, logits)
                masked = torch.isinf(logits[:, 0]).tolist()
            except Exception as exc:
                raise StructuredWarmupError(f"structured-output warmup case {case.name} failed: "
                                            f"{type(exc).__name__}: {exc}") from exc
            if masked != expected_masked_rows(case):
                raise StructuredWarmupError(
                    f"structured-output warmup case {case.name} masked rows {masked}, expected "
                    f"{expected_masked_rows(case)}")
        dtype, stride = str(template.dtype).replace("torch.", ""), int(template.stride(0))
    report = {"wave": "structured-output-bitmask", "cases": [c.name for c in cases], "via": via,
              "logits": {"source": source, "dtype": dtype, "vocab": int(template.shape[1]), "row_stride": stride},
              "bitmask_cols": cases[0].grammar_bitmask_shape[1], "seconds": round(time.monotonic() - start, 3)}
    if compiled is not None:
        report["compiled"] = {k: v - before.get(k, 0) for k, v in compiled.items() if v > before.get(k, 0)}
        missing = [k for k in STRUCTURED_OUTPUT_KERNELS if not compiled.get(k)]
        if missing:
            raise StructuredWarmupError(
                f"the structured-output warmup ran {len(cases)} cases via {via} but Triton compiled no "
                f"{', '.join(missing)}, so grammar requests use a kernel this warmup does not cover")
    return report
