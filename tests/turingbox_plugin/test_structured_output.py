"""Structured-output strict warmup: planned bitmask cases against Triton's own binder on xgrammar's
real kernel and launch wrapper, the fabricated inputs against xgrammar's CPU kernel, and the
worker step on a padded-vocab LM head."""
from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from turingbox_plugin import structured
from turingbox_plugin.model_config import load_model_config
from turingbox_plugin.warmup_plan import BITMASK_KERNEL, BitmaskCase, bitmask_cols, plan_bitmask_cases

H200_SMS = 132


def test_plan_for_the_demo_model_with_mtp3(real_model_dir):
    vocab = load_model_config(str(real_model_dir)).vocab_size
    assert vocab == 248320 and bitmask_cols(vocab) == 7760
    cases = plan_bitmask_cases(vocab, max_num_seqs=16, num_spec_tokens=3)
    assert sorted(c.key for c in cases) == sorted(itertools.product((False, True), ("one", "other", "div16")))
    by_key = {c.key: c for c in cases}
    # all-structured: one prefill row, one request with a full 3-token draft, four such requests
    assert by_key[(False, "one")].drafts == (0,)
    assert by_key[(False, "other")].drafts == (3,) and by_key[(False, "other")].logits_rows == 4
    assert by_key[(False, "div16")].drafts == (3, 3, 3, 3)
    # mixed: an unstructured request (skipped through `indices`) ahead of the structured ones
    mixed = by_key[(True, "div16")]
    assert mixed.structured == (False, True, True, True, True) and mixed.logits_rows == 20
    for c in cases:
        assert c.grammar_bitmask_shape == (c.mask_rows, 7760)
        assert c.kernel_bitmask_shape == (c.logits_rows, 7760)
        assert len(c.drafts) <= 16 and max(c.drafts) <= 3
        assert c.uses_indices == (not all(c.structured))


def test_plan_respects_tiny_limits():
    assert [c.key for c in plan_bitmask_cases(1000, 1, 0)] == [(False, "one")]
    assert sorted(c.key for c in plan_bitmask_cases(1000, 2, 0)) == [(False, "one"), (False, "other"),
                                                                      (True, "one")]
    with pytest.raises(ValueError):
        plan_bitmask_cases(0, 4, 0)


# -- Triton specialisations through xgrammar's real launch wrapper ------------------------------
def _reachable_cases(max_num_seqs: int, k: int, vocab: int) -> dict[tuple, BitmaskCase]:
    """Every batch the scheduler can build (drafts 0..k per request, any non-empty structured subset),
    one representative per (indices None-ness, structured rows)."""
    seen: dict[tuple, BitmaskCase] = {}
    per_request = list(itertools.product(range(k + 1), (False, True)))
    for n in range(1, max_num_seqs + 1):
        for batch in itertools.product(per_request, repeat=n):
            if not any(s for _, s in batch):
                continue
            case = BitmaskCase(tuple(d for d, _ in batch), tuple(s for _, s in batch), vocab)
            seen.setdefault((case.uses_indices, case.mask_rows), case)
    return seen


