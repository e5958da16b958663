#!/usr/bin/env python3
"""GPU machine: does vLLM 0.21 (transformers 5.17 there) serve the demo model as written?

Builds a 4-layer demo with `turingbox demo-model`, checks the tokenizer that transformers loads there
(class, ids == tiktoken ranks, special ids) and that AutoProcessor loads (preprocessor configs), then
starts `vllm serve DEMO --load-format dummy` text-only (and, with --multimodal, once more without the
image/video limits so vLLM builds the HF processor) and sends chat requests with tools and thinking on
and off, comparing vLLM's /tokenize of the chat with the local template + tokenizer.

  source bench/gpu/bootstrap.sh && python3 bench/gpu/demo_model_check.py --out $OUT [--multimodal]

Prints one JSON summary line per check and writes $OUT/demo_model_check.json (+ vllm-*.log).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time

SAMPLES = ["Hello, world!", "你好，世界！", "def f(x):\n    return x  # 注释\n", "emoji 😀👍🏽🇯🇵",
           "<|im_start|>user\nhi<|im_end|>"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]


def request(port, method, path, body=None, timeout=300.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def local_checks(model):
    import transformers
    from transformers import AutoProcessor, AutoTokenizer
    from turingbox.model import tokenizer as T
    out = {"transformers": transformers.__version__}
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model)
    out["tokenizer_class"], out["tokenizer_load_s"] = type(tok).__name__, round(time.monotonic() - t0, 2)
    out["ids_match_tiktoken"] = all(tok.encode(s, add_special_tokens=False) == T.reference_encode(s)
                                    for s in SAMPLES)
    out["special_ids"] = {t: tok.convert_tokens_to_ids(t) for t in
                          ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                           "<tool_call>", "</tool_call>")}
    try:
        proc = AutoProcessor.from_pretrained(model)
        out["processor"] = [type(proc).__name__, type(getattr(proc, "image_processor", None)).__name__,
                            type(getattr(proc, "video_processor", None)).__name__]
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        out["processor_error"] = f"{type(exc).__name__}: {exc}"[:400]
    out["local_prompt_ids"] = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
    if isinstance(out["local_prompt_ids"], dict):
        out["local_prompt_ids"] = out["local_prompt_ids"]["input_ids"]
    return out


def serve_checks(model, port, out_dir, text_only):
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--load-format", "dummy",
            "--port", str(port), "--max-model-len", "4096", "--max-num-seqs", "8", "--enforce-eager",
            "--gpu-memory-utilization", "0.5", "--served-model-name", "demo",
            "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if text_only:
        argv += ["--limit-mm-per-prompt", json.dumps({"image": 0, "video": 0})]
    log_path = os.path.join(out_dir, f"vllm-{'text' if text_only else 'mm'}.log")
    res = {"text_only": text_only}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            while time.monotonic() - t0 < 540:
                if proc.poll() is not None:
                    res["exited"] = proc.returncode
                    break
                try:
                    if request(port, "GET", "/health", timeout=2)[0] == 200:
                        res["ready_s"] = round(time.monotonic() - t0, 1)
                        break
                except OSError:
                    pass
                time.sleep(2)
            if "ready_s" not in res:
                return res
            for name, extra in (("thinking", {}), ("no_thinking", {"chat_template_kwargs": {"enable_thinking": False}})):
                body = {"model": "demo", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 16, **extra}
                t1 = time.monotonic()
                status, data = request(port, "POST", "/v1/chat/completions", body)
                r = json.loads(data) if status == 200 else {"error": data[:300].decode(errors="replace")}
                res[name] = {"status": status, "s": round(time.monotonic() - t1, 2),
                             "prompt_tokens": (r.get("usage") or {}).get("prompt_tokens"),
                             "error": r.get("error")}
            status, data = request(port, "POST", "/tokenize", {"model": "demo", "messages": MESSAGES,
                                                                "tools": TOOLS, "add_generation_prompt": True})
            res["tokenize_status"] = status
            res["server_prompt_ids"] = json.loads(data).get("tokens") if status == 200 else data[:300].decode()
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--model", default="/tmp/demo-check")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--multimodal", action="store_true", help="also start once without the mm limits")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    summary = {}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "turingbox", "demo-model", args.model, "--layers", "4"],
                       capture_output=True, text=True)
    summary["build"] = {"rc": r.returncode, "s": round(time.monotonic() - t0, 1), "out": (r.stdout + r.stderr)[-400:]}
    print(json.dumps({"build": summary["build"]}), flush=True)
    if r.returncode:
        sys.exit(1)
    local = local_checks(args.model)
    summary["local"] = {k: v for k, v in local.items() if k != "local_prompt_ids"}
    print(json.dumps({"local": summary["local"]}), flush=True)
    runs = [True] + ([False] if args.multimodal else [])
    for text_only in runs:
        res = serve_checks(args.model, args.port, args.out, text_only)
        res["server_matches_local_prompt"] = res.get("server_prompt_ids") == local["local_prompt_ids"]
        res.pop("server_prompt_ids", None)
        summary["serve_text_only" if text_only else "serve_multimodal"] = res
        print(json.dumps({"serve": res}), flush=True)
    with open(os.path.join(args.out, "demo_model_check.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
