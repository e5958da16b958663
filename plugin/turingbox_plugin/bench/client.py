"""`bench decode` and `bench prefill` against a running OpenAI-compatible server (httpx)."""
from __future__ import annotations

import hashlib
import json
import random
import time
from typing import Any, Callable

from turingbox_plugin.bench import stats
from turingbox_plugin.errors import ToolError

DEFAULT_DECODE_PROMPT = ("Write a detailed, step by step explanation of how a CPU cache hierarchy works, "
                         "with examples.")
DEFAULT_PREFILL_LENGTHS = (2048, 4096, 8192, 16384, 32768)


def _client(base_url: str, api_key: str | None, timeout: float):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)


def discover_model(client: Any) -> tuple[str, int | None]:
    """First served model id and its max_model_len (vLLM adds that field to /v1/models)."""
    import httpx

    try:
        r = client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise ToolError(f"cannot reach {client.base_url}/v1/models ({type(exc).__name__}).") from None
    if r.status_code != 200:
        raise ToolError(f"{client.base_url}/v1/models answered HTTP {r.status_code}.")
    data = r.json().get("data") or []
    if not data:
        raise ToolError(f"{client.base_url}/v1/models lists no model.")
    return str(data[0]["id"]), data[0].get("max_model_len")


def _post(client: Any, path: str, body: dict) -> dict:
    import httpx

    try:
        r = client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise ToolError(f"request to {client.base_url}{path} failed ({type(exc).__name__}: {exc}).") from None
    if r.status_code != 200:
        raise ToolError(f"{client.base_url}{path} answered HTTP {r.status_code}: {r.text[:200]}")
    return r.json()


def bench_decode(base_url: str, model: str | None = None, repeats: int = 5, max_tokens: int = 512,
                 prompt: str = DEFAULT_DECODE_PROMPT, api_key: str | None = None, timeout: float = 600.0,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Non-streaming chat completions at concurrency 1; per request and summary figures."""
    if repeats < 1:
        raise ToolError(f"--repeats {repeats} is invalid: it must be at least 1.")
    with _client(base_url, api_key, timeout) as client:
        model = model or discover_model(client)[0]
        runs = []
        for i in range(repeats):
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0.0, "stream": False}
            t0 = clock()
            resp = _post(client, "/v1/chat/completions", body)
            # tok/s from the recorded (rounded) seconds, so the record agrees with itself
            # even for a sub-millisecond answer.
            seconds = round(clock() - t0, 6)
            text = (resp["choices"][0].get("message") or {}).get("content") or ""
            tokens = int((resp.get("usage") or {}).get("completion_tokens") or 0)
            runs.append({"request": i, "completion_tokens": tokens, "seconds": seconds,
                         "tok_per_s": round(tokens / seconds, 3) if seconds > 0 else 0.0,
                         "output_chars": len(text),
                         "output_sha256": hashlib.sha256(text.encode()).hexdigest()})
    return {"bench": "decode", "url": base_url, "model": model, "max_tokens": max_tokens,
            "repeats": repeats, "runs": runs, "summary": stats.decode_summary(runs)}


def _ttft_stream(client: Any, body: dict, clock: Callable[[], float]) -> float:
    """Seconds from sending a streaming completion to its first token-bearing event."""
    import httpx

    t0 = clock()
    try:
        with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise ToolError(f"{client.base_url}/v1/completions answered HTTP {r.status_code}: {r.text[:200]}")
            ttft = None
            for line in r.iter_lines():  # read to the end so the connection is reusable
                if ttft is not None or not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                if json.loads(payload).get("choices"):
                    ttft = clock() - t0
            if ttft is not None:
                return ttft
    except httpx.HTTPError as exc:
        raise ToolError(f"streaming request to {client.base_url} failed ({type(exc).__name__}: {exc}).") from None
    raise ToolError(f"{client.base_url}/v1/completions streamed no token.")


def prompt_tokens(length: int, seed: int, low: int = 1000, high: int = 30000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(length)]


def bench_prefill(base_url: str, model: str | None = None, lengths=DEFAULT_PREFILL_LENGTHS,
                  requests_per_length: int = 8, api_key: str | None = None, timeout: float = 600.0,
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """TTFT per prompt length (token-id prompts, so lengths are exact; each request's prompt is
    fresh so no prefix-cache hit shortens it; the first request per length is dropped as warmup),
    then TTFT = overhead + tokens / prefill_speed by least squares."""
    if requests_per_length < 2:
        raise ToolError(f"--requests {requests_per_length} is invalid: at least 2 are needed (the first is dropped).")
    with _client(base_url, api_key, timeout) as client:
        found, max_len = discover_model(client)
        model = model or found
        per_length, skipped = [], []
        for length in lengths:
            if max_len and length + 1 > int(max_len):
                skipped.append({"tokens": length, "reason": f"exceeds max_model_len {max_len}"})
                continue
            ttfts = []
            for i in range(requests_per_length):
                body = {"model": model, "prompt": prompt_tokens(length, seed=length * 1000 + i),
                        "max_tokens": 1, "temperature": 0.0, "stream": True}
                ttfts.append(_ttft_stream(client, body, clock))
            kept = ttfts[1:]
            per_length.append({"tokens": length, "ttft_s": [round(t, 6) for t in ttfts], "dropped_first": True,
                               "ttft_median_s": stats.median(kept), "ttft_p90_s": stats.percentile(kept, 90)})
    result: dict[str, Any] = {"bench": "prefill", "url": base_url, "model": model,
                              "requests_per_length": requests_per_length, "lengths": per_length,
                              "skipped": skipped}
    if len(per_length) >= 2:
        fit = stats.fit_ttft([(p["tokens"], p["ttft_median_s"]) for p in per_length])
        result["fit"] = {"overhead_s": fit.overhead_s, "prefill_tokens_per_s": fit.prefill_tokens_per_s,
                         "seconds_per_token": fit.slope, "r2": fit.r2}
    return result


def plot_prefill(result: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["tokens"] for p in result["lengths"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [p["ttft_median_s"] for p in result["lengths"]], "o", label="TTFT median")
    ax.plot(xs, [p["ttft_p90_s"] for p in result["lengths"]], "x", label="TTFT P90")
    fit = result.get("fit")
    if fit:
        ax.plot(xs, [fit["overhead_s"] + x * fit["seconds_per_token"] for x in xs], "-",
                label=f"fit: {fit['overhead_s']*1000:.0f} ms + tokens / {fit['prefill_tokens_per_s']:.0f} tok/s "
                      f"(R² {fit['r2']:.3f})")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"prefill: {result.get('model')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
