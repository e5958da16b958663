"""The traffic soak's request generator (tests/gpu/soak.py): seeded, deterministic, no I/O.

The parameter space is vLLM 0.21.0's own request models (vllm/entrypoints/openai/chat_completion/protocol.py
ChatCompletionRequest, .../completion/protocol.py CompletionRequest, vllm/sampling_params.py SamplingParams and
StructuredOutputsParams). Notes from that source that shape what is drawn here:
  - 0.21's CompletionRequest has no `best_of` (an extra field: allowed, logged, ignored); chat has no best_of.
  - n > 1 at temperature 0 is refused ("n must be 1 when using greedy sampling"); max_logprobs defaults to 20.
  - With a --speculative-config, min_p > 0 or any logit_bias is refused (SamplingParams._validate_spec_decode).
  - structured outputs: `structured_outputs` {json | regex | choice | grammar | json_object | structural_tag},
    exactly one; response_format json_object / json_schema maps onto it.
  - prompt + max_tokens > max_model_len is refused (renderers/params.py); prompt == max_model_len too.
  - prompt_logprobs with stream=True, stream_options without stream, top_logprobs without logprobs (chat): 400.

Prompt text comes from a fixed word list (soak_words.txt: 2048 words, each exactly one token in the Qwen3.6
tokenizer with or without a leading space), so `words ~= tokens`; soak.py calibrates the ratio and the chat
template's overhead from usage.prompt_tokens and passes them in. Long prompt texts are kept in the request
records as recipes ({"$text": [[kind, key, count], ...]}) that `expand()` turns back into the same text.
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
FAMILIES = [
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

# The requests that must fail, by the rule in vLLM 0.21 they break (tag "fail:<name>").
FAIL_KINDS = [
    "min_p_mtp", "logit_bias_mtp", "over_max_model_len", "prompt_plus_max_tokens", "greedy_n", "top_logprobs_21",
    "top_logprobs_no_logprobs", "prompt_logprobs_stream", "stream_options_no_stream", "negative_temperature",
    "top_p_zero", "presence_penalty_3", "repetition_penalty_0", "min_tokens_gt_max", "max_tokens_0",
    "allowed_out_of_vocab", "allowed_empty", "empty_stop", "named_tool_unknown", "tool_choice_no_tools",
    "empty_tools", "json_schema_missing", "two_constraints", "unknown_model", "bad_type",
    "empty_messages", "invalid_json",
]


# families whose request carries a structured output (tool_choice required / named is one too)
STRUCTURED_FAMILIES = frozenset({"response_format_json_object", "response_format_json_schema", "so_regex", "so_choice",
                                 "so_grammar", "so_json", "so_structural_tag", "tools_required", "tools_named"})


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
    endpoint: str                 # "chat" | "completions"
    body: dict                    # recipe form (long texts as {"$text": ...}); expand() before sending
    families: list[str]
    expect: str                   # "ok" | "fail:<kind>" | "boundary"
    intended_prompt_tokens: int
    prompt_class: str             # tiny | short | medium | long | near_max | over_max
    max_tokens: int
    timeout_s: float
    raw: str | None = None        # a raw (non-JSON) body to send instead of body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def summary(self) -> dict:
        b = self.body
        keys = ("stream", "n", "best_of", "use_beam_search", "temperature", "top_p", "top_k", "min_p", "logprobs",
                "top_logprobs", "prompt_logprobs", "echo", "ignore_eos", "min_tokens", "seed", "tool_choice")
        s = {k: b[k] for k in keys if k in b and not isinstance(b[k], (dict, list))}
        if isinstance(b.get("tool_choice"), dict):
            s["tool_choice"] = "named"
        if b.get("response_format"):
            s["response_format"] = b["response_format"].get("type") if isinstance(b["response_format"], dict) else "?"
        if isinstance(b.get("structured_outputs"), dict):
            s["structured_outputs"] = sorted(b["structured_outputs"])
        if "chat_template_kwargs" in b:
            s["thinking"] = (b["chat_template_kwargs"] or {}).get("enable_thinking")
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


class SoakGen:
    """Deterministic for (seed, model, max_model_len, mtp, calibration): the n-th draw is always the same."""

    def __init__(self, seed: int, model: str, max_model_len: int, mtp: bool = True,
                 calib: Calibration | None = None, long_output_weight: float = 1.0) -> None:
        self.seed = seed
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

    def request(self, stream_bias: float = 0.5) -> Req:
        r = self.rng
        rid = self.next_id
        self.next_id += 1
        fam: list[str] = []
        chat = r.random() < 0.6
        fam.append("chat" if chat else "completions")
        tokens, pclass = self._prompt_len()
        near_max = pclass in ("near_max", "over_max")
        mt = self._max_tokens(tokens, near_max)
        expect = "ok"
        if pclass == "near_max":
            # leave room for the output and the template (calibration is exact to a few tokens)
            overhead = self.calib.chat_thinking_overhead + self.calib.chat_overhead if chat else 8
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
        if chat:
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
        self._sampling(body, fam, chat, small, mt)
        self._structure(body, fam, chat, mt)
        fail = None
        if expect == "ok" and r.random() < 0.09:
            fail = self._break(body, fam, chat, mt)
            expect = f"fail:{fail}"
        if fail == "prompt_plus_max_tokens":
            mt = body.get("max_tokens") or body.get("max_completion_tokens") or mt
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
        # - an over-long prompt with truncate_prompt_tokens: vLLM cuts it instead of refusing it (session 7).
        if expect == "ok" and "allowed_token_ids" in fam and any(f in STRUCTURED_FAMILIES for f in fam):
            expect = "boundary"
        if expect == "fail:over_max_model_len" and "truncate_prompt_tokens" in body:
            expect = "boundary"
        return Req(rid, "chat" if chat else "completions", body, fam, expect, tokens, pclass, mt, timeout, raw)

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
        if r.random() < 0.04:
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
        elif x < 0.08:
            b["structured_outputs"] = {"regex": r.choice(REGEXES)}
            fam.append("so_regex")
        elif x < 0.10:
            b["structured_outputs"] = {"choice": r.sample(["red", "green", "blue", "yes", "no", "maybe"], 3)}
            fam.append("so_choice")
        elif x < 0.12:
            b["structured_outputs"] = {"grammar": r.choice(GRAMMARS)}
            fam.append("so_grammar")
        elif x < 0.14:
            b["structured_outputs"] = {"json": JSON_SCHEMA}
            fam.append("so_json")
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

    def _break(self, b: dict, fam: list[str], chat: bool, mt: int) -> str:
        """Make a request vLLM 0.21 must refuse; returns the rule's name."""
        r = self.rng
        kinds = [k for k in FAIL_KINDS if k != "over_max_model_len"]
        if not chat:
            kinds = [k for k in kinds if k not in ("top_logprobs_no_logprobs", "named_tool_unknown",
                                                   "tool_choice_no_tools", "empty_tools", "empty_messages")]
        if not self.mtp:
            kinds = [k for k in kinds if not k.endswith("_mtp")]
        # the MTP refusals are what chat UIs send: weight them up
        kind = r.choice(kinds + (["min_p_mtp", "logit_bias_mtp"] * 3 if self.mtp else []))
        mk = "max_completion_tokens" if "max_completion_tokens" in b else "max_tokens"
        if kind in ("min_p_mtp", "logit_bias_mtp") and b.pop("use_beam_search", None):
            fam.remove("beam")                   # beam search samples with params of its own: vLLM accepts both
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
        elif kind == "top_logprobs_21":
            if chat:
                b.update(logprobs=True, top_logprobs=21 + r.randint(0, 10))
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
        elif kind == "allowed_out_of_vocab":
            b["allowed_token_ids"] = [5, OUT_OF_VOCAB_ID]
        elif kind == "allowed_empty":
            b["allowed_token_ids"] = []
        elif kind == "empty_stop":
            b["stop"] = ["", "the"]
        elif kind == "named_tool_unknown":
            b["tools"] = TOOLS[:1]
            b["tool_choice"] = {"type": "function", "function": {"name": "no_such_tool"}}
        elif kind == "tool_choice_no_tools":
            b.pop("tools", None)
            b["tool_choice"] = "required"
        elif kind == "empty_tools":
            b["tools"] = []
        elif kind == "json_schema_missing":
            b.pop("structured_outputs", None)
            b["response_format"] = {"type": "json_schema"}
        elif kind == "two_constraints":
            b.pop("response_format", None)
            b["structured_outputs"] = {"regex": "[0-9]+", "choice": ["a", "b"]}
        elif kind == "unknown_model":
            b["model"] = "no-such-model"
        elif kind == "bad_type":
            b[mk] = "many"
        elif kind == "empty_messages":
            b["messages"] = []
        fam += ["must_fail", f"fail:{kind}"]
        return kind


def body_for_wire(req: Req, seed: int) -> bytes:
    if req.raw is not None:
        return req.raw.encode()
    return json.dumps(expand(req.body, seed)).encode()


def stored_body(req: Req) -> dict:
    return copy.deepcopy(req.body)
