#!/usr/bin/env python3
"""GPU machine: real clients through the sidecar (issue 8, part 2).

Run while `turingbox serve` is up (bench/gpu/side_by_side.py --after runs it with the ports set):

    PROXY_PORT=8000 DIRECT_PORT=8100 MODEL=demo TOKENIZER=/tmp/demo OUT=/tmp/results \
        python3 bench/gpu/real_clients.py

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

# Every value is an enum: the dummy-weight model's favourite token (" range") is legal inside a free JSON
# string, so a free `city` string would never close and every forced call would end at max_tokens.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Lisbon", "Porto"]},
                                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
# Forced calls may still run to max_tokens: vLLM 0.21 compiles tool schemas with xgrammar's any_whitespace and
# no whitespace limit (v1/structured_output/backend_xgrammar.py), and a dummy-weight model may prefer a
# whitespace token wherever the grammar allows one. Such a call is reported as truncated (its text must
# still be what the grammar allows so far); a call that stops must be complete, valid JSON.
TOOL_MAX_TOKENS = 256
USER = [{"role": "user", "content": "What is the weather in Lisbon?"}]
# vLLM applies a forced tool call's grammar only after the reasoning parser saw </think>; dummy weights never
# write it, so tool-call requests turn thinking off (the template then closes the think block in the prompt).
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def reasoning_of(obj) -> str | None:
    """vLLM 0.21 returns the parser's reasoning as `reasoning`; older servers said `reasoning_content`."""
    extra = getattr(obj, "model_extra", None) or {}
    for key in ("reasoning", "reasoning_content"):
        value = extra.get(key, getattr(obj, key, None))
        if value is not None:
            return value
    return None


def check_arguments(arguments: str, finish_reason: str | None) -> dict:
    """A forced call's arguments: complete JSON with the required keys, or (cut at max_tokens) a prefix the
    grammar allows, i.e. empty or an object opened with `{` (unconstrained dummy output is ' range range')."""
    if finish_reason == "stop":
        args = json.loads(arguments)
        assert isinstance(args, dict) and args.get("city") in ("Lisbon", "Porto"), arguments
        return {"complete": True, "arguments": args}
    assert finish_reason == "length", finish_reason
    assert arguments.strip() == "" or arguments.lstrip().startswith("{"), f"not constrained JSON: {arguments[:200]!r}"
    return {"complete": False, "finish_reason": finish_reason, "arguments_head": arguments[:80]}


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
        r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], max_tokens=TOOL_MAX_TOKENS,
                                           temperature=0, extra_body=NO_THINK,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather" and calls[0].id, r
        return {"name": calls[0].function.name, "id": calls[0].id,
                **check_arguments(calls[0].function.arguments, r.choices[0].finish_reason)}

    @check("tool_call.named.stream")
    def _():
        name, arguments, finish, deltas = None, "", None, 0
        for c in client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL],
                                                max_tokens=TOOL_MAX_TOKENS, temperature=0, stream=True,
                                                extra_body=NO_THINK,
                                                tool_choice={"type": "function", "function": {"name": "get_weather"}}):
            for ch in c.choices:
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    deltas += 1
                    if tc.function is not None:   # a delta may carry only the index/id
                        name = tc.function.name or name
                        arguments += tc.function.arguments or ""
        assert name == "get_weather", (name, deltas)
        return {"name": name, "tool_call_deltas": deltas, **check_arguments(arguments, finish)}

    @check("tool_call.required")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL],
                                           max_tokens=TOOL_MAX_TOKENS, temperature=0, tool_choice="required",
                                           extra_body=NO_THINK)
        calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        if finish == "length" and not calls:
            # vLLM parses "required" output as a JSON list only when complete; a cut list yields no calls.
            return {"complete": False, "finish_reason": finish}
        assert finish in ("stop", "tool_calls") and calls and calls[0].function.name == "get_weather", r
        return {"complete": True, "calls": [(c.function.name, json.loads(c.function.arguments)) for c in calls]}

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

    @check("multi_turn.reasoning_in")
    def _():
        # An agent turn sending its earlier reasoning back. vLLM 0.21 reads an assistant message's `reasoning`
        # (entrypoints/chat_utils.py, _parse_chat_message_content; `reasoning_content` on input is dropped) and
        # the template renders it only for assistant turns after the last user query, i.e. tool-use steps.
        thought = "The user wants the current weather in Lisbon, so I call get_weather with city Lisbon."
        call = {"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lisbon", "unit": "c"})}}

        def prompt_tokens(extra: dict) -> int:
            msgs = USER + [{"role": "assistant", "content": "", "tool_calls": [call], **extra},
                           {"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"temp_c": 21})}]
            r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], max_tokens=8,
                                               temperature=0)
            return r.usage.prompt_tokens

        bare, with_reasoning = prompt_tokens({}), prompt_tokens({"reasoning": thought})
        legacy = prompt_tokens({"reasoning_content": thought})
        assert with_reasoning >= bare + 10, (bare, with_reasoning)
        return {"prompt_tokens": {"without": bare, "reasoning": with_reasoning, "reasoning_content": legacy}}

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

    truncated = [c["check"] for c in checks if c["ok"] and isinstance(c["detail"], dict)
                 and c["detail"].get("complete") is False]
    ok = all(c["ok"] for c in checks) and all(b["rc"] == 0 and b.get("failed") == 0 for b in bench.values())
    json.dump({"checks": checks, "bench_serve": bench, "ok": ok, "tool_calls_cut_at_max_tokens": truncated},
              open(os.path.join(OUT, os.environ.get("REAL_CLIENTS_JSON", "real_clients.json")), "w"),
              indent=1)
    print(f"{sum(c['ok'] for c in checks)}/{len(checks)} client checks passed"
          + (f" ({', '.join(truncated)}: cut at max_tokens, grammar-valid so far)" if truncated else "")
          + "; bench serve "
          + ", ".join(f"{k}: {v.get('completed')} done, {v.get('failed')} failed, "
                      f"{v.get('output_throughput')} tok/s out, TTFT p50 {v.get('median_ttft_ms')} ms"
                      for k, v in bench.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
