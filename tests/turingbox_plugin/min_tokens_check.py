"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): a complete json_object under
min_tokens through vLLM's real xgrammar backend (the real Qwen3.6 tokenizer), MinTokensLogitsProcessor (both its
plain and its speculative-decoding path) and the scheduler's check_stop,
before and after turingbox_plugin.vllm_fixes' min_tokens fixes. argv: vllm_root tokenizer_dir mode
(unpatched | patched | moved). Prints one JSON object."""
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
tokenizer_dir, mode = sys.argv[2], sys.argv[3]

import torch  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.v1.core.sched import utils as sched_utils  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor  # noqa: E402
from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder  # noqa: E402
from vllm.v1.structured_output.backend_types import StructuredOutputOptions  # noqa: E402
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend  # noqa: E402

from turingbox_plugin import vllm_fixes  # noqa: E402

from vllm.v1.core.sched import scheduler as vllm_scheduler  # noqa: E402  (imported first, as an engine core may)

out = {}
if mode == "moved":
    vllm_fixes.MIN_TOKENS_MASKS = "logits.index_put_(self.moved_slice, self.neg_inf_tensor)"
    vllm_fixes.CHECK_STOP_MIN_TOKENS_FIRST = "if request.min_tokens_moved:"
if mode != "unpatched":
    out["applied"] = [vllm_fixes.fix_min_tokens_vs_grammar(), vllm_fixes.fix_stop_before_min_tokens()]
    out["applied_again"] = [vllm_fixes.fix_min_tokens_vs_grammar(), vllm_fixes.fix_stop_before_min_tokens()]

tok = get_tokenizer(tokenizer_dir)
V = 248320
EOS = tok.eos_token_id
backend = XgrammarBackend(SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
                                          speculative_config=None), tokenizer=tok, vocab_size=V)
grammar = backend.compile_grammar(StructuredOutputOptions.JSON_OBJECT, "")
body = tok.encode('{"a": 1}', add_special_tokens=False)
assert grammar.accept_tokens("r", body)
bitmask = backend.allocate_token_bitmask(4)
for row in range(4):
    grammar.fill_bitmask(bitmask, row)


def grammar_rows(n):
    """n rows of logits with the complete JSON object's grammar applied (what the model runner hands the sampler)."""
    import xgrammar
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(0))
    xgrammar.apply_token_bitmask_inplace(logits, bitmask[:n])
    return logits


out["grammar_allows"] = [int(i) for i in torch.nonzero(grammar_rows(1)[0] > float("-inf")).flatten()]
out["eos"] = EOS

params = SamplingParams(max_tokens=228, min_tokens=25, structured_outputs=StructuredOutputsParams(json_object=True))
params.update_from_generation_config({}, EOS)
processor = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
output_ids = list(body)
builder = BatchUpdateBuilder()
builder.added.append((0, params, [1, 2, 3], output_ids))
processor.update_state(builder.get_and_reset(1))


def finite(row):
    return [int(i) for i in torch.nonzero(row > float("-inf")).flatten()]


plain = processor.apply(grammar_rows(1))
out["apply_finite"] = finite(plain[0])
drafts = processor.apply_with_spec_decode(grammar_rows(3), [3])
out["drafts_finite"] = [finite(r) for r in drafts]

# two requests with one draft each, only the first short of min_tokens: what a greedy draw takes from each row
# (an all -inf row gives id 0 here; MTP's Triton rejection sampler makes it vocab_size on a GPU)
target = processor.apply_with_spec_decode(grammar_rows(2), [1, 1])
out["argmax_ids"] = [int(i) for i in target.argmax(dim=-1)]
out["all_minus_inf_rows"] = int(torch.isneginf(target).all(dim=-1).sum())

# the scheduler: EOS sampled before min_tokens (output 8 tokens, min 25)
request = Request("r", [1, 2, 3], params, None)
request.append_output_token_ids(list(body) + [EOS])
out["stopped"] = sched_utils.check_stop(request, 262144)
out["status"] = request.status.name
out["finished"] = RequestStatus.is_finished(request.status)
# a token that is not a stop token before min_tokens: vLLM's rule holds
other = Request("o", [1, 2, 3], params, None)
other.append_output_token_ids(list(body) + [body[0]])
out["other_stopped"] = sched_utils.check_stop(other, 262144)
# min_tokens reached: vLLM's own EOS stop
done = Request("d", [1, 2, 3], SamplingParams(max_tokens=8, min_tokens=2), None)
done.sampling_params.update_from_generation_config({}, EOS)
done.append_output_token_ids([body[0], body[1], EOS])
out["after_min_stopped"] = sched_utils.check_stop(done, 262144)
out["scheduler_uses_fix"] = vllm_scheduler.check_stop is sched_utils.check_stop \
    and getattr(vllm_scheduler.check_stop, "_turingbox_min_tokens", False)
out["cuda_initialised"] = torch.cuda.is_initialized()
print(json.dumps(out))