@pytest.fixture
def triton_launch_recorder(monkeypatch):
    """xgrammar's Triton wrapper, run on CPU tensors: its kernel launch is recorded with Triton's own
    binder (turingbox_warmup.image.triton_aot.record_from_args) instead of compiled. Only the GPU is faked."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.kernels import apply_token_bitmask_inplace_triton as xtriton
    from turingbox_warmup.image.triton_aot import record_from_args

    real_kernel = xtriton.apply_token_bitmask_inplace_kernel
    records: list[str] = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **options):
                spec = record_from_args(real_kernel, args, arch="9.0", **options)
                records.append(json.dumps([spec.signature, sorted(map(str, spec.constexprs.items())),
                                           sorted(map(str, spec.attrs.items())), options], sort_keys=True))
            return launch

    monkeypatch.setattr(xtriton, "apply_token_bitmask_inplace_kernel", Recorder())
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: SimpleNamespace(multi_processor_count=H200_SMS, gcnArchName=""))
    monkeypatch.setattr(xgr, "apply_token_bitmask_inplace",
                        functools.partial(xgr.apply_token_bitmask_inplace, backend="triton"))
    return records


def _launch_key(case: BitmaskCase, logits: torch.Tensor, records: list[str]) -> str:
    scheduler_output, grammar_output, input_batch = structured.fabricate_inputs(case, "t")
    structured._apply_with_xgrammar(scheduler_output, grammar_output, input_batch, logits[:case.logits_rows])
    return records[-1]


@pytest.mark.parametrize("max_num_seqs,k", [(1, 0), (2, 0), (3, 1), (4, 3), (5, 2)])
def test_planned_cases_are_exactly_the_reachable_triton_variants(triton_launch_recorder, max_num_seqs, k):
    vocab = 248320
    logits = torch.empty((max_num_seqs * (k + 1), vocab), dtype=torch.bfloat16)
    reachable = {_launch_key(c, logits, triton_launch_recorder)
                 for c in _reachable_cases(max_num_seqs, k, vocab).values()}
    planned = [_launch_key(c, logits, triton_launch_recorder) for c in plan_bitmask_cases(vocab, max_num_seqs, k)]
    assert len(planned) == len(set(planned))            # no case compiles what another already did
    assert set(planned) == reachable
    assert all('"logits_ptr": "*bf16"' in r and '"num_warps": 16' in r for r in planned)


def test_fp32_logits_are_another_variant(triton_launch_recorder):
    case = plan_bitmask_cases(1000, 4, 0)[0]
    a = _launch_key(case, torch.empty((1, 1000), dtype=torch.bfloat16), triton_launch_recorder)
    b = _launch_key(case, torch.empty((1, 1000), dtype=torch.float32), triton_launch_recorder)
    assert a != b and '"num_warps": 32' in b     # why the warmup uses compute_logits' own dtype


# -- fabricated inputs and the worker step on CPU ------------------------------------------------
def test_fabricated_inputs_mask_exactly_the_structured_rows():
    pytest.importorskip("xgrammar")
    for case in plan_bitmask_cases(300, 6, 2):
        logits = torch.zeros((case.logits_rows, 300))
        structured._apply_with_xgrammar(*structured.fabricate_inputs(case, "m"), logits)
        assert torch.isinf(logits[:, 0]).tolist() == structured.expected_masked_rows(case)
        assert not torch.isinf(logits[:, 1:]).any()


class PaddedLMHead(torch.nn.Module):
    """compute_logits as vLLM's LogitsProcessor: GEMM on a padded vocab, then `[..., :vocab]`."""

    def __init__(self, hidden: int, vocab: int, padded: int, fail: bool = False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(padded, hidden), requires_grad=False)
        self.vocab, self.fail = vocab, fail

    def compute_logits(self, hidden_states):
        if self.fail:
            raise RuntimeError("no lm_head here")
        return (hidden_states @ self.weight.T)[..., :self.vocab]


def _cpu_worker(vocab=1000, padded=1024, fail=False):
    runner = SimpleNamespace(
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab, get_hidden_size=lambda: 8),
        dtype=torch.float32, device=torch.device("cpu"), model=PaddedLMHead(8, vocab, padded, fail))
    return SimpleNamespace(model_runner=runner, vllm_config=SimpleNamespace(structured_outputs_config=object()))


def test_worker_step_uses_the_models_logits_and_checks_every_case():
    pytest.importorskip("xgrammar")
    cases = plan_bitmask_cases(1000, 4, 1)
    report = structured.run_bitmask_warmup(_cpu_worker(), cases)
    assert report["cases"] == [c.name for c in cases] and report["bitmask_cols"] == 32
    assert report["logits"] == {"source": "compute_logits", "dtype": "float32", "vocab": 1000, "row_stride": 1024}
    fallback = structured.run_bitmask_warmup(_cpu_worker(fail=True), cases)
    assert fallback["logits"]["source"] == "contiguous" and fallback["logits"]["row_stride"] == 1000


def test_worker_step_fails_when_no_bitmask_kernel_was_compiled():
    pytest.importorskip("xgrammar")
    # On CPU xgrammar takes its C++ path: Triton compiles nothing, which must be an error, not a pass.
    with pytest.raises(structured.StructuredWarmupError, match=BITMASK_KERNEL) as e:
        structured.run_bitmask_warmup(_cpu_worker(), plan_bitmask_cases(1000, 2, 0), compiled=Counter())
    assert "\n" not in str(e.value)
    counter = Counter({BITMASK_KERNEL: 2})
    assert structured.run_bitmask_warmup(_cpu_worker(), plan_bitmask_cases(1000, 2, 0), compiled=counter)


def test_skip_reasons():
    pytest.importorskip("xgrammar")
    assert "disabled" in structured.skip_reason(SimpleNamespace(vllm_config=SimpleNamespace()))
    v2 = SimpleNamespace(vllm_config=SimpleNamespace(structured_outputs_config=object()), use_v2_model_runner=True)
    assert "V2 model runner" in structured.skip_reason(v2)
    code = ("import sys; sys.modules['xgrammar'] = None\n"
            "from types import SimpleNamespace as N\nfrom turingbox_plugin.structured import skip_reason\n"
            "print(skip_reason(N(vllm_config=N(structured_outputs_config=object()))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "xgrammar is not installed"

