#!/usr/bin/env python3
"""Prompt logprobs under MTP come from the target model (vllm#53488; the plugin's fix_prompt_logprobs_vs_drafter).

vLLM 0.21 computes prompt logprobs after the MTP drafter ran; in a step small enough to replay as a CUDA graph the
drafter's graphs overwrite the target's hidden states first (session 23's soak: 2 x "nan" 400s, 2-token prompts).
A causal model's logprob of prompt token i depends on tokens 0..i only, so a short prompt (a graph-sized step) and
the same tokens followed by a long filler (an eager step, past the largest CUDA graph) must give the same prompt
logprobs for the short prompt's tokens, up to the rounding of GEMMs of other shapes. Drafter output in place of the
target's rows gives other numbers (often several nats off) or NaN.

Against a running server (--url), `rounds` pairs of /v1/completions with token-id prompts and prompt_logprobs:
writes a JSON record (--out) with every pair's largest difference; exit 0 when every logprob is finite and every
difference is within --tolerance nats, else 1.

  python3 bench/gpu/prompt_logprobs_check.py --url http://127.0.0.1:8000 --out /tmp/results/plp-check.json
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import sys
import urllib.parse

# ids well inside Qwen3.6's 248,320-token vocabulary and clear of its special tokens (151643 and up)
ID_RANGE = (1000, 150000)


def prompt_token_logprobs(choice: dict, ids: list[int]) -> list[float | None]:
    """The logprob vLLM gave each prompt token (None for the first, which has no context), as vLLM 0.21's
    completions answer shapes them: `prompt_logprobs`, one {token_id: {logprob, rank, decoded_token}} per position."""
    rows = choice["prompt_logprobs"]
    out: list[float | None] = []
    for pos, tid in enumerate(ids):
        row = rows[pos]
        if row is None:
            out.append(None)
            continue
        entry = row.get(str(tid))
        if entry is None:
            raise ValueError(f"position {pos}: token {tid} is not among its prompt logprobs {sorted(row)}")
        value = entry["logprob"]
        out.append(float("nan") if value is None else float(value))
    return out


def compare(short: list[float | None], long: list[float | None]) -> dict:
    """The short prompt's logprobs against the same positions of the long one."""
    pairs = [(a, b) for a, b in zip(short, long) if a is not None and b is not None]
    finite = all(math.isfinite(a) and math.isfinite(b) for a, b in pairs)
    diffs = [abs(a - b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
    return {"positions": len(pairs), "finite": finite, "max_abs_diff": round(max(diffs), 5) if diffs else None}


def verdict(rounds: list[dict], tolerance: float) -> dict:
    errors = [r for r in rounds if "error" in r]
    diffs = [r["max_abs_diff"] for r in rounds if r.get("max_abs_diff") is not None]
    out = {"rounds": len(rounds), "errors": len(errors), "all_finite": all(r.get("finite") for r in rounds),
           "max_abs_diff": max(diffs) if diffs else None, "tolerance": tolerance}
    out["ok"] = bool(rounds) and not errors and out["all_finite"] and all(d <= tolerance for d in diffs)
    return out


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    c = _conn(url, 300)
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {"raw": data[:500].decode(errors="replace")}


def _model(url: str) -> str:
    c = _conn(url, 30)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


def one_round(url: str, model: str, rng: random.Random, filler: int) -> dict:
    k = rng.randint(2, 8)
    ids = [rng.randrange(*ID_RANGE) for _ in range(k)]
    tail = [rng.randrange(*ID_RANGE) for _ in range(filler)]
    got = {}
    for name, prompt in (("short", ids), ("long", ids + tail)):
        status, body = _post(url, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1,
                                                      "temperature": 0.0, "prompt_logprobs": 1})
        if status != 200:
            return {"k": k, "error": f"{name}: HTTP {status}: {json.dumps(body)[:300]}"}
        got[name] = prompt_token_logprobs(body["choices"][0], ids)
    return {"k": k, **compare(got["short"], got["long"]), "short": got["short"], "long": got["long"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True, help="the JSON record")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--filler", type=int, default=1100,
                   help="tokens after the short prompt: past vLLM's largest CUDA graph (512 by default), so eager")
    p.add_argument("--tolerance", type=float, default=0.25, help="nats; GEMMs of other shapes round differently")
    p.add_argument("--seed", type=int, default=53488)
    a = p.parse_args(argv)
    rng, model = random.Random(a.seed), _model(a.url)
    rounds = [one_round(a.url, model, rng, a.filler) for _ in range(a.rounds)]
    record = {"command": " ".join(sys.argv), "model": model, "filler": a.filler, "seed": a.seed,
              **verdict(rounds, a.tolerance), "pairs": rounds}
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1, allow_nan=True)
    print(json.dumps({k: v for k, v in record.items() if k != "pairs"}))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
