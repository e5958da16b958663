"""Active warmup: real OpenAI requests through the engine before readiness flips.

The worker-side strict warmup (turingbox_plugin.worker) covers the kernels; this covers everything
above them that only a real HTTP request exercises: tokenizer and chat template, the OpenAI
serving layers (chat, completion, streaming, tool parsing), detokenisation, and backend failures
that only show on a real prompt (the seed's FlashInfer fp8/half crash died on the first request).
"""
from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any, Callable

from turingbox_plugin.errors import ToolError


class WarmupError(ToolError):
    """Active warmup failed: one sentence naming the request that failed and why."""


LONG_PARAGRAPH = ("The appliance plans the GPUs, starts the engine, warms every kernel and only then "
                  "reports ready, so that the first user request costs what the hundredth does. ")
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


# Requests whose failure is recorded, not raised: a server may refuse grammars (no xgrammar, a model
# or template without tool support) and still serve everything else. Each has its own time bound.
OPTIONAL_TIMEOUT_S = 120.0
# Thinking off: Qwen3-style reasoning parsers apply the grammar only after the reasoning ends, so
# with thinking on a short request may never reach the grammar bitmask at all.
NO_THINKING = {"enable_thinking": False}


def long_prompt(approx_tokens: int) -> str:
    # ~25 tokens per paragraph for BPE tokenizers; precision does not matter, length does.
    return LONG_PARAGRAPH * max(1, approx_tokens // 25) + "\nSummarise the text above in one sentence."


def build_requests(model: str, max_tokens: int, long_tokens: int) -> list[dict[str, Any]]:
    """The fixed request set: (name, path, body, stream)."""
    chat = [{"role": "user", "content": "Count from one to twenty in words."}]
    reqs = [
        {"name": "chat-greedy", "path": "/v1/chat/completions", "stream": False,
         "body": {"model": model, "messages": chat, "max_tokens": max_tokens, "temperature": 0.0}},
        {"name": "chat-sampled-stream", "path": "/v1/chat/completions", "stream": True,
         "body": {"model": model, "messages": chat, "max_tokens": max_tokens, "temperature": 0.7, "top_p": 0.95,
                  "stream": True}},
        {"name": "completion-greedy-stream", "path": "/v1/completions", "stream": True,
         "body": {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0.0,
                  "stream": True}},
        {"name": "completion-sampled", "path": "/v1/completions", "stream": False,
         "body": {"model": model, "prompt": "The quick brown fox", "max_tokens": max_tokens, "temperature": 1.0,
                  "seed": 1234}},
        {"name": "chat-long-prompt", "path": "/v1/chat/completions", "stream": False,
         "body": {"model": model, "messages": [{"role": "user", "content": long_prompt(long_tokens)}],
                  "max_tokens": 16, "temperature": 0.0}},
        {"name": "chat-tool-call", "path": "/v1/chat/completions", "stream": False,
         "body": {"model": model, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                  "tools": TOOLS, "tool_choice": "auto", "max_tokens": max_tokens, "temperature": 0.0}},
        # Structured output: vLLM compiles a grammar in the engine core (the xgrammar backend and
        # tokenizer info are built on the first one, seconds) and masks logits in the workers.
        {"name": "chat-forced-tool-call", "path": "/v1/chat/completions", "stream": False, "optional": True,
         "structured": "tool_call",
         "body": {"model": model, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                  "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                  "chat_template_kwargs": NO_THINKING, "max_tokens": max_tokens, "temperature": 0.0}},
        {"name": "chat-json-object", "path": "/v1/chat/completions", "stream": False, "optional": True,
         "structured": "json",
         "body": {"model": model, "messages": [{"role": "user", "content":
                  "Reply with a JSON object with keys city and country for Paris."}],
                  "response_format": {"type": "json_object"}, "chat_template_kwargs": NO_THINKING,
                  "max_tokens": max_tokens, "temperature": 0.0}},
    ]
    return reqs


def _token_ids(client: Any, model: str, text: str) -> list[int] | None:
    """vLLM's /tokenize of text without special tokens; None when it does not answer that."""
    try:
        r = client.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False}, timeout=30)
        tokens = r.json().get("tokens") if r.status_code == 200 else None
    except Exception:
        return None
    return [int(t) for t in tokens] if isinstance(tokens, list) and tokens else None


def structured_applied(kind: str, data: dict[str, Any]) -> bool:
    """Whether a non-streamed chat answer has the shape the grammar forces (informational)."""
    message = (data.get("choices") or [{}])[0].get("message") or {}
    if kind == "tool_call":
        return bool(message.get("tool_calls"))
    return str(message.get("content") or "").lstrip().startswith("{")


def _one(client: Any, req: dict[str, Any], clock: Callable[[], float]) -> dict[str, Any]:
    """Send one request; returns timings; raises WarmupError with one sentence on failure."""
    import httpx

    t0 = clock()
    first = None
    chunks = 0
    applied = None
    try:
        if req["stream"]:
            with client.stream("POST", req["path"], json=req["body"]) as r:
                if r.status_code != 200:
                    r.read()
                    raise WarmupError(f"active warmup request {req['name']} got HTTP {r.status_code}: "
                                      f"{r.text.strip()[:200]}")
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if event.get("error"):
                        raise WarmupError(f"active warmup request {req['name']} streamed an error: "
                                          f"{str(event['error'])[:200]}")
                    if event.get("choices"):
                        chunks += 1
                        if first is None:
                            first = clock() - t0
            if chunks == 0:
                raise WarmupError(f"active warmup request {req['name']} streamed no token.")
        else:
            bound = {"timeout": req["timeout"]} if "timeout" in req else {}
            r = client.post(req["path"], json=req["body"], **bound)
            if r.status_code != 200:
                raise WarmupError(f"active warmup request {req['name']} got HTTP {r.status_code}: "
                                  f"{r.text.strip()[:200]}")
            data = r.json()
            if not data.get("choices"):
                raise WarmupError(f"active warmup request {req['name']} returned no choices.")
            chunks = 1
            if req.get("structured"):
                applied = structured_applied(req["structured"], data)
    except httpx.HTTPError as exc:
        raise WarmupError(f"active warmup request {req['name']} failed: {type(exc).__name__}: {exc}.") from None
    except ValueError as exc:
        raise WarmupError(f"active warmup request {req['name']} returned invalid JSON ({exc}).") from None
    total = clock() - t0
    result = {"name": req["name"], "seconds": round(total, 4),
              "ttft_seconds": round(first, 4) if first is not None else None, "chunks": chunks}
    if applied is not None:
        result["structured_applied"] = applied
    return result


def _one_or_skip(client: Any, req: dict[str, Any], clock: Callable[[], float]) -> dict[str, Any]:
    """Optional requests: a failure becomes {"skipped": sentence} in the result instead of an error."""
    if not req.get("optional"):
        return _one(client, req, clock)
    t0 = clock()
    try:
        return _one(client, req, clock)
    except WarmupError as exc:
        return {"name": req["name"], "seconds": round(clock() - t0, 4), "ttft_seconds": None, "chunks": 0,
                "skipped": str(exc)}


def run_active_warmup(base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                      max_tokens: int = 32, long_prompt_tokens: int = 3000,
                      concurrencies: tuple[int, ...] = (),
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Run the request set once, all kinds at the same time, then (if asked) a mixed batch at each concurrency.

    The kinds run together because what they warm is per kind, not per order (chat template, tool
    and reasoning parsers, detokenizer, sampler variants), and the worker's strict warmup has already
    launched every kernel specialisation: sequentially they cost ~4.7 s on an H200, together about one
    request's time. max_tokens 32 gives several MTP draft/verify rounds at depth <= 7; a concurrency
    sweep uses half of it. There is none by default: serve's sweep at 1, 4 and 16 cost 2.3 s of a seeded start,
    and a start with no active warmup at all had 0 JIT after ready and a first TTFT 1.18x the later ones (session
    12, H200), so its batch classes are the strict warmup's waves. Returns timings per request and per concurrency;
    raises WarmupError (one sentence) on the first failure of a required request. Optional (structured-output)
    requests are bounded by OPTIONAL_TIMEOUT_S and a failure is reported as "skipped" in their result.
    """
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = clock()
    batches: list[dict[str, Any]] = []
    deadline = started + timeout
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout) as client:
        reqs = build_requests(model, max_tokens, long_prompt_tokens)
        brace = _token_ids(client, model, "{")
        if brace:
            # allowed_token_ids with a grammar: the plugin's check (a 400 when the two leave no first token)
            # builds its xgrammar backend in the API server on the first such request, off the event loop;
            # this one (consistent: "{" may start a JSON object) has it built before ready.
            reqs.append({"name": "chat-json-allowed-ids", "path": "/v1/chat/completions", "stream": False,
                         "optional": True, "structured": "json",
                         "body": {"model": model, "messages": [{"role": "user", "content": "Reply in JSON."}],
                                  "response_format": {"type": "json_object"}, "allowed_token_ids": brace,
                                  "chat_template_kwargs": NO_THINKING, "max_tokens": 1, "temperature": 0.0}})
        for req in reqs:
            if req.get("optional"):
                req["timeout"] = min(timeout, OPTIONAL_TIMEOUT_S)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(reqs)) as pool:
            futures = [pool.submit(_one_or_skip, client, req, clock) for req in reqs]
            results = [f.result() for f in futures]  # in request order; re-raises the first WarmupError
        sweep = build_requests(model, max(1, max_tokens // 2), long_prompt_tokens)
        for n in sorted(set(c for c in concurrencies if c >= 1)):
            if clock() > deadline:
                raise WarmupError(f"active warmup exceeded its {timeout:.0f} s budget before concurrency {n}.")
            t0 = clock()
            batch = [dict(sweep[i % 4], name=f"{sweep[i % 4]['name']}@{n}") for i in range(n)]
            with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
                futures = [pool.submit(_one, client, r, clock) for r in batch]
                batch_results = [f.result() for f in futures]  # re-raises the first WarmupError
            batches.append({"concurrency": n, "seconds": round(clock() - t0, 4),
                            "max_request_seconds": max(r["seconds"] for r in batch_results)})
    return {"base_url": base_url, "model": model, "seconds": round(clock() - started, 4),
            "requests": results, "concurrency": batches}
