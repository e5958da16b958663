"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real SamplingParams.verify
with the real Qwen3.6 tokenizer, before and after turingbox_plugin.vllm_fixes.fix_allowed_vs_grammar.
argv: vllm_root tokenizer_dir mode (unpatched | patched | moved). Prints one JSON object."""
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
tokenizer_dir, mode = sys.argv[2], sys.argv[3]

import importlib.util  # noqa: E402
import types  # noqa: E402

if importlib.util.find_spec("lmformatenforcer") is None:
    # not on this CPU machine (it is in the image): vLLM's verify imports its backend module, whose class
    # annotations name lmformatenforcer types; the xgrammar path tested here never uses it
    stub = types.ModuleType("lmformatenforcer")

    def stub_attr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})
    stub.__getattr__ = stub_attr
    sys.modules["lmformatenforcer"] = stub

import torch  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402

from turingbox_plugin import vllm_fixes  # noqa: E402

out = {}
original_verify = SamplingParams.verify
if mode == "moved":
    vllm_fixes.VERIFY_VALIDATES_STRUCTURED = "self._validate_structured_outputs_moved(cfg, tok)"
if mode == "gate_moved":    # AsyncLLM.add_request no longer assigns the id after setting reasoning_ended
    vllm_fixes.ADD_REQUEST_ASSIGNS_ID = "self.input_processor.assign_request_id_moved(request)"
if mode != "unpatched":
    out["applied"] = vllm_fixes.fix_allowed_vs_grammar()
    out["applied_again"] = vllm_fixes.fix_allowed_vs_grammar()
out["verify_replaced"] = SamplingParams.verify is not original_verify

tok = get_tokenizer(tokenizer_dir)
V = 248320
model_config = SimpleNamespace(max_logprobs=20, logits_processors=None, get_vocab_size=lambda: V)
so_config = StructuredOutputsConfig(backend="auto")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
words = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain "
         "forest ocean desert valley island garden").split()
NO_JSON = sorted({tok.encode(" " + w, add_special_tokens=False)[0] for w in words})[:19]
BRACE = tok.encode("{", add_special_tokens=False)
out["no_json_ids"], out["brace"] = NO_JSON, BRACE


def verify(**kw):
    params = SamplingParams(max_tokens=16, **kw)
    try:
        params.verify(model_config, None, so_config, tok)
    except VLLMValidationError as exc:
        return {"error": str(exc), "parameter": exc.parameter}
    return {"error": None, "backend": params.structured_outputs and params.structured_outputs._backend}


def so(**kw):
    return StructuredOutputsParams(**kw)


if mode == "patched":
    # the backend is built on a thread: the first request goes unchecked, never blocked
    out["while_building"] = verify(allowed_token_ids=NO_JSON, structured_outputs=so(json=SCHEMA))
    for entry in list(vllm_fixes._xgrammar_backends.values()):
        entry[2].wait(300)
vllm_fixes._WAIT_FOR_BACKEND = True
out["contradiction"] = verify(allowed_token_ids=NO_JSON, structured_outputs=so(json=SCHEMA))
out["contradiction_choice"] = verify(allowed_token_ids=NO_JSON, structured_outputs=so(choice=["yes", "no"]))
out["with_brace"] = verify(allowed_token_ids=NO_JSON + BRACE, structured_outputs=so(json=SCHEMA))
out["compiled_backends"] = len(vllm_fixes._xgrammar_backends)
vllm_fixes._xgrammar_backends.clear()
out["allowed_only"] = verify(allowed_token_ids=NO_JSON)
out["structured_only"] = verify(structured_outputs=so(json=SCHEMA))
out["untouched_compiled"] = len(vllm_fixes._xgrammar_backends)   # neither compiled a grammar here

# With a reasoning parser (the appliance's qwen3) vLLM applies the grammar only once reasoning has ended:
# verify leaves the decision to add_request, where the real InputProcessor.assign_request_id sees the prompt.
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.input_processor import InputProcessor  # noqa: E402

vllm_fixes._WAIT_FOR_BACKEND = True
so_reasoning = StructuredOutputsConfig(backend="auto", reasoning_parser="qwen3")
THINK, END_THINK = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
PROMPT = tok.encode("hello there", add_special_tokens=False)


def add_request(reasoning_ended, prompt, allowed=NO_JSON):
    """vLLM's order in AsyncLLM.add_request: verify (inside process_inputs), clone, reasoning_ended, assign id."""
    params = SamplingParams(max_tokens=16, allowed_token_ids=allowed, structured_outputs=so(json=SCHEMA))
    try:
        params.verify(model_config, None, so_reasoning, tok)
        request = EngineCoreRequest(request_id="r1", prompt_token_ids=prompt, mm_features=None,
                                    sampling_params=params.clone(), pooling_params=None, arrival_time=0.0,
                                    lora_request=None, cache_salt=None, data_parallel_rank=None)
        if reasoning_ended is not None:
            request.reasoning_ended = reasoning_ended
        InputProcessor.assign_request_id(request)
    except VLLMValidationError as exc:
        return {"error": str(exc), "parameter": exc.parameter}
    return {"error": None, "request_id": request.request_id, "external_req_id": request.external_req_id}


if mode in ("patched", "gate_moved"):
    out["reasoning"] = {
        "chat_thinking_off": add_request(True, PROMPT + [THINK, END_THINK]),   # the chat server: ended
        "chat_thinking_on": add_request(False, PROMPT + [THINK]),              # the chat server: still open
        "completions_open": add_request(None, PROMPT),                          # the engine reads the prompt
        "completions_ended": add_request(None, PROMPT + [THINK, END_THINK]),
        "with_brace_ended": add_request(True, PROMPT, allowed=NO_JSON + BRACE),
    }
    out["think_ids"] = [THINK, END_THINK]
    out["gate"] = vllm_fixes._gate["state"]
if mode == "patched":
    # the deferred mark stays in the API server: vLLM's own wire encoding to the engine core drops it
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
    params = SamplingParams(max_tokens=16, allowed_token_ids=NO_JSON, structured_outputs=so(json=SCHEMA))
    params.verify(model_config, None, so_reasoning, tok)
    request = EngineCoreRequest(request_id="w", prompt_token_ids=PROMPT, mm_features=None,
                                sampling_params=params.clone(), pooling_params=None, arrival_time=0.0,
                                lora_request=None, cache_salt=None, data_parallel_rank=None)
    wired = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(request))
    out["wire"] = {"marked": hasattr(request.sampling_params.structured_outputs, "_turingbox_dead_start"),
                   "marked_after_wire": hasattr(wired.sampling_params.structured_outputs, "_turingbox_dead_start")}
    # the same params verified again with an allowed id that can start the output: decided afresh, not refused
    params.allowed_token_ids = NO_JSON + BRACE
    params.verify(model_config, None, so_reasoning, tok)
    out["reverified_marked"] = hasattr(params.structured_outputs, "_turingbox_dead_start")
    # a reasoning parser that fails: the request proceeds as vLLM would take it, never a 500 from the check

    class Broken:
        def is_reasoning_end(self, ids):
            raise RuntimeError("parser broke")
    kept = dict(vllm_fixes._reasoners)
    vllm_fixes._reasoners["qwen3"] = Broken()
    out["broken_parser"] = add_request(None, PROMPT)
    vllm_fixes._reasoners.update(kept)
out["cuda_initialised"] = torch.cuda.is_initialized()
print(json.dumps(out))
