"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real InputBatch and
RejectionSampler, before and after turingbox_plugin.vllm_fixes. Prints one JSON object."""
import json
import os
import sys
import types

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
patched = sys.argv[2] == "patched"

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

# MTP's rejection sampler is a Triton kernel (GPU only): a CPU stand-in with its signature gives what it gives for an
# all -inf row, the id vocab_size, beside an accepted draft and a placeholder (-1)
from vllm.v1.sample import rejection_sampler as _rs  # noqa: E402
_kernel = _rs.rejection_sample


def _stand_in(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
              bonus_token_ids, sampling_metadata, synthetic_mode=False, synthetic_conditional_rates=None):
    return torch.tensor([[5, target_logits.shape[-1], -1]])


_stand_in.__wrapped__ = _kernel     # inspect.signature follows it: the stand-in is checked against the real one
_rs.rejection_sample = _stand_in

if patched:
    from turingbox_plugin.vllm_fixes import apply_all
    applied = apply_all()
    applied_again = apply_all()
else:
    applied = applied_again = {}
V, BLOCK, SPEC = 248320, 1600, 3


def batch():
    sizes = [BLOCK] * 4                                  # 1 attention + 3 GDN groups, as the 64-layer plan
    return InputBatch(max_num_reqs=16, max_model_len=262144, max_num_batched_tokens=8192,
                      device=torch.device("cpu"), pin_memory=False, vocab_size=V, block_sizes=sizes,
                      kernel_block_sizes=sizes, max_num_blocks_per_req=[164] + [164 + SPEC] * 3,
                      num_spec_tokens=SPEC)


def state(req_id, **kw):
    return CachedRequestState(req_id=req_id, prompt_token_ids=list(range(1000, 1100)), mm_features=[],
                              sampling_params=SamplingParams(max_tokens=16, **kw), generator=None,
                              block_ids=([], [], [], []), num_computed_tokens=0, output_token_ids=[])


def allowed(ib, req_id):
    row = ib.allowed_token_ids_mask_cpu_tensor[ib.req_id_to_index[req_id]]
    return int((~row).sum())                             # all False = no restriction = V


ALLOWED = [11, 22, 33, 44, 55]
out = {"applied": applied, "applied_again": applied_again}
# a recycled row keeps a finished request's mask (condense, add_request)
ib = batch()
ib.add_request(state("a"))
ib.add_request(state("b", allowed_token_ids=ALLOWED))
ib.remove_request("a")
ib.condense()
ib.add_request(state("c"))
out["recycled_row"] = allowed(ib, "c")
out["moved_row"] = allowed(ib, "b")
# a swap of two rows (the GDN backend's decode-first reorder) leaves both with one mask
ib = batch()
ib.add_request(state("x", allowed_token_ids=ALLOWED))
ib.add_request(state("y"))
ib.swap_states(0, 1)
out["swapped"] = {"x": allowed(ib, "x"), "y": allowed(ib, "y")}

# the logprobs gather at an id past the vocabulary
from vllm.v1.sample.rejection_sampler import RejectionSampler  # noqa: E402

seen = {}


class Sampler:
    def compute_logprobs(self, logits):
        return logits.log_softmax(-1)

    def gather_logprobs(self, logprobs, n, token_ids):
        seen["max_id"] = int(token_ids.max())
        return logprobs.gather(-1, token_ids.unsqueeze(-1))


rs = types.SimpleNamespace(sampler=Sampler(), is_logits_logprobs_mode=False)
meta = types.SimpleNamespace(cu_num_sampled_tokens=torch.tensor([2]), bonus_logits_indices=torch.tensor([1]),
                             target_logits_indices=torch.tensor([0]))
logits = torch.zeros(2, 8)
sampled = torch.tensor([[8, 3]])                         # 8 == vocab size: what a NaN row gives
try:
    RejectionSampler._get_logprobs_tensors(rs, 1, meta, logits, logits[:1], logits[1:], sampled)
    out["gather"] = {"ok": True, "max_id": seen["max_id"], "sampled_after": sampled.tolist()}
except (RuntimeError, IndexError) as exc:
    out["gather"] = {"ok": False, "error": str(exc)[:200]}
# the ids the rejection sampler hands the next step (RejectionSampler.forward calls the module's name)
import inspect  # noqa: E402
out["kernel_signature_same"] = list(inspect.signature(_kernel).parameters) == \
    list(inspect.signature(_stand_in, follow_wrapped=False).parameters)
ids = _rs.rejection_sample(torch.tensor([5, 7]), [2], 2, torch.tensor([2]), None, torch.zeros(2, V),
                           torch.tensor([[1]]), None)
out["sampled_ids"] = ids.tolist()
print(json.dumps(out))
