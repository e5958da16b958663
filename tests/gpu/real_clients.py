#!/usr/bin/env python3
"""GPU machine: real clients through the sidecar (issue 8, part 2).

Run while `turingbox serve` is up (tests/gpu/side_by_side.py --after runs it with the ports set):

    PROXY_PORT=8000 DIRECT_PORT=8100 MODEL=demo TOKENIZER=/tmp/demo OUT=/tmp/results \
        python3 tests/gpu/real_clients.py

1. The official `openai` client against the sidecar: model list, chat, completions, streaming chat with
   usage, a forced tool call (plain and streamed; vLLM's structured output makes it valid JSON even with
   dummy weights), the Qwen3 reasoning parser's field, a multi-turn request that sends reasoning back, and
   a stream the client abandons (the upstream must drop it: vLLM's running-requests gauge back to 0).
2. `vllm bench serve` (vLLM's own client) through the sidecar and directly against the upstream, one
   after the other with the same workload.

Writes $OUT/real_clients.json and $OUT/bench-serve-{proxy,direct}.json; exit 1 if any client check failed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
import urllib.request

from openai import OpenAI

PROXY = int(os.environ.get("PROXY_PORT", "8000"))
DIRECT = int(os.environ.get("DIRECT_PORT", "8100"))
MODEL = os.environ.get("MODEL", "demo")
TOKENIZER = os.environ.get("TOKENIZER", "/tmp/demo")
OUT = os.environ.get("OUT", "/tmp/results")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
USER = [{"role": "user", "content": "What is the weather in Lisbon?"}]
# vLLM applies a forced tool call's grammar only after the reasoning parser saw </think>; dummy weights never
# write it, so tool-call requests turn thinking off (the template then closes the think block in the prompt).
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def reasoning_of(obj) -> str | None:
    """vLLM 0.21 returns the parser's reasoning as `reasoning`; older servers said `reasoning_content`."""
    extra = getattr(obj, "model_extra", None) or {}
    return extra.get("reasoning") if extra.get("reasoning") is not None else extra.get("reasoning_content")


