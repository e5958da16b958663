"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU): vLLM's real XgrammarBackend and
XgrammarGrammar with the real Qwen3.6 tokenizer, before and after turingbox_plugin.vllm_fixes.fix_terminated_grammar.
argv: vllm_root tokenizer_dir mode (unpatched | patched | moved). Prints one JSON object."""
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
tokenizer_dir, mode = sys.argv[2], sys.argv[3]

from types import SimpleNamespace  # noqa: E402

from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.v1.structured_output.backend_types import StructuredOutputOptions  # noqa: E402
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend  # noqa: E402

from turingbox_plugin import vllm_fixes  # noqa: E402

out = {}
if mode == "moved":
    vllm_fixes.ACCEPT_REJECTS_AFTER_END = "        if self._is_terminated_moved:"
if mode != "unpatched":
    out["applied"] = vllm_fixes.fix_terminated_grammar()
    out["applied_again"] = vllm_fixes.fix_terminated_grammar()

tok = get_tokenizer(tokenizer_dir)
config = SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"), speculative_config=None)
backend = XgrammarBackend(config, tokenizer=tok, vocab_size=248320)
STOP = tok.eos_token_id                  # what xgrammar takes as the stop token (TokenizerInfo.from_huggingface)
YES = tok.encode("yes", add_special_tokens=False)
OTHER = tok.encode(" green", add_special_tokens=False)


def grammar():
    return backend.compile_grammar(StructuredOutputOptions.REGEX, "(yes|no|maybe)")


# ignore_eos: one token per step; the steps after the stop token still hand the grammar a token
g = grammar()
steps = [g.accept_tokens("r", [t]) for t in YES + [STOP, STOP, OTHER[0]]]
out["ignore_eos_steps"] = steps
out["terminated"] = g.is_terminated()
# MTP: one step's accepted tokens run past the stop token
g = grammar()
out["batch_past_end"] = g.accept_tokens("r", YES + [STOP] + OTHER)
out["batch_terminated"] = g.is_terminated()
out["batch_processed"] = g.num_processed_tokens
# a token the grammar forbids before its end is still a rejection
g = grammar()
out["violation"] = g.accept_tokens("r", OTHER)
out["stop"], out["yes"] = STOP, YES
print(json.dumps(out))
