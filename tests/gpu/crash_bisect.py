#!/usr/bin/env python3
"""GPU machine: which of a soak's in-flight requests kills vLLM's engine (a device-side assert)?

Sends the candidates (a JSON list of {"endpoint", "body"} from soak-*.jsonl) to a running server one at a
time, checking after each that the server still answers a trivial request; then, if none killed it, all at
once. Prints and writes ($OUT/crash-bisect.json) the first culprit.
    python3 tests/gpu/crash_bisect.py --url http://127.0.0.1:8000 --candidates tests/gpu/crash_candidates.json
"""
import argparse, concurrent.futures as cf, json, os, sys, time
import httpx
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_gen import expand  # noqa: E402


def alive(c: httpx.Client) -> bool:
    try:
        r = c.post("/v1/completions", json={"model": "demo", "prompt": "hello", "max_tokens": 2}, timeout=60)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def send(c, cand, seed):
    body = expand(cand["body"], seed)
    body.pop("stream", None); body.pop("stream_options", None)
    try:
        r = c.post(cand["endpoint"], json=body, timeout=300)
        return r.status_code, r.text[:300]
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True); ap.add_argument("--candidates", required=True)
    ap.add_argument("--seed", type=int, default=15); ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    cands = json.load(open(a.candidates))
    result = {"tried": []}
    with httpx.Client(base_url=a.url, trust_env=False) as c:
        assert alive(c), "server not answering at start"
        for cand in cands:
            t0 = time.time(); status, text = send(c, cand, a.seed); ok = alive(c)
            keys = sorted(k for k in cand["body"] if k not in ("messages", "prompt", "model"))
            row = {"id": cand.get("id"), "endpoint": cand["endpoint"], "keys": keys, "status": status,
                   "text": text, "alive_after": ok, "s": round(time.time() - t0, 1)}
            result["tried"].append(row); print(json.dumps(row), flush=True)
            if not ok:
                result["culprit"] = cand; break
        else:
            with cf.ThreadPoolExecutor(len(cands)) as pool:
                outs = list(pool.map(lambda x: send(c, x, a.seed), cands))
            result["concurrent"] = {"statuses": [o[0] for o in outs], "alive_after": alive(c)}
            print(json.dumps(result["concurrent"]), flush=True)
    json.dump(result, open(os.path.join(a.out, "crash-bisect.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