def running_requests(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    vals = [float(m) for m in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)]
    return sum(vals)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    client = OpenAI(base_url=f"http://127.0.0.1:{PROXY}/v1", api_key="unused", max_retries=0, timeout=120)
    checks: list[dict] = []

    def check(name):
        def wrap(fn):
            t0 = time.perf_counter()
            try:
                detail = fn()
                checks.append({"check": name, "ok": True, "s": round(time.perf_counter() - t0, 3), "detail": detail})
            except Exception as e:  # record and go on: one report with every client's outcome
                checks.append({"check": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                               "trace": traceback.format_exc()[-800:]})
            print(json.dumps(checks[-1])[:600], flush=True)
        return wrap

    @check("models.list")
    def _():
        ids = [m.id for m in client.models.list().data]
        assert MODEL in ids, ids
        return ids

    @check("chat.completions")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=0)
        m = r.choices[0].message
        assert r.usage.completion_tokens == 16, r.usage
        assert (m.content or reasoning_of(m)), m
        return {"finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump(),
                "content_chars": len(m.content or ""), "reasoning_chars": len(reasoning_of(m) or "")}

    @check("completions")
    def _():
        r = client.completions.create(model=MODEL, prompt="The lighthouse keeper", max_tokens=16, temperature=0)
        assert r.usage.completion_tokens == 16 and r.choices[0].text, r
        return {"usage": r.usage.model_dump(), "text_chars": len(r.choices[0].text)}

    @check("chat.stream+usage")
    def _():
        chunks, text, usage, finish = 0, "", None, None
        for c in client.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
            chunks += 1
            if c.usage:
                usage = c.usage
            for ch in c.choices:
                text += (ch.delta.content or "") + (reasoning_of(ch.delta) or "")
                finish = ch.finish_reason or finish
        assert usage and usage.completion_tokens == 24 and chunks >= 3 and finish == "length", (chunks, usage, finish)
        return {"chunks": chunks, "usage": usage.model_dump(), "finish_reason": finish}

    @check("tool_call.named")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], max_tokens=64,
                                           temperature=0, extra_body=NO_THINK,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        args = json.loads(calls[0].function.arguments)
        assert isinstance(args, dict) and "city" in args, args
        return {"name": calls[0].function.name, "arguments": args, "id": calls[0].id}

    @check("tool_call.named.stream")
    def _():
        name, arguments = None, ""
        for c in client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], max_tokens=64,
                                                temperature=0, stream=True, extra_body=NO_THINK,
                                                tool_choice={"type": "function", "function": {"name": "get_weather"}}):
            for ch in c.choices:
                for tc in ch.delta.tool_calls or []:
                    name = tc.function.name or name
                    arguments += tc.function.arguments or ""
        assert name == "get_weather", name
        args = json.loads(arguments)
        assert isinstance(args, dict) and "city" in args, arguments
        return {"name": name, "arguments": args}

    @check("tool_call.required")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], max_tokens=64,
                                           temperature=0, tool_choice="required", extra_body=NO_THINK)
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        return {"calls": [(c.function.name, json.loads(c.function.arguments)) for c in calls]}

    @check("reasoning.qwen3_parser")
    def _():
        # Thinking on (the template's default): with no </think> in a truncated output everything is reasoning.
        on = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=0)
        off = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=0,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        m_on, m_off = on.choices[0].message, off.choices[0].message
        fields = sorted(k for k in (m_on.model_extra or {}) if "reason" in k)
        assert reasoning_of(m_on) and not m_on.content, m_on
        assert m_off.content and not reasoning_of(m_off), m_off
        return {"fields": fields, "thinking_on": {"reasoning_chars": len(reasoning_of(m_on))},
                "thinking_off": {"content_chars": len(m_off.content)}}

    @check("multi_turn.reasoning_content_in")
    def _():
        msgs = USER + [{"role": "assistant", "content": "Let me check.", "reasoning_content": "The user wants weather."},
                       {"role": "user", "content": "And in Porto?"}]
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens > 20, r.usage
        return {"prompt_tokens": r.usage.prompt_tokens}

    @check("stream.abandoned_by_client")
    def _():
        stream = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4000, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
        got = 0
        for _c in stream:
            got += 1
            if got == 3:
                break
        stream.close()
        during = running_requests(DIRECT)
        deadline = time.time() + 10
        while running_requests(DIRECT) > 0 and time.time() < deadline:
            time.sleep(0.1)
        after = running_requests(DIRECT)
        assert after == 0, f"upstream still runs {after} request(s) 10 s after the client left"
        return {"chunks_read": got, "running_right_after_close": during, "running_after": after}

    bench = {}
    for label, port in (() if os.environ.get("SKIP_BENCH_SERVE") else (("proxy", PROXY), ("direct", DIRECT))):
        name = f"bench-serve-{label}.json"
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai-chat",
               "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions",
               "--model", MODEL, "--tokenizer", TOKENIZER, "--dataset-name", "random",
               "--random-input-len", "512", "--random-output-len", "128", "--num-prompts", "48",
               "--max-concurrency", "8", "--ignore-eos", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--save-result", "--result-dir", OUT, "--result-filename", name]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        open(os.path.join(OUT, f"bench-serve-{label}.log"), "w").write(proc.stdout + proc.stderr)
        entry = {"rc": proc.returncode, "s": round(time.perf_counter() - t0, 1), "cmd": " ".join(cmd[1:])}
        path = os.path.join(OUT, name)
        if proc.returncode == 0 and os.path.exists(path):
            data = json.load(open(path))
            entry.update({k: data.get(k) for k in ("completed", "failed", "request_throughput", "output_throughput",
                                                   "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                                                   "median_itl_ms", "median_e2el_ms")})
        bench[label] = entry
        print(json.dumps({"bench_serve": label, **entry})[:600], flush=True)

    ok = all(c["ok"] for c in checks) and all(b["rc"] == 0 and b.get("failed") == 0 for b in bench.values())
    json.dump({"checks": checks, "bench_serve": bench, "ok": ok},
              open(os.path.join(OUT, os.environ.get("REAL_CLIENTS_JSON", "real_clients.json")), "w"),
              indent=1)
    print(f"{sum(c['ok'] for c in checks)}/{len(checks)} client checks passed; bench serve "
          + ", ".join(f"{k}: {v.get('completed')} done, {v.get('failed')} failed, "
                      f"{v.get('output_throughput')} tok/s out, TTFT p50 {v.get('median_ttft_ms')} ms"
                      for k, v in bench.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
