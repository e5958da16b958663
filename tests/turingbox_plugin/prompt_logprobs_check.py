"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real
GPUModelRunner._get_prompt_logprobs_dict and Sampler, before and after turingbox_plugin.vllm_fixes, on two
requests whose prompt logprobs arrive over two chunks. Prints one JSON object: the largest number of prompt tokens
turned into logits at once, and whether the patched answers are vLLM's."""
import json
import os
import sys
import types

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# vLLM compiles the sampler's rank count with torch.compile; on CPU that is an Inductor C++ build, which a
# noexec /tmp (the image test's tmpfs) cannot load. The rows are the same computed eagerly.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
sys.path.insert(0, sys.argv[1])

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

V, HIDDEN = 248320, 8
torch.manual_seed(0)
W = torch.randn(HIDDEN, V, dtype=torch.bfloat16)


class Model:
    def __init__(self):
        self.rows = []

    def compute_logits(self, h):
        self.rows.append(int(h.shape[0]))
        return h @ W


def runner():
    prompts = {"a": list(range(1000, 1300)), "b": list(range(5000, 5130))}     # 300 and 130 prompt tokens
    requests = {rid: types.SimpleNamespace(prompt_token_ids=ids, in_progress_prompt_logprobs_cpu=None,
                                           num_computed_tokens=0) for rid, ids in prompts.items()}
    return types.SimpleNamespace(
        num_prompt_logprobs={"a": 5, "b": 1}, requests=requests, device=torch.device("cpu"),
        input_batch=types.SimpleNamespace(req_id_to_index={"a": 0, "b": 1}), model=Model(),
        sampler=types.SimpleNamespace(compute_logprobs=Sampler.compute_logprobs,
                                      gather_logprobs=Sampler.gather_logprobs),
        model_config=types.SimpleNamespace(get_vocab_size=lambda: V), _sync_device=lambda: None)


def serve(method, fail_in_logits=False):
    """Two steps: 200 + 80 tokens scheduled, then the rest of both prompts; the answers of the step that completes."""
    r = runner()
    if fail_in_logits:
        def broken(h):
            raise RuntimeError("CUDA out of memory (stand-in)")
        r.model.compute_logits = broken
    out = {}
    for sched in ({"a": 200, "b": 80}, {"a": 100, "b": 50}):
        r.query_start_loc = types.SimpleNamespace(np=np.array([0, sched["a"], sched["a"] + sched["b"]]))
        h = torch.randn(sched["a"] + sched["b"], HIDDEN, generator=torch.Generator().manual_seed(len(out)),
                        dtype=torch.bfloat16)
        done = method(r, h, dict(sched))
        out.update(done)
        for rid, n in sched.items():
            r.requests[rid].num_computed_tokens += n
    leftover = sorted(k for k in ("compute_logits",) if k in vars(r.model)) + \
        sorted(k for k in ("compute_logprobs", "gather_logprobs") if vars(r.sampler).get(k) not in (
            Sampler.compute_logprobs, Sampler.gather_logprobs))
    return out, r.model.rows, leftover


original = GPUModelRunner._get_prompt_logprobs_dict
before, rows_before, _ = serve(original)
from turingbox_plugin.vllm_fixes import apply_all, prompt_logprobs_rows  # noqa: E402
applied, applied_again = apply_all(), apply_all()
after, rows_after, leftover = serve(GPUModelRunner._get_prompt_logprobs_dict)
try:
    serve(GPUModelRunner._get_prompt_logprobs_dict, fail_in_logits=True)
    failure = "no error"
except RuntimeError as exc:
    failure = str(exc)
same = sorted(before) == sorted(after) and all(
    torch.equal(before[k][0], after[k][0]) and torch.allclose(before[k][1], after[k][1], atol=1e-5)
    and torch.equal(before[k][2], after[k][2]) for k in before)
print(json.dumps({"applied": applied.get("prompt_logprobs_slices"),
                  "applied_again": applied_again.get("prompt_logprobs_slices"),
                  "slice_rows": prompt_logprobs_rows(V), "max_rows_unpatched": max(rows_before),
                  "max_rows_patched": max(rows_after), "calls_patched": len(rows_after),
                  "answers": sorted(after), "shape_a": list(after["a"][1].shape), "same_answers": same,
                  "leftover_attributes": leftover, "error_passes_through": failure}))
