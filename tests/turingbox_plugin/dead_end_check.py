"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): a request whose allowed_token_ids
leave its json_object no next token after "{" (session 27's `mintokens` fourth request), through vLLM's real
StructuredOutputManager._create_grammar, XgrammarGrammar, Request, OutputProcessor, OpenAIServing._raise_if_error
and error mapping, before and after turingbox_plugin.vllm_fixes.fix_allowed_ids_dead_end.
argv: vllm_root tokenizer_dir mode (unpatched | patched | moved). Prints one JSON object."""
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
tokenizer_dir, mode = sys.argv[2], sys.argv[3]

import functools  # noqa: E402
import importlib.util  # noqa: E402
import types  # noqa: E402

if importlib.util.find_spec("lmformatenforcer") is None:
    # not on this CPU machine (it is in the image); the xgrammar path tested here never uses it
    stub = types.ModuleType("lmformatenforcer")

    def stub_attr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})
    stub.__getattr__ = stub_attr
    sys.modules["lmformatenforcer"] = stub

from types import SimpleNamespace  # noqa: E402

import vllm.entrypoints.openai.engine.serving  # noqa: E402,F401  (as in the API server: loaded before register)
from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.entrypoints.openai.engine.protocol import GenerationError  # noqa: E402
from vllm.entrypoints.openai.engine.serving import OpenAIServing  # noqa: E402
from vllm.entrypoints.utils import create_error_response  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend  # noqa: E402

from turingbox_plugin import vllm_fixes  # noqa: E402

out = {}
if mode == "moved":
    vllm_fixes.RAISE_IF_ERROR_500 = 'raise GenerationError("Internal server error moved")'
    vllm_fixes.SCHEDULER_SENDS_STOP_REASON = "stop_reason=request.stop_reason_moved"
if mode != "unpatched":
    out["terminated"] = vllm_fixes.fix_terminated_grammar()      # register()'s order: it wraps accept_tokens first
    out["applied"] = vllm_fixes.fix_allowed_ids_dead_end()
    out["applied_again"] = vllm_fixes.fix_allowed_ids_dead_end()
    out["halves"] = dict(vllm_fixes._dead_end_state)

tok = get_tokenizer(tokenizer_dir)
V = 248320
BRACE = tok.encode("{", add_special_tokens=False)
CLOSE = tok.encode("}", add_special_tokens=False)
out["brace"], out["close"] = BRACE, CLOSE
config = SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"), speculative_config=None)
manager = SimpleNamespace(backend=XgrammarBackend(config, tokenizer=tok, vocab_size=V))   # what _create_grammar reads


def engine_request(rid, allowed):
    params = SamplingParams(max_tokens=8, temperature=0.0, allowed_token_ids=allowed,
                            structured_outputs=StructuredOutputsParams(json_object=True))
    params.structured_outputs._backend = "xgrammar"
    request = Request(rid, [1, 2, 3], params, None)
    grammar = StructuredOutputManager._create_grammar(manager, request)
    return request, grammar


# the engine: "{" is accepted, then the all -inf row's id 0 is rejected, as vLLM's scheduler hands them over
request, grammar = engine_request("chatcmpl-dead-0a1b", BRACE)
out["first"] = grammar.accept_tokens(request.request_id, BRACE)
out["rejected"] = grammar.accept_tokens(request.request_id, [0])
out["stop_reason"] = request.stop_reason
# allowed ids that could go on ("}" after "{"): a rejected token there is the engine's, not the client's
request2, grammar2 = engine_request("chatcmpl-alive-2c3d", BRACE + CLOSE)
grammar2.accept_tokens(request2.request_id, BRACE)
out["rejected_with_a_way_on"] = grammar2.accept_tokens(request2.request_id, [0])
out["stop_reason_with_a_way_on"] = request2.stop_reason
# no allowed_token_ids: nothing to decide
request3, grammar3 = engine_request("chatcmpl-plain-4e5f", None)
out["rejected_without_allowed"] = grammar3.accept_tokens(request3.request_id, [0])
out["stop_reason_without_allowed"] = request3.stop_reason

# the API server: the engine's output crosses vLLM's msgpack wire into its real OutputProcessor, then the serving
# code's error check with the id that serving path passes: chat (the engine's external id itself), completions with
# two prompts ("-{i}", both dead), responses ("_{i}")
processor = OutputProcessor(tok, log_stats=False)
answers = {}
wire = MsgpackDecoder(EngineCoreOutputs)
CASES = (("chatcmpl-dead", [("chatcmpl-dead-0a1b", "chatcmpl-dead")], request.stop_reason),
         ("chatcmpl-alive", [("chatcmpl-alive-2c3d", "chatcmpl-alive")], request2.stop_reason),
         ("cmpl-dead", [("cmpl-dead-0-6a7b", "cmpl-dead-0"), ("cmpl-dead-1-8c9d", "cmpl-dead-1")], request.stop_reason),
         ("resp_dead", [("resp_dead_0-aa11", "resp_dead_0")], request.stop_reason))
for asked, engine_ids, stop_reason in CASES:
    for rid, ext in engine_ids:
        core = EngineCoreRequest(request_id=rid, prompt_token_ids=[1, 2, 3], mm_features=None,
                                 sampling_params=SamplingParams(max_tokens=8,
                                                                output_kind=RequestOutputKind.FINAL_ONLY),
                                 pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                                 data_parallel_rank=None, external_req_id=ext)
        processor.add_request(core, None, None, 0)
        sent = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=rid, new_token_ids=BRACE,
                                                           finish_reason=FinishReason.ERROR, stop_reason=stop_reason)])
        processor.process_outputs(wire.decode(MsgpackEncoder().encode(sent)).outputs)
    ext = asked
    try:
        OpenAIServing._raise_if_error(None, "error", ext)
        answers[ext] = None
    except GenerationError as e:
        err = create_error_response(e).model_dump()["error"]
        serving = SimpleNamespace(create_error_response=OpenAIServing.create_error_response)   # vLLM's own methods
        serving.create_streaming_error_response = functools.partial(OpenAIServing.create_streaming_error_response,
                                                                    serving)
        stream = json.loads(OpenAIServing._convert_generation_error_to_streaming_response(serving, e))["error"]
        answers[ext] = {"status": err["code"], "type": err["type"], "param": err["param"], "message": err["message"],
                        "stream_status": stream["code"], "stream_type": stream["type"]}
out["answers"] = answers
out["kept"] = len(vllm_fixes._dead_ends)
print(json.dumps(out))
