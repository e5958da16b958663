"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): turingbox_plugin.vllm_fixes'
fix_prompt_logprobs_vs_drafter. The GPU's part (the drafter's CUDA graphs replaying into the pool that holds the
target's hidden states) is played by a stand-in drafter that overwrites the hidden states in place; the prompt
logprobs are a log-softmax of those rows, as vLLM's are of the logits made from them. Prints one JSON object."""
import json
import os
import sys
import types

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
from turingbox_plugin import vllm_fixes  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

out = {}


def drafter(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, *rest):
    hidden_states.fill_(float("nan"))          # the drafter's graph wrote over the pool
    return [[1]]


def prompt_logprobs(self, hidden_states, num_scheduled_tokens):
    return {"r": hidden_states.log_softmax(-1)}


def step(propose, logprobs, runner, n_tokens, keyword=False):
    """sample_tokens' order: the drafter first, then bookkeeping's prompt logprobs over hidden_states[:n]."""
    pool = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 100
    expected = pool[:n_tokens].log_softmax(-1).clone()
    sched = types.SimpleNamespace(total_num_scheduled_tokens=n_tokens)
    if keyword:
        propose(runner, sched, [[0]], None, hidden_states=pool)
    else:
        propose(runner, sched, [[0]], None, pool, None, None, None, None, None)
    got = logprobs(runner, pool[:n_tokens], {"r": n_tokens})["r"]
    return {"finite": bool(torch.isfinite(got).all()), "as_before_the_drafter": bool(torch.equal(got, expected))}


def runner(wants_prompt_logprobs=True, capture=16):
    return types.SimpleNamespace(num_prompt_logprobs={"r": 5} if wants_prompt_logprobs else {},
                                 compilation_config=types.SimpleNamespace(max_cudagraph_capture_size=capture))


params = list(__import__("inspect").signature(GPUModelRunner.propose_draft_token_ids).parameters)
out["hidden_at"] = params.index("hidden_states") - 1
out["unpatched"] = step(drafter, prompt_logprobs, runner(), 2)
p, lp = vllm_fixes.keep_prompt_rows(drafter, prompt_logprobs, out["hidden_at"])
out["graph_step"] = step(p, lp, runner(), 2)
out["graph_step_keyword"] = step(p, lp, runner(), 16, keyword=True)
r = runner()
out["eager_step"] = step(p, lp, r, 17)                        # past the largest graph: no copy, vLLM's own result
out["eager_step_kept"] = r.__dict__.get("_turingbox_prompt_rows", "popped")
r = runner(wants_prompt_logprobs=False)
step(p, lp, r, 2)
out["no_prompt_logprobs_kept"] = r.__dict__.get("_turingbox_prompt_rows", "popped")
out["eager_plan"] = step(p, lp, runner(capture=None), 2)       # enforce_eager: no graphs, no copy
# the real class: applied once, re-entrant, vLLM's methods underneath
before = (GPUModelRunner.propose_draft_token_ids, GPUModelRunner._get_prompt_logprobs_dict)
out["applied"] = vllm_fixes.fix_prompt_logprobs_vs_drafter()
out["applied_again"] = vllm_fixes.fix_prompt_logprobs_vs_drafter()
out["wraps_vllms"] = (GPUModelRunner.propose_draft_token_ids.__wrapped__,
                      GPUModelRunner._get_prompt_logprobs_dict.__wrapped__) == before
print(json.dumps(out))
