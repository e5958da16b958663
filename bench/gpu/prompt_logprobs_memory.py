"""GPU machine: does a prompt_logprobs request stay inside the engine's memory budget?

vLLM 0.21 turns a prompt_logprobs request's whole scheduled chunk into vocabulary-wide fp32 logprobs at once, a
peak its memory profile never reserves (session 10's AWQ soak: the engine held 7.6 GiB over its budget). The plugin
computes them in slices of at most 128 MiB (`fix_prompt_logprobs_slices`). This sends one completions request with
prompt_logprobs on a prompt of about --tokens tokens through a running server and reads the GPU's used memory
(nvidia-smi) before and after; the torch caching allocator keeps what the peak reserved, so the growth shows it.

  python3 bench/gpu/prompt_logprobs_memory.py --url http://127.0.0.1:8000 --gpu 0 --json OUT.json

Prints one JSON object; exit 0 when the request answered 200 with the prompt's logprobs and the growth stayed
under --max-growth-gib (default 1.0: vLLM's own whole-chunk peak for 8,000 tokens is > 10 GiB).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request


def used_mib(gpu: str) -> int:
    out = subprocess.check_output(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  text=True)
    return int(out.strip().splitlines()[0])


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server's base URL (turingbox's sidecar or vLLM)")
    p.add_argument("--gpu", default="0", help="nvidia-smi index of the server's GPU")
    p.add_argument("--tokens", type=int, default=8000, help="approximate prompt length")
    p.add_argument("--logprobs", type=int, default=5, help="prompt_logprobs (top-k per prompt token)")
    p.add_argument("--max-growth-gib", type=float, default=1.0)
    p.add_argument("--json", default="", help="also write the result here")
    a = p.parse_args()
    model = get(a.url + "/v1/models")["data"][0]["id"]
    prompt = "alpha beta gamma delta " * max(1, a.tokens // 4)      # ~1 token per word for this tokenizer
    before = used_mib(a.gpu)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                       "prompt_logprobs": a.logprobs}).encode()
    req = urllib.request.Request(a.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            status, answer = r.status, json.load(r)
    except urllib.error.HTTPError as e:
        status, answer = e.code, {"error": e.read().decode(errors="replace")[:500]}
    seconds = time.monotonic() - t0
    time.sleep(1.0)
    after = used_mib(a.gpu)
    choice = (answer.get("choices") or [{}])[0]
    n_prompt_logprobs = len(choice.get("prompt_logprobs") or [])
    growth_gib = (after - before) / 1024
    res = {"model": model, "status": status, "seconds": round(seconds, 3),
           "prompt_tokens": (answer.get("usage") or {}).get("prompt_tokens"), "prompt_logprobs": n_prompt_logprobs,
           "used_mib_before": before, "used_mib_after": after, "growth_gib": round(growth_gib, 3),
           "max_growth_gib": a.max_growth_gib, "error": answer.get("error")}
    res["ok"] = status == 200 and n_prompt_logprobs > 0 and growth_gib < a.max_growth_gib
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
