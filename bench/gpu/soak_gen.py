"""The traffic soak's request generator (bench/gpu/soak.py): seeded, deterministic, no I/O.

The parameter space is vLLM 0.21.0's own request models: the field lists come from vLLM's classes, not from
this file. tests/bench/gpu/test_soak_generator.py reads the pydantic `model_fields` of the five classes named in
REQUEST_MODELS (ChatCompletionRequest, vllm/entrypoints/openai/chat_completion/protocol.py; CompletionRequest,
.../completion/protocol.py; ResponsesRequest, .../responses/protocol.py; TokenizeCompletionRequest and
TokenizeChatRequest, vllm/entrypoints/serve/tokenize/protocol.py) from vLLM's unpacked source and fails unless
one seed's request bodies set every field, each in some request expected to succeed (with MTP or without) except
the fields of REFUSED_ONLY (every value of them is refused under turingbox's serve flags: drawn in must-fail
requests only), and checks the bodies against the classes and SamplingParams.
The fields not drawn at all are in ONE place, NOT_DRAWN below ({class: {field: reason}}); the test also fails
when NOT_DRAWN or REFUSED_ONLY names a field the class no longer has, and when vLLM adds a field.

Endpoints: chat (/v1/chat/completions), completions (/v1/completions), responses (/v1/responses, streaming and
not) and tokenize (/tokenize, the completion form {"model", "prompt"} and the chat form {"model", "messages"};
vLLM serves it at the root, and the turingbox sidecar proxies it like /v1/*).

Notes from vLLM 0.21's source that shape what is drawn here:
  - 0.21's CompletionRequest has no `best_of` (an extra field: allowed, logged, ignored); chat has no best_of.
  - n > 1 at temperature 0 is refused ("n must be 1 when using greedy sampling"); max_logprobs defaults to 20.
  - With a --speculative-config, min_p > 0 or any logit_bias is refused (SamplingParams._validate_spec_decode).
  - structured outputs: `structured_outputs` {json | regex | choice | grammar | json_object | structural_tag},
    exactly one; response_format json_object / json_schema maps onto it (responses: text.format json_schema).
  - prompt + max_tokens > max_model_len is refused (renderers/params.py); prompt == max_model_len too.
  - prompt_logprobs with stream=True, stream_options without stream, top_logprobs without logprobs (chat): 400.
  - turingbox serves without --trust-request-chat-template, --enable-prompt-embeds, a KV connector or
    VLLM_ENABLE_RESPONSES_API_STORE, with --reasoning-parser (so thinking_token_budget is accepted) and the
    default fcfs scheduler (priority is accepted and unused): a request chat_template, prompt_embeds, a
    completions `suffix`, responses `background` / `previous_response_id` / `prompt` are refused every time.
  - /tokenize has no max_model_len limit (TokenizeParams max_total_tokens=None): long texts are fine there.
  - a refusal raised while a /v1/responses stream is generated (min_p / logit_bias with MTP, too many logprobs)
    breaks the stream off after its 200 (no error event: only GenerationError becomes one).

Prompt text comes from a fixed word list (soak_words.txt: 2048 words, each exactly one token in the Qwen3.6
tokenizer with or without a leading space), so `words ~= tokens`; soak.py calibrates the ratio and the chat
template's overhead from usage.prompt_tokens and passes them in. Long prompt texts are kept in the request
records as recipes ({"$text": [[kind, key, count], ...]}) that `expand()` turns back into the same text.

SoakGen(legacy=True) keeps the draws of the generator before issue 37 (chat and completions only, the legacy
families and must-fail kinds; the same seed draws the same requests), with its later corrections of must-fail
bodies and tags: the recorded soaks of sessions 6-9 were drawn so, and the CPU tests replay their seeds.
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS: list[str] = [w for w in open(os.path.join(HERE, "soak_words.txt")).read().split() if w]
N_BASES = 6              # shared-prefix word streams
RECIPE_MIN_WORDS = 2000  # texts at least this long are stored as recipes in the JSONL
SAFE_TOKEN_IDS = (1000, 150000)   # ids inside the Qwen vocabulary (248k) that are ordinary text tokens
OUT_OF_VOCAB_ID = 10_000_000

# Every family the generator can tag a request with (the CPU test checks a seed covers them all).
LEGACY_FAMILIES = [
    "chat", "completions", "stream", "stream_usage", "n", "best_of", "beam", "temperature", "greedy", "top_p",
    "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
    "seed", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "bad_words", "allowed_token_ids", "logprobs", "top_logprobs", "prompt_logprobs",
    "echo", "include_stop_str_in_output", "max_completion_tokens", "return_token_ids", "cache_salt",
    "response_format_json_object", "response_format_json_schema", "so_regex", "so_choice", "so_grammar", "so_json",
    "tools_auto", "tools_required", "tools_named", "tools_none", "thinking_on", "thinking_off", "multi_turn",
    "token_ids_prompt", "multi_prompt", "shared_prefix", "unique_prompt", "prompt_1tok", "prompt_long",
    "prompt_near_max", "over_max", "max_tokens_1", "max_tokens_long", "must_fail",
]
FAMILIES = LEGACY_FAMILIES + [
    # the endpoints added by issue 37
    "responses", "tokenize", "tokenize_chat", "tokenize_prompt", "tokenize_long",
    # chat and completions fields the legacy generator did not draw
    "user", "priority", "request_id", "return_tokens_as_token_ids", "vllm_xargs", "repetition_detection",
    "add_special_tokens", "reasoning_effort", "thinking_token_budget", "include_reasoning", "parallel_tool_calls",
    "return_prompt_text", "documents", "add_generation_prompt", "continue_final_message",
    # responses
    "responses_input_text", "responses_input_messages", "instructions", "max_output_tokens", "include",
    "text_format_json_schema", "text_format_json_object", "text_format_text", "reasoning", "metadata",
    "service_tier", "store", "truncation_auto", "truncation_disabled", "prompt_cache_key",
    "enable_response_messages", "previous_input_messages", "max_tool_calls",
    # tokenize
    "return_token_strs",
]

# The requests that must fail, by the rule in vLLM 0.21 they break (tag "fail:<name>").
LEGACY_FAIL_KINDS = [
    "min_p_mtp", "logit_bias_mtp", "over_max_model_len", "prompt_plus_max_tokens", "greedy_n", "top_logprobs_21",
    "top_logprobs_no_logprobs", "prompt_logprobs_stream", "stream_options_no_stream", "negative_temperature",
    "top_p_zero", "presence_penalty_3", "repetition_penalty_0", "min_tokens_gt_max", "max_tokens_0",
    "allowed_out_of_vocab", "allowed_empty", "empty_stop", "named_tool_unknown", "tool_choice_no_tools",
    "empty_tools", "json_schema_missing", "two_constraints", "unknown_model", "bad_type",
    "empty_messages", "invalid_json",
]
FAIL_KINDS = LEGACY_FAIL_KINDS + [
    "untrusted_chat_template", "continue_and_generation_prompt", "empty_cache_salt", "priority_out_of_range",
    "vllm_xargs_bad_value", "repetition_detection_bad", "bad_reasoning_effort", "suffix", "prompt_embeds_disabled",
    "stream_beam_search", "background_without_store", "unknown_previous_response", "responses_prompt_template",
    "text_and_structured_outputs", "previous_input_and_response_id", "bad_service_tier", "bad_include",
    "tokenize_prompt_not_text",
]
# Where each rule applies (c: chat, o: completions, r: responses, t: tokenize). A must-fail kind is drawn only
# for an endpoint whose request class has the field and where vLLM 0.21 refuses the value every time:
#   - pydantic (field types, ge/le, the classes' model validators): 400 before anything else runs;
#   - the serving code: suffix and a request chat_template (render/serving.py), stream + beam search
#     (completion/serving.py), background without the store, previous_input_messages with previous_response_id,
#     an unknown previous_response_id (404) (responses/serving.py), text.format beside structured_outputs
#     (ResponsesRequest.to_sampling_params), prompt_embeds without --enable-prompt-embeds (renderers/);
#   - SamplingParams and the engine's input processor (ranges, logprobs <= 20, spec decode, vocabulary).
FAIL_ENDPOINTS = {
    "min_p_mtp": "co", "logit_bias_mtp": "cor", "over_max_model_len": "cor", "prompt_plus_max_tokens": "cor",
    "greedy_n": "co", "top_logprobs_21": "cor", "top_logprobs_no_logprobs": "c", "prompt_logprobs_stream": "co",
    "stream_options_no_stream": "co", "negative_temperature": "cor", "top_p_zero": "cor", "presence_penalty_3": "cor",
    "repetition_penalty_0": "cor", "min_tokens_gt_max": "co", "max_tokens_0": "cor", "allowed_out_of_vocab": "co",
    "allowed_empty": "co", "empty_stop": "cor", "named_tool_unknown": "cr", "tool_choice_no_tools": "cr",
    "empty_tools": "c", "json_schema_missing": "cor", "two_constraints": "cor", "unknown_model": "cort",
    "bad_type": "cor", "empty_messages": "c", "invalid_json": "cor",
    "untrusted_chat_template": "ct", "continue_and_generation_prompt": "ct", "empty_cache_salt": "cor",
    "priority_out_of_range": "cor", "vllm_xargs_bad_value": "cor", "repetition_detection_bad": "co",
    "bad_reasoning_effort": "c", "suffix": "o", "prompt_embeds_disabled": "o", "stream_beam_search": "o",
    "background_without_store": "r", "unknown_previous_response": "r", "responses_prompt_template": "r",
    "text_and_structured_outputs": "r", "previous_input_and_response_id": "r", "bad_service_tier": "r",
    "bad_include": "r", "tokenize_prompt_not_text": "t",
}
# Rules of SamplingParams / the engine that beam search never checks: vLLM's beam_search samples each step with
# SamplingParams(logprobs, max_tokens=1, temperature) of its own, so a request of these kinds drops beam search.
BEAM_SEARCH_UNCHECKED = frozenset({
    "min_p_mtp", "logit_bias_mtp", "greedy_n", "top_logprobs_21", "negative_temperature", "top_p_zero",
    "presence_penalty_3", "repetition_penalty_0", "min_tokens_gt_max", "max_tokens_0", "allowed_out_of_vocab",
    "allowed_empty", "empty_stop"})
ENDPOINT_LETTER = {"chat": "c", "completions": "o", "responses": "r", "tokenize": "t"}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "tokenize": "/tokenize"}

# vLLM 0.21's request classes: {class name: (module, endpoint)}. The CPU test imports them from vLLM's source
# and reads their fields; request_model() says which class a drawn body is meant for.
REQUEST_MODELS = {
    "ChatCompletionRequest": ("vllm.entrypoints.openai.chat_completion.protocol", "chat"),
    "CompletionRequest": ("vllm.entrypoints.openai.completion.protocol", "completions"),
    "ResponsesRequest": ("vllm.entrypoints.openai.responses.protocol", "responses"),
    "TokenizeCompletionRequest": ("vllm.entrypoints.serve.tokenize.protocol", "tokenize"),
    "TokenizeChatRequest": ("vllm.entrypoints.serve.tokenize.protocol", "tokenize"),
}

_MM = ("multimodal: kwargs for the media IO connectors / the HF multimodal processor; the soak sends text only "
       "and turingbox serves the demo text-only (--language-model-only): no image, audio or video to apply them to")
_KV = ("disaggregated prefill/decode: turingbox runs no --kv-transfer-config, so there is no KV connector to "
       "take the handshake (vLLM only carries the dict along); a do_remote_prefill value would ask for one")
# The fields of vLLM's request classes the generator does not draw, each with why. The ONE list of exclusions.
NOT_DRAWN: dict[str, dict[str, str]] = {
    "ChatCompletionRequest": {"media_io_kwargs": _MM, "mm_processor_kwargs": _MM, "kv_transfer_params": _KV},
    "CompletionRequest": {"kv_transfer_params": _KV},
    "ResponsesRequest": {"media_io_kwargs": _MM, "mm_processor_kwargs": _MM, "kv_transfer_params": _KV},
    "TokenizeCompletionRequest": {},
    "TokenizeChatRequest": {"media_io_kwargs": _MM, "mm_processor_kwargs": _MM},
}
# Fields drawn, but only in must-fail requests: vLLM 0.21 refuses every value of them under turingbox's serve
# flags ({class: {field: the rule}}). Every other field is also set in requests expected to succeed.
REFUSED_ONLY: dict[str, dict[str, str]] = {
    "ChatCompletionRequest": {"chat_template": "render/serving.py validate_chat_template: no "
                                               "--trust-request-chat-template"},
    "CompletionRequest": {"suffix": "render/serving.py render_completion: 'suffix is not currently supported'",
                          "prompt_embeds": "renderers: 'You must set `--enable-prompt-embeds`'"},
    "ResponsesRequest": {"background": "needs the response store (VLLM_ENABLE_RESPONSES_API_STORE), unset",
                         "previous_response_id": "the store is off: no response is ever found (404)",
                         "prompt": "ResponsesRequest.validate_prompt: 'prompt template is not supported'"},
    "TokenizeCompletionRequest": {},
    "TokenizeChatRequest": {"chat_template": "validate_chat_template: no --trust-request-chat-template"},
}
# Keys the generator sends that are no field of the class (vLLM allows and ignores extra fields).
EXTRA_KEYS = {"CompletionRequest": {"best_of": "0.21 dropped best_of; clients still send it",
                                    "bad_words": "a chat-only field in 0.21; sent to completions it is ignored"}}


def request_model(endpoint: str, body: dict) -> str:
    """The vLLM class a drawn body is meant for."""
    if endpoint == "tokenize":
        return "TokenizeChatRequest" if "messages" in body else "TokenizeCompletionRequest"
    return next(name for name, (_, ep) in REQUEST_MODELS.items() if ep == endpoint)


# families whose request carries a structured output (tool_choice required / named is one too)
STRUCTURED_FAMILIES = frozenset({"response_format_json_object", "response_format_json_schema", "so_regex", "so_choice",
                                 "so_grammar", "so_json", "so_structural_tag", "tools_required", "tools_named",
                                 "text_format_json_schema"})


def loguniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))


def tiered(rng: random.Random, tiers: list[tuple[float, int, int]]) -> int:
    """A value from one of the (weight, lo, hi) tiers, log-uniform inside the tier."""
    x = rng.random() * sum(w for w, _, _ in tiers)
    for w, lo, hi in tiers:
        if x < w:
            return max(lo, min(hi, loguniform(rng, lo, hi)))
        x -= w
    return tiers[-1][1]


_BASES: dict[tuple[int, int], list[str]] = {}


def base_words(seed: int, base: int, n: int) -> list[str]:
    """The first n words of shared-prefix stream `base` (cached, extended on demand)."""
    key = (seed, base)
    words = _BASES.get(key)
    if words is None or len(words) < n:
        rng = random.Random(f"soak-base-{seed}-{base}")
        words = rng.choices(WORDS, k=max(n, 4096 if words is None else 2 * len(words)))
        _BASES[key] = words
    return words[:n]


def segment_words(seed: int, seg: list) -> list[str]:
    kind, key, count = seg
    if kind == "base":
        return base_words(seed, int(key), int(count))
    return random.Random(f"soak-rand-{seed}-{key}").choices(WORDS, k=int(count))


def render(seed: int, segments: list[list]) -> str:
    return " ".join(w for seg in segments for w in segment_words(seed, seg))


def expand(body: Any, seed: int) -> Any:
    """Replace every {"$text": segments} recipe in a stored body by its text."""
    if isinstance(body, dict):
        if set(body) == {"$text"}:
            return render(seed, body["$text"])
        return {k: expand(v, seed) for k, v in body.items()}
    if isinstance(body, list):
        return [expand(v, seed) for v in body]
    return body


@dataclass
class Calibration:
    tokens_per_word: float = 1.0      # usage.prompt_tokens per word of our text
    completion_overhead: int = 0      # tokens a completions prompt has beyond its words
    chat_overhead: int = 24           # chat template tokens beyond the messages' words (thinking off)
    chat_thinking_overhead: int = 20  # ... with enable_thinking on
    source: str = "default"

    def words_for(self, tokens: int, overhead: int) -> int:
        return max(1, int((tokens - overhead) / self.tokens_per_word))


@dataclass
class Req:
    id: int
    endpoint: str                 # "chat" | "completions" | "responses" | "tokenize"
    body: dict                    # recipe form (long texts as {"$text": ...}); expand() before sending
    families: list[str]
    expect: str                   # "ok" | "fail:<kind>" | "boundary"
    intended_prompt_tokens: int
    prompt_class: str             # tiny | short | medium | long | near_max | over_max | tokenize
    max_tokens: int               # 0 for tokenize (nothing generated)
    timeout_s: float
    raw: str | None = None        # a raw (non-JSON) body to send instead of body

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]

    @property
    def model_class(self) -> str:
        return request_model(self.endpoint, self.body)

    def summary(self) -> dict:
        b = self.body
        keys = ("stream", "n", "best_of", "use_beam_search", "temperature", "top_p", "top_k", "min_p", "logprobs",
                "top_logprobs", "prompt_logprobs", "echo", "ignore_eos", "min_tokens", "seed", "tool_choice",
                "max_output_tokens", "background", "store", "truncation", "add_generation_prompt",
                "continue_final_message", "priority", "thinking_token_budget", "reasoning_effort")
        s = {k: b[k] for k in keys if k in b and not isinstance(b[k], (dict, list))}
        if isinstance(b.get("tool_choice"), dict):
            s["tool_choice"] = "named"
        if b.get("response_format"):
            s["response_format"] = b["response_format"].get("type") if isinstance(b["response_format"], dict) else "?"
        if isinstance(b.get("text"), dict) and isinstance(b["text"].get("format"), dict):
            s["text_format"] = b["text"]["format"].get("type")
        if isinstance(b.get("structured_outputs"), dict):
            s["structured_outputs"] = sorted(b["structured_outputs"])
        if "chat_template_kwargs" in b:
            s["thinking"] = (b["chat_template_kwargs"] or {}).get("enable_thinking")
        if self.endpoint == "tokenize":
            s["form"] = "chat" if "messages" in b else "prompt"
        return s


@dataclass
class Group:
    kind: str                     # single | sequential | burst
    reqs: list[Req] = field(default_factory=list)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"type": "string",
                                                                                "enum": ["c", "f"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "limit": {"type": "integer"}},
                                          "required": ["query"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}},
                                          "required": ["a", "b"]}}},
]
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "tags": {"type": "array", "items": {"type": "string"}}},
               "required": ["name", "age"]}
GRAMMARS = ['root ::= "yes" | "no" | "maybe"',
            'root ::= "(" [0-9]+ ("," [0-9]+)* ")"',
            'root ::= word (" " word)*\nword ::= [a-z]+']
REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[A-Z][a-z]{2,8}( [a-z]{2,8}){1,5}\."]
# the same tools in the Responses API's flat FunctionTool shape
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")   # ChatCompletionRequest's Literal
# ResponsesRequest.include's Literal; only the logprobs one changes what vLLM does (the rest are tool outputs)
RESPONSES_INCLUDE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url",
                     "file_search_call.results", "message.input_image.image_url", "reasoning.encrypted_content")
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
INT64_MAX = 2**63 - 1


class SoakGen:
    """Deterministic for (seed, model, max_model_len, mtp, calibration, legacy): the n-th draw is always the same.

    legacy=True: the draws of the generator before issue 37 (chat and completions, LEGACY_FAMILIES and
    LEGACY_FAIL_KINDS only), request for request, for the recorded soaks of sessions 6-9; the corrections of
    must-fail bodies and tags made since (beam search dropped for rules it does not check, echo's max_tokens 0)
    apply to it too."""

    # endpoint mix (legacy: 60 % chat, 40 % completions) and the share of each that is made to fail
    ENDPOINT_MIX = (("chat", 0.5), ("completions", 0.3), ("responses", 0.13), ("tokenize", 0.07))
    BREAK_RATE = {"chat": 0.1, "completions": 0.1, "responses": 0.2, "tokenize": 0.25}

    def __init__(self, seed: int, model: str, max_model_len: int, mtp: bool = True,
                 calib: Calibration | None = None, long_output_weight: float = 1.0, legacy: bool = False,
                 max_n: int | None = None) -> None:
        self.seed = seed
        self.max_n = max_n      # turingbox's admission limit on n / best_of / the beam width (None: not known)
        self.legacy = legacy
        self.model = model
        self.max_model_len = int(max_model_len)
        self.mtp = mtp
        self.calib = calib or Calibration()
        self.rng = random.Random(f"soak-{seed}")
        self.next_id = 0
        w = long_output_weight
        # max_tokens 1..2048, skewed hard to small (a 27B at max_num_seqs 2 decodes ~85 tok/s in all)
        self.max_tokens_tiers = [(45, 1, 4), (35, 4, 32), (16, 32, 256), (3.5 * w, 256, 1024), (0.5 * w, 1024, 2048)]

    # -- groups

    def group(self) -> Group:
        r = self.rng
        x = r.random()
        if x < 0.45:
            return Group("single", [self.request()])
        if x < 0.70:
            return Group("sequential", [self.request(stream_bias=0.8) for _ in range(r.randint(2, 8))])
        if x < 0.95:
            return Group("burst", [self.request() for _ in range(r.randint(3, 29))])
        return Group("burst", [self.request() for _ in range(r.randint(30, 32))])

    # -- prompt length

    def _prompt_len(self) -> tuple[int, str]:
        r, mml = self.rng, self.max_model_len
        x = r.random()
        if x < 0.03:
            return 1, "tiny"
        # long and near-max prompts are most of the GPU's prefill work (session 6: 112 of 815 requests, 3.3M of
        # 3.7M prompt tokens); fewer of them, still every class, so a 10-min soak reaches 2,000 requests
        if x < 0.64:
            return loguniform(r, 2, 512), "short"
        if x < 0.925:
            return loguniform(r, 512, min(4096, mml // 2)), "medium"
        if x < 0.986:
            return loguniform(r, min(4096, mml // 2), max(min(30000, mml - 4096), min(4096, mml // 2) + 1)), "long"
        if x < 0.992:
            lo = min(30000, mml // 2)
            return r.randint(lo, max(lo, mml - 64)), "near_max"
        return mml + r.choice([1, 2, 16, r.randint(17, max(18, mml // 20))]), "over_max"

    def _text(self, rid: int, tokens: int, overhead: int, shared: bool,
              families: list[str]) -> tuple[list | None, list]:
        """(prefix segments | None, tail segments) for a prompt of `tokens` intended tokens."""
        r = self.rng
        words = self.calib.words_for(tokens, overhead)
        if shared and words > 8:
            tail = min(words - 1, loguniform(r, 1, min(1024, max(1, words // 4))))
            prefix_words = words - tail
            base = r.randrange(2) if prefix_words > 30000 else r.randrange(N_BASES)
            families.append("shared_prefix")
            return [["base", base, prefix_words]], [["rand", f"{rid}", tail]]
        families.append("unique_prompt")
        return None, [["rand", f"{rid}", words]]

    def _materialize(self, segs: list) -> Any:
        """The text, or its recipe when long (the JSONL keeps recipes, expand() restores the text)."""
        if sum(int(s[2]) for s in segs) >= RECIPE_MIN_WORDS:
            return {"$text": segs}
        return render(self.seed, segs)

    def _max_tokens(self, prompt_tokens: int, near_max: bool) -> int:
        mt = tiered(self.rng, self.max_tokens_tiers)
        if near_max:
            mt = min(mt, 64)
        return mt

    # -- one request

    def _endpoint(self) -> str:
        x = self.rng.random()
        if self.legacy:
            return "chat" if x < 0.6 else "completions"
        for name, share in self.ENDPOINT_MIX:
            if x < share:
                return name
            x -= share
        return self.ENDPOINT_MIX[-1][0]

    def request(self, stream_bias: float = 0.5) -> Req:
        r = self.rng
        rid = self.next_id
        self.next_id += 1
        endpoint = self._endpoint()
        if endpoint == "tokenize":
            return self._tokenize(rid)
        fam: list[str] = [endpoint]
        chat = endpoint == "chat"
        responses = endpoint == "responses"
        tokens, pclass = self._prompt_len()
        near_max = pclass in ("near_max", "over_max")
        mt = self._max_tokens(tokens, near_max)
        expect = "ok"
        if pclass == "near_max":
            # leave room for the output and the template (calibration is exact to a few tokens)
            overhead = self.calib.chat_thinking_overhead + self.calib.chat_overhead if chat or responses else 8
            tokens = min(tokens, self.max_model_len - mt - overhead - 64)
            fam.append("prompt_near_max")
        elif pclass == "over_max":
            fam += ["over_max", "must_fail", "fail:over_max_model_len"]
            expect = "fail:over_max_model_len"
        elif pclass == "tiny":
            fam.append("prompt_1tok")
        elif pclass == "long":
            fam.append("prompt_long")
        if mt == 1:
            fam.append("max_tokens_1")
        if mt >= 256:
            fam.append("max_tokens_long")
        shared = r.random() < (0.95 if tokens > 8192 else 0.6)
        body: dict[str, Any] = {"model": self.model}
        thinking = None
        if responses:
            self._responses_input(body, fam, rid, tokens, pclass, shared, mt)
        elif chat:
            thinking = r.random() < 0.5
            overhead = self.calib.chat_thinking_overhead if thinking else self.calib.chat_overhead
            prefix, tail = self._text(rid, tokens, overhead, shared, fam)
            msgs = []
            if prefix is not None:
                msgs.append({"role": "system", "content": self._materialize(prefix)})
            if r.random() < 0.08 and pclass in ("short", "medium"):
                fam.append("multi_turn")
                msgs += [{"role": "user", "content": " ".join(r.choices(WORDS, k=r.randint(3, 30)))},
                         {"role": "assistant", "content": " ".join(r.choices(WORDS, k=r.randint(3, 30)))}]
            msgs.append({"role": "user", "content": self._materialize(tail)})
            body["messages"] = msgs
            if r.random() < 0.85:
                body["chat_template_kwargs"] = {"enable_thinking": thinking}
                fam.append("thinking_on" if thinking else "thinking_off")
            else:
                fam.append("thinking_on")      # the template's default
            if r.random() < 0.2:
                body["max_completion_tokens"] = mt
                fam.append("max_completion_tokens")
            else:
                body["max_tokens"] = mt
        else:
            x = r.random()
            if x < 0.10 and tokens <= 32768 and not near_max:
                lo, hi = SAFE_TOKEN_IDS
                body["prompt"] = [r.randint(lo, hi) for _ in range(max(1, tokens))]
                fam.append("token_ids_prompt")
            elif x < 0.14 and tokens <= 512:
                body["prompt"] = [" ".join(r.choices(WORDS, k=max(1, tokens // 3))) for _ in range(r.randint(2, 4))]
                fam.append("multi_prompt")
            else:
                prefix, tail = self._text(rid, tokens, self.calib.completion_overhead, shared, fam)
                body["prompt"] = self._materialize((prefix or []) + tail)
            body["max_tokens"] = mt
        small = tokens <= 4096 and not near_max
        if responses:
            self._sampling_responses(body, fam, small)
            self._structure_responses(body, fam)
            self._responses_fields(body, fam, rid)
        else:
            self._sampling(body, fam, chat, small, mt)
            self._structure(body, fam, chat, mt)
            if not self.legacy:
                self._more_fields(body, fam, chat, pclass, rid)
        fail = None
        if expect == "ok" and r.random() < (0.09 if self.legacy else self.BREAK_RATE[endpoint]):
            fail = self._break(body, fam, endpoint, mt)
            expect = f"fail:{fail}"
        if fail == "prompt_plus_max_tokens":
            mt = body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens") or mt
        if pclass == "near_max" and expect == "ok" and tokens >= self.max_model_len - mt - 200:
            expect = "boundary"
        raw = None
        if fail == "invalid_json":
            raw = json.dumps(expand(body, self.seed))[:160] + "{,"
        timeout = 600.0 if (tokens > 30000 or mt >= 512 or body.get("use_beam_search")) else 300.0
        if expect == "ok":        # a sampling knob that vLLM refuses here (min_p / logit_bias with MTP)
            expect = next((f for f in fam if f.startswith("fail:")), expect)
        # Either answer is right (no draw here: the seed's sequence stays the same):
        # - allowed_token_ids with a structured output: the plugin answers 400 when no allowed id can start the
        #   output, which only a tokenizer and the grammar decide (session 7: 2 of 547);
        # - an over-long prompt with truncate_prompt_tokens (responses: truncation "auto"): vLLM cuts it instead
        #   of refusing it (session 7).
        if expect == "ok" and "allowed_token_ids" in fam and any(f in STRUCTURED_FAMILIES for f in fam):
            expect = "boundary"
        if expect == "fail:over_max_model_len" and ("truncate_prompt_tokens" in body
                                                    or body.get("truncation") == "auto"):
            expect = "boundary"
        # - max_tokens = max_model_len with truncation to what is left (-1 / "auto"): the prompt is cut to 0 tokens,
        #   which the engine refuses unless the model skips its prompt-length check (input_processor.py)
        #   (a certain refusal by another rule, min_p with MTP, still stands)
        if expect == "fail:prompt_plus_max_tokens" and (body.get("truncate_prompt_tokens") == -1
                                                        or body.get("truncation") == "auto"):
            expect = next((f for f in fam if f.startswith("fail:") and f != expect), "boundary")
        return Req(rid, endpoint, body, fam, expect, tokens, pclass, mt, timeout, raw)

    def _sampling(self, b: dict, fam: list[str], chat: bool, small: bool, mt: int) -> None:
        r = self.rng
        stream = r.random() < 0.5
        if stream:
            b["stream"] = True
            fam.append("stream")
            if r.random() < 0.6:
                b["stream_options"] = {"include_usage": True, **({"continuous_usage_stats": True}
                                                                 if r.random() < 0.2 else {})}
                fam.append("stream_usage")
        if r.random() < 0.55:
            b["temperature"] = 0.0 if r.random() < 0.35 else round(r.uniform(0.05, 2.0), 3)
            fam.append("greedy" if b["temperature"] == 0 else "temperature")
        greedy = b.get("temperature") == 0.0
        if not greedy and r.random() < 0.12:
            b["n"] = r.randint(2, 4)
            fam.append("n")
            if not chat and r.random() < 0.4:
                b["best_of"] = b["n"] + r.randint(0, 2)    # not a 0.21 field: allowed and ignored
                fam.append("best_of")
        if small and mt <= 32 and "n" not in b and not stream and r.random() < 0.04:
            b["use_beam_search"] = True
            b["n"] = r.randint(2, 4)
            b["max_tokens" if "max_tokens" in b else "max_completion_tokens"] = min(mt, 16)
            fam.append("beam")
            if r.random() < 0.5:
                b["length_penalty"] = round(r.uniform(0.5, 1.5), 2)
        if self.max_n is not None and max(b.get("n", 1), b.get("best_of", 1)) > self.max_n:
            fam += ["must_fail", "fail:max_n"]      # the sidecar's 400 (TURINGBOX_MAX_N); plain vLLM serves it
        if r.random() < 0.2:
            b["top_p"] = round(r.uniform(0.05, 1.0), 3)
            fam.append("top_p")
        if r.random() < 0.2:
            b["top_k"] = r.choice([-1, 0, 1, 5, 20, 50, 100])
            fam.append("top_k")
        if r.random() < 0.12:
            b["presence_penalty"] = round(r.uniform(-2, 2), 2)
            fam.append("presence_penalty")
        if r.random() < 0.12:
            b["frequency_penalty"] = round(r.uniform(-2, 2), 2)
            fam.append("frequency_penalty")
        if r.random() < 0.12:
            b["repetition_penalty"] = round(r.uniform(0.8, 1.6), 2)
            fam.append("repetition_penalty")
        if r.random() < 0.04:
            b["min_p"] = round(r.uniform(0.01, 0.3), 3)   # refused with MTP on: vLLM's 400
            fam.append("min_p")
            # greedy: vLLM resets min_p to 0 and accepts it; beam search samples with params of its own (no min_p)
            if self.mtp and b.get("temperature", 1.0) != 0.0 and not b.get("use_beam_search"):
                fam += ["must_fail", "fail:min_p_mtp"]
        if r.random() < 0.03:
            lo, hi = SAFE_TOKEN_IDS
            b["logit_bias"] = {str(r.randint(lo, hi)): round(r.uniform(-100, 100), 1) for _ in range(r.randint(1, 4))}
            fam.append("logit_bias")
            if self.mtp and not b.get("use_beam_search"):
                fam += ["must_fail", "fail:logit_bias_mtp"]
        if r.random() < 0.08:
            b["min_tokens"] = r.randint(0, mt)
            fam.append("min_tokens")
        if r.random() < 0.15:
            b["seed"] = r.randint(0, 2**31)
            fam.append("seed")
        if r.random() < 0.1:
            b["stop"] = r.choice([r.choice(WORDS), r.sample(WORDS[:200], r.randint(1, 4)), "\n", "."])
            fam.append("stop")
            if r.random() < 0.3:
                b["include_stop_str_in_output"] = True
                fam.append("include_stop_str_in_output")
        if r.random() < 0.06:
            b["stop_token_ids"] = [r.randint(*SAFE_TOKEN_IDS) for _ in range(r.randint(1, 3))]
            fam.append("stop_token_ids")
        if r.random() < 0.15:
            b["ignore_eos"] = True
            fam.append("ignore_eos")
        if r.random() < 0.05:
            b["skip_special_tokens"] = False
            fam.append("skip_special_tokens")
        if r.random() < 0.05:
            b["spaces_between_special_tokens"] = False
            fam.append("spaces_between_special_tokens")
        if r.random() < 0.04 and not isinstance(b.get("prompt"), list):
            b["truncate_prompt_tokens"] = r.choice([-1, r.randint(1, 64), r.randint(64, 2048)])
            fam.append("truncate_prompt_tokens")
        if r.random() < 0.04:      # a ChatCompletionRequest field; CompletionRequest ignores it (EXTRA_KEYS)
            b["bad_words"] = r.sample(WORDS[:500], r.randint(1, 5))
            fam.append("bad_words")
        if r.random() < 0.04:
            b["allowed_token_ids"] = sorted(r.sample(range(*SAFE_TOKEN_IDS), r.randint(1, 50)))
            fam.append("allowed_token_ids")
        if r.random() < 0.12:
            k = r.randint(0, 20)
            if chat:
                b["logprobs"] = True
                b["top_logprobs"] = k
                fam.append("logprobs")
                if k:
                    fam.append("top_logprobs")
            else:
                b["logprobs"] = k
                fam += ["logprobs", "top_logprobs"]
        if small and not stream and r.random() < 0.05:
            b["prompt_logprobs"] = r.choice([0, 1, 5])
            fam.append("prompt_logprobs")
        if not chat and small and r.random() < 0.05:
            b["echo"] = True
            fam.append("echo")
        if chat and small and r.random() < 0.02:
            b["echo"] = True
            fam.append("echo")
        if r.random() < 0.04:
            b["return_token_ids"] = True
            fam.append("return_token_ids")
        if r.random() < 0.03:
            b["cache_salt"] = f"salt-{r.randint(0, 3)}"
            fam.append("cache_salt")

    def _structure(self, b: dict, fam: list[str], chat: bool, mt: int) -> None:
        r = self.rng
        if b.get("use_beam_search"):
            return
        x = r.random()
        if x < 0.03:
            b["response_format"] = {"type": "json_object"}
            fam.append("response_format_json_object")
        elif x < 0.06:
            b["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": JSON_SCHEMA}}
            fam.append("response_format_json_schema")
        elif self._structured_outputs(b, fam, x, (0.08, 0.10, 0.12, 0.14)):
            pass
        elif chat and x < 0.22 and "response_format" not in b:
            tools = r.sample(TOOLS, r.randint(1, 3))
            b["tools"] = tools
            y = r.random()
            if y < 0.45:
                b["tool_choice"] = "auto"
                fam.append("tools_auto")
            elif y < 0.55:
                fam.append("tools_auto")            # tools without tool_choice: vLLM makes it "auto"
            elif y < 0.75:
                b["tool_choice"] = "required"
                fam.append("tools_required")
            elif y < 0.92:
                b["tool_choice"] = {"type": "function", "function": {"name": r.choice(tools)["function"]["name"]}}
                fam.append("tools_named")
            else:
                b["tool_choice"] = "none"
                fam.append("tools_none")

    def _words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choices(WORDS, k=self.rng.randint(lo, hi)))

    def _xargs(self, lists: bool) -> dict:
        """vllm_xargs: SamplingParams.extra_args for custom logits processors; turingbox loads none, so unread."""
        r = self.rng
        x: dict[str, Any] = {"soak_tag": r.choice(WORDS), "soak_n": r.randint(0, 9)}
        if r.random() < 0.5:
            x["soak_w"] = round(r.uniform(0, 1), 3)
        if lists and r.random() < 0.5:      # ChatCompletionRequest / ResponsesRequest take lists, completions not
            x["soak_list"] = [r.randint(0, 9), r.choice(WORDS)]
        return x

    def _repetition_detection(self) -> dict:
        """Valid RepetitionDetectionParams: max_pattern_size 0 (off), or > 0 with min_count >= 2."""
        r = self.rng
        if r.random() < 0.15:
            return {"max_pattern_size": 0}
        hi = r.randint(1, 16)
        return {"max_pattern_size": hi, "min_pattern_size": r.randint(0, hi), "min_count": r.randint(2, 5)}

    def _more_fields(self, b: dict, fam: list[str], chat: bool, pclass: str, rid: int) -> None:
        """The chat / completions fields the legacy generator did not draw (valid values)."""
        r = self.rng
        if r.random() < 0.04:
            b["user"] = f"user-{r.randint(0, 9)}"            # "this will be ignored by vLLM"
            fam.append("user")
        if r.random() < 0.04:
            b["priority"] = r.randint(-10, 10)                # the fcfs scheduler accepts and ignores it
            fam.append("priority")
        if r.random() < 0.04:
            b["request_id"] = f"soak-{self.seed}-{rid}" if r.random() < 0.8 else "soak-same-id"   # vLLM adds a suffix
            fam.append("request_id")
        if r.random() < 0.05:
            b["return_tokens_as_token_ids"] = True
            fam.append("return_tokens_as_token_ids")
        if r.random() < 0.03:
            b["vllm_xargs"] = self._xargs(lists=chat)
            fam.append("vllm_xargs")
        if r.random() < 0.03:
            b["repetition_detection"] = self._repetition_detection()
            fam.append("repetition_detection")
        if r.random() < 0.04:
            b["add_special_tokens"] = chat                  # the other value than the class's default
            fam.append("add_special_tokens")
        if not chat:
            return
        if r.random() < 0.04:
            b["reasoning_effort"] = r.choice(REASONING_EFFORTS)
            fam.append("reasoning_effort")
        if r.random() < 0.04:
            b["thinking_token_budget"] = r.choice([0, r.randint(1, 64), r.randint(64, 1024)])
            fam.append("thinking_token_budget")
        if r.random() < 0.04:
            b["include_reasoning"] = False
            fam.append("include_reasoning")
        if r.random() < 0.04:
            b["parallel_tool_calls"] = r.random() < 0.5
            fam.append("parallel_tool_calls")
        if r.random() < 0.04:
            b["return_prompt_text"] = True
            fam.append("return_prompt_text")
        if r.random() < 0.03:
            b["documents"] = [{"title": r.choice(WORDS), "text": self._words(5, 40)} for _ in range(r.randint(1, 3))]
            fam.append("documents")
        if pclass in ("tiny", "short", "medium") and r.random() < 0.05:
            b["add_generation_prompt"] = False
            fam.append("add_generation_prompt")
            if r.random() < 0.6:       # prefill: the model continues the final assistant message
                b["continue_final_message"] = True
                b["messages"].append({"role": "assistant", "content": self._words(2, 12)})
                fam.append("continue_final_message")

    # -- /v1/responses

    def _responses_input(self, b: dict, fam: list[str], rid: int, tokens: int, pclass: str, shared: bool,
                         mt: int) -> None:
        """input (a text or a message list) and instructions: the chat prompt in the Responses API's shape."""
        r = self.rng
        prefix, tail = self._text(rid, tokens, self.calib.chat_thinking_overhead, shared, fam)
        turns = []
        if r.random() < 0.08 and pclass in ("short", "medium"):
            fam.append("multi_turn")
            turns = [{"role": "user", "content": self._words(3, 30)},
                     {"role": "assistant", "content": self._words(3, 30)}]
        system = self._materialize(prefix) if prefix is not None else None
        if system is not None and r.random() < 0.5:
            b["instructions"] = system           # vLLM puts it first, as a system message
            fam.append("instructions")
            system = None
        elif system is None and r.random() < 0.1:
            b["instructions"] = self._words(3, 20)
            fam.append("instructions")
        if not turns and system is None and r.random() < 0.4:
            b["input"] = self._materialize(tail)
            fam.append("responses_input_text")
        else:
            msgs = ([{"role": "system", "content": system}] if system is not None else []) + turns
            b["input"] = msgs + [{"role": "user", "content": self._materialize(tail)}]
            fam.append("responses_input_messages")
        b["max_output_tokens"] = mt             # always: vLLM's default is the rest of the context
        fam.append("max_output_tokens")

    def _sampling_responses(self, b: dict, fam: list[str], small: bool) -> None:
        """The sampling fields ResponsesRequest has (no n, min_p, logprobs flag, beam search)."""
        r = self.rng
        if r.random() < 0.5:
            b["stream"] = True
            fam.append("stream")
        elif r.random() < 0.1:
            b["stream"] = False
        if r.random() < 0.55:
            b["temperature"] = 0.0 if r.random() < 0.35 else round(r.uniform(0.05, 2.0), 3)
            fam.append("greedy" if b["temperature"] == 0 else "temperature")
        if r.random() < 0.2:
            b["top_p"] = round(r.uniform(0.05, 1.0), 3)
            fam.append("top_p")
        if r.random() < 0.2:
            b["top_k"] = r.choice([-1, 0, 1, 5, 20, 50, 100])
            fam.append("top_k")
        for name in ("presence_penalty", "frequency_penalty"):
            if r.random() < 0.12:
                b[name] = round(r.uniform(-2, 2), 2)
                fam.append(name)
        if r.random() < 0.12:
            b["repetition_penalty"] = round(r.uniform(0.8, 1.6), 2)
            fam.append("repetition_penalty")
        if r.random() < 0.04:
            lo, hi = SAFE_TOKEN_IDS
            b["logit_bias"] = {str(r.randint(lo, hi)): round(r.uniform(-100, 100), 1) for _ in range(r.randint(1, 4))}
            fam.append("logit_bias")
            if self.mtp:
                fam += ["must_fail", "fail:logit_bias_mtp"]
        if r.random() < 0.15:
            b["seed"] = r.randint(0, 2**31)
            fam.append("seed")
        if r.random() < 0.1:
            b["stop"] = r.choice([r.choice(WORDS), r.sample(WORDS[:200], r.randint(1, 4)), "\n", "."])
            fam.append("stop")
            if r.random() < 0.3:
                b["include_stop_str_in_output"] = True
                fam.append("include_stop_str_in_output")
        if r.random() < 0.15:
            b["ignore_eos"] = True
            fam.append("ignore_eos")
        if r.random() < 0.05:
            b["skip_special_tokens"] = False
            fam.append("skip_special_tokens")
        x = r.random()
        if x < 0.12:                 # output logprobs: include names them, top_logprobs says how many
            b["include"] = ["message.output_text.logprobs"]
            b["top_logprobs"] = r.randint(0, 20)
            fam += ["include", "logprobs"] + (["top_logprobs"] if b["top_logprobs"] else [])
        elif x < 0.17:
            b["include"] = r.sample(RESPONSES_INCLUDE, r.randint(1, 2))
            fam.append("include")
        elif x < 0.21:
            b["top_logprobs"] = r.randint(0, 20)     # without include: no logprobs asked for, ignored
            fam.append("top_logprobs")
        if r.random() < 0.03:
            b["cache_salt"] = f"salt-{r.randint(0, 3)}"
            fam.append("cache_salt")

    def _structured_outputs(self, b: dict, fam: list[str], x: float, below: tuple[float, ...]) -> bool:
        """`structured_outputs` of one kind (regex, choice, grammar, json) when x is below its bound in `below`;
        False when x is past them all (the caller's next branch)."""
        r = self.rng
        kinds = (("so_regex", lambda: {"regex": r.choice(REGEXES)}),
                 ("so_choice", lambda: {"choice": r.sample(["red", "green", "blue", "yes", "no", "maybe"], 3)}),
                 ("so_grammar", lambda: {"grammar": r.choice(GRAMMARS)}),
                 ("so_json", lambda: {"json": JSON_SCHEMA}))
        for bound, (family, make) in zip(below, kinds):
            if x < bound:
                b["structured_outputs"] = make()
                fam.append(family)
                return True
        return False

    def _structure_responses(self, b: dict, fam: list[str]) -> None:
        r = self.rng
        x = r.random()
        if x < 0.04:
            b["text"] = {"format": {"type": "json_schema", "name": "person", "schema": JSON_SCHEMA,
                                    **({"strict": True} if r.random() < 0.5 else {})}}
            fam.append("text_format_json_schema")
        elif x < 0.06:
            b["text"] = {"format": {"type": "json_object"}}   # vLLM maps only json_schema onto structured output
            fam.append("text_format_json_object")
        elif x < 0.08:
            b["text"] = {"format": {"type": "text"}, **({"verbosity": "low"} if r.random() < 0.5 else {})}
            fam.append("text_format_text")
        elif self._structured_outputs(b, fam, x, (0.09, 0.10, 0.11, 0.12)):
            pass
        elif x < 0.22:
            # tools never beside text / structured_outputs: with tool_choice required or named, vLLM's tool parser
            # writes text.format itself, and text.format beside structured_outputs is refused
            tools = r.sample(RESPONSES_TOOLS, r.randint(1, 3))
            b["tools"] = tools
            y = r.random()
            if y < 0.4:
                b["tool_choice"] = "auto"
                fam.append("tools_auto")
            elif y < 0.5:
                fam.append("tools_auto")            # ResponsesRequest's default tool_choice
            elif y < 0.7:
                b["tool_choice"] = "required"
                fam.append("tools_required")
            elif y < 0.9:
                b["tool_choice"] = {"type": "function", "name": r.choice(tools)["name"]}
                fam.append("tools_named")
            else:
                b["tool_choice"] = "none"
                fam.append("tools_none")
            if r.random() < 0.3:
                b["parallel_tool_calls"] = r.random() < 0.5
                fam.append("parallel_tool_calls")
            if r.random() < 0.3:
                b["max_tool_calls"] = r.randint(1, 4)     # bounds built-in tool turns (harmony); unused here
                fam.append("max_tool_calls")

    def _responses_fields(self, b: dict, fam: list[str], rid: int) -> None:
        """The rest of ResponsesRequest's fields (valid values)."""
        r = self.rng
        if r.random() < 0.06:
            b["reasoning"] = {"effort": r.choice(["low", "medium", "high"]),
                              **({"summary": "auto"} if r.random() < 0.3 else {})}
            fam.append("reasoning")
        if r.random() < 0.05:
            b["metadata"] = {f"k{i}": r.choice(WORDS) for i in range(r.randint(1, 4))}
            fam.append("metadata")
        if r.random() < 0.05:
            b["service_tier"] = r.choice(SERVICE_TIERS)
            fam.append("service_tier")
        if r.random() < 0.06:
            b["store"] = r.random() < 0.5           # without the store vLLM turns store off and answers anyway
            fam.append("store")
        if r.random() < 0.06:
            b["truncation"] = r.choice(["auto", "disabled"])
            fam.append(f"truncation_{b['truncation']}")
        if r.random() < 0.04:
            b["user"] = f"user-{r.randint(0, 9)}"
            fam.append("user")
        if r.random() < 0.04:
            b["prompt_cache_key"] = f"key-{r.randint(0, 3)}"   # "not implemented yet and vLLM will ignore it"
            fam.append("prompt_cache_key")
        if r.random() < 0.04:
            b["request_id"] = f"resp_soak-{self.seed}-{rid}"
            fam.append("request_id")
        if r.random() < 0.04:
            b["priority"] = r.randint(-10, 10)
            fam.append("priority")
        if r.random() < 0.05:
            b["enable_response_messages"] = True
            fam.append("enable_response_messages")
        if r.random() < 0.04:
            # harmony (gpt-oss) history; other models' serving never reads it
            b["previous_input_messages"] = [{"role": "user", "content": self._words(2, 12)}]
            fam.append("previous_input_messages")
        if r.random() < 0.03:
            b["vllm_xargs"] = self._xargs(lists=True)
            fam.append("vllm_xargs")

    # -- /tokenize

    def _tokenize(self, rid: int) -> Req:
        """/tokenize: the completion form {"model", "prompt"} or the chat form {"model", "messages"}. vLLM applies
        no max_model_len there (TokenizeParams max_total_tokens=None), so a few texts are longer than it."""
        r = self.rng
        fam = ["tokenize"]
        if r.random() < 0.03:
            words = loguniform(r, 4096, max(4097, self.max_model_len + 64))
            fam.append("tokenize_long")
        else:
            words = loguniform(r, 1, 4096)
        text = self._materialize([["rand", f"{rid}", words]])
        body: dict[str, Any] = {"model": self.model}
        if r.random() < 0.5:
            fam.append("tokenize_chat")
            msgs = [{"role": "system", "content": self._words(3, 30)}] if r.random() < 0.3 else []
            msgs.append({"role": "user", "content": text})
            body["messages"] = msgs
            if r.random() < 0.3:
                body["chat_template_kwargs"] = {"enable_thinking": r.random() < 0.5}
                fam.append("thinking_on" if body["chat_template_kwargs"]["enable_thinking"] else "thinking_off")
            if r.random() < 0.2:
                body["add_generation_prompt"] = False
                fam.append("add_generation_prompt")
                if r.random() < 0.5:
                    body["continue_final_message"] = True
                    msgs.append({"role": "assistant", "content": self._words(2, 12)})
                    fam.append("continue_final_message")
            elif r.random() < 0.1:
                body["add_generation_prompt"] = True
                fam.append("add_generation_prompt")
            if r.random() < 0.2:
                body["tools"] = r.sample(TOOLS, r.randint(1, 3))
                fam.append("tools_auto")
        else:
            fam.append("tokenize_prompt")
            body["prompt"] = text
        if r.random() < 0.25:
            body["add_special_tokens"] = r.random() < 0.5
            fam.append("add_special_tokens")
        if r.random() < 0.3:
            body["return_token_strs"] = r.random() < 0.8
            fam.append("return_token_strs")
        expect = "ok"
        if r.random() < self.BREAK_RATE["tokenize"]:
            expect = "fail:" + self._break(body, fam, "tokenize", 0)
        return Req(rid, "tokenize", body, fam, expect, words, "tokenize", 0, 60.0 if words < 30000 else 300.0)

    def _break(self, b: dict, fam: list[str], endpoint: str, mt: int) -> str:
        """Make a request vLLM 0.21 must refuse; returns the rule's name."""
        r = self.rng
        chat = endpoint == "chat"
        letter = ENDPOINT_LETTER[endpoint]
        kinds = [k for k in (LEGACY_FAIL_KINDS if self.legacy else FAIL_KINDS)
                 if k != "over_max_model_len" and letter in FAIL_ENDPOINTS[k]]
        if endpoint == "tokenize":       # the form decides which rules apply
            form_kinds = ("untrusted_chat_template", "continue_and_generation_prompt") if "messages" in b \
                else ("tokenize_prompt_not_text",)
            kinds = [k for k in kinds if k in form_kinds or k == "unknown_model"]
        if not self.mtp:
            kinds = [k for k in kinds if not k.endswith("_mtp")]
        # the MTP refusals are what chat UIs send: weight them up
        kind = r.choice(kinds + [k for k in ("min_p_mtp", "logit_bias_mtp") if k in kinds] * 3)
        mk = ("max_output_tokens" if endpoint == "responses" else
              "max_completion_tokens" if "max_completion_tokens" in b else "max_tokens")
        if kind in BEAM_SEARCH_UNCHECKED and b.pop("use_beam_search", None):
            fam.remove("beam")                   # beam search samples with params of its own: vLLM accepts these
        if kind == "min_p_mtp":
            b["min_p"] = r.choice([0.05, 0.1])
            if b.get("temperature") == 0.0:      # greedy would reset min_p to 0: vLLM then accepts it
                b["temperature"] = 0.7
        elif kind == "logit_bias_mtp":
            b["logit_bias"] = {"1000": 5.0}
        elif kind == "prompt_plus_max_tokens":
            b[mk] = self.max_model_len
        elif kind == "greedy_n":
            b.update(temperature=0.0, n=2)
            b.pop("use_beam_search", None)
            if "fail:min_p_mtp" in fam:          # greedy resets min_p to 0: this rule no longer refuses it
                fam.remove("fail:min_p_mtp")
        elif kind == "top_logprobs_21":
            if chat:
                b.update(logprobs=True, top_logprobs=21 + r.randint(0, 10))
            elif endpoint == "responses":
                b.update(include=["message.output_text.logprobs"], top_logprobs=21 + r.randint(0, 10))
            else:
                b["logprobs"] = 21 + r.randint(0, 10)
        elif kind == "top_logprobs_no_logprobs":
            b["logprobs"] = False
            b["top_logprobs"] = 5
        elif kind == "prompt_logprobs_stream":
            b.update(stream=True, prompt_logprobs=1)
        elif kind == "stream_options_no_stream":
            b["stream"] = False
            b["stream_options"] = {"include_usage": True}
        elif kind == "negative_temperature":
            b["temperature"] = -0.5
        elif kind == "top_p_zero":
            b["top_p"] = 0.0
        elif kind == "presence_penalty_3":
            b["presence_penalty"] = 3.0
        elif kind == "repetition_penalty_0":
            b["repetition_penalty"] = 0.0
        elif kind == "min_tokens_gt_max":
            b["min_tokens"] = (b.get(mk) or mt) + 5
        elif kind == "max_tokens_0":
            b[mk] = r.choice([0, -1])
            if b[mk] == 0 and b.get("echo") and endpoint == "completions":
                b[mk] = -1                       # echo with max_tokens 0 is vLLM's echo without generation: a 200
        elif kind == "allowed_out_of_vocab":
            b["allowed_token_ids"] = [5, OUT_OF_VOCAB_ID]
        elif kind == "allowed_empty":
            b["allowed_token_ids"] = []
        elif kind == "empty_stop":
            b["stop"] = ["", "the"]
        elif kind == "named_tool_unknown":
            if endpoint == "responses":
                b["tools"] = RESPONSES_TOOLS[:1]
                b["tool_choice"] = {"type": "function", "name": "no_such_tool"}
            else:
                b["tools"] = TOOLS[:1]
                b["tool_choice"] = {"type": "function", "function": {"name": "no_such_tool"}}
        elif kind == "tool_choice_no_tools":
            b.pop("tools", None)
            b["tool_choice"] = "required"
        elif kind == "empty_tools":
            b["tools"] = []
        elif kind == "json_schema_missing":
            b.pop("structured_outputs", None)
            if endpoint == "responses":
                b["text"] = {"format": {"type": "json_schema"}}    # no name, no schema: pydantic's 400
            else:
                b["response_format"] = {"type": "json_schema"}
        elif kind == "two_constraints":
            b.pop("response_format", None)
            b.pop("text", None)
            b["structured_outputs"] = {"regex": "[0-9]+", "choice": ["a", "b"]}
        elif kind == "unknown_model":
            b["model"] = "no-such-model"
        elif kind == "bad_type":
            b[mk] = "many"
        elif kind == "empty_messages":
            b["messages"] = []
        elif kind == "untrusted_chat_template":
            b["chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        elif kind == "continue_and_generation_prompt":
            b.update(add_generation_prompt=True, continue_final_message=True)
        elif kind == "empty_cache_salt":
            b["cache_salt"] = ""
        elif kind == "priority_out_of_range":
            b["priority"] = INT64_MAX + 1
        elif kind == "vllm_xargs_bad_value":
            b["vllm_xargs"] = {"soak_tag": {"nested": 1}}
        elif kind == "repetition_detection_bad":
            b["repetition_detection"] = {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 1}
        elif kind == "bad_reasoning_effort":
            b["reasoning_effort"] = "extreme"
        elif kind == "suffix":
            b["suffix"] = " " + r.choice(WORDS)
        elif kind == "prompt_embeds_disabled":
            b["prompt_embeds"] = "c29haw=="          # any payload: the flag is checked before it is decoded
        elif kind == "stream_beam_search":
            b.update(stream=True, use_beam_search=True, n=2)
            b.pop("prompt_logprobs", None)
            for tag in ("fail:min_p_mtp", "fail:logit_bias_mtp"):    # beam search samples without min_p/logit_bias
                if tag in fam:
                    fam.remove(tag)
        elif kind == "background_without_store":
            b["background"] = True
            if r.random() < 0.5:
                b["store"] = False                   # the model's own validator refuses this one
        elif kind == "unknown_previous_response":
            b["previous_response_id"] = f"resp_soak{self.seed}x{r.randint(0, 10**9)}"
        elif kind == "responses_prompt_template":
            b["prompt"] = {"id": "pmpt_soak", **({"version": "1"} if r.random() < 0.5 else {})}
        elif kind == "text_and_structured_outputs":
            b.pop("tools", None)
            b.pop("tool_choice", None)
            b["text"] = {"format": {"type": "json_schema", "name": "person", "schema": JSON_SCHEMA}}
            b["structured_outputs"] = {"regex": r.choice(REGEXES)}
        elif kind == "previous_input_and_response_id":
            b["previous_input_messages"] = [{"role": "user", "content": r.choice(WORDS)}]
            b["previous_response_id"] = f"resp_soak{self.seed}x{r.randint(0, 10**9)}"
        elif kind == "bad_service_tier":
            b["service_tier"] = "turbo"
        elif kind == "bad_include":
            b["include"] = ["message.everything"]
        elif kind == "tokenize_prompt_not_text":
            lo, hi = SAFE_TOKEN_IDS
            b["prompt"] = [r.randint(lo, hi) for _ in range(r.randint(1, 8))]   # /tokenize takes text only
        fam += ["must_fail", f"fail:{kind}"]
        return kind


def body_for_wire(req: Req, seed: int) -> bytes:
    if req.raw is not None:
        return req.raw.encode()
    return json.dumps(expand(req.body, seed)).encode()


def stored_body(req: Req) -> dict:
    return copy.deepcopy(req.body)
