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
    ]
    return reqs


def _one(client: Any, req: dict[str, Any], clock: Callable[[], float]) -> dict[str, Any]:
    """Send one request; returns timings; raises WarmupError with one sentence on failure."""
    import httpx

    t0 = clock()
    first = None
    chunks = 0
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
            r = client.post(req["path"], json=req["body"])
            if r.status_code != 200:
                raise WarmupError(f"active warmup request {req['name']} got HTTP {r.status_code}: "
                                  f"{r.text.strip()[:200]}")
            data = r.json()
            if not data.get("choices"):
                raise WarmupError(f"active warmup request {req['name']} returned no choices.")
            chunks = 1
    except httpx.HTTPError as exc:
        raise WarmupError(f"active warmup request {req['name']} failed: {type(exc).__name__}: {exc}.") from None
    except ValueError as exc:
        raise WarmupError(f"active warmup request {req['name']} returned invalid JSON ({exc}).") from None
    total = clock() - t0
    return {"name": req["name"], "seconds": round(total, 4),
            "ttft_seconds": round(first, 4) if first is not None else None, "chunks": chunks}


def run_active_warmup(base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                      max_tokens: int = 32, long_prompt_tokens: int = 3000,
                      concurrencies: tuple[int, ...] = (1, 4, 16),
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Run the request set once, all kinds at the same time, then a mixed batch at each concurrency.

    The kinds run together because what they warm is per kind, not per order (chat template, tool
    and reasoning parsers, detokenizer, sampler variants), and the worker's strict warmup has already
    launched every kernel specialisation: sequentially they cost ~4.7 s on an H200, together about one
    request's time. max_tokens 32 gives several MTP draft/verify rounds at depth <= 7; the concurrency
    sweep uses half of it. Returns timings per request and per concurrency; raises WarmupError (one
    sentence) on the first failure.
    """
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = clock()
    batches: list[dict[str, Any]] = []
    deadline = started + timeout
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout) as client:
        reqs = build_requests(model, max_tokens, long_prompt_tokens)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(reqs)) as pool:
            futures = [pool.submit(_one, client, req, clock) for req in reqs]
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


def concurrencies_for_plan(plan: dict[str, Any]) -> tuple[int, ...]:
    """The batch classes the plan allows (same rule as the worker's strict warmup), capped at 64."""
    from turingbox_plugin.warmup_plan import choose_concurrencies

    n = choose_concurrencies(int(plan.get("max_num_seqs") or 1), int(plan.get("num_speculative_tokens") or 0),
                             tuple(plan.get("cudagraph_capture_sizes") or ()))
    return tuple(c for c in n if c <= 64) or (1,)
