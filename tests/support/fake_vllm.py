#!/usr/bin/env python3
"""A stand-in for `vllm serve` in tests: a real HTTP server process speaking enough of vLLM's
OpenAI API (/health, /v1/models, /v1/chat/completions, /v1/completions, a non-streaming /v1/responses;
SSE streams; n choices) to test the sidecar, with switches for the faults serve must survive.

Takes the vllm CLI's argv shape: `fake_vllm.py serve MODEL --host H --port P [vllm flags...]`
(unknown vllm flags are ignored; --served-model-name takes one or more names, as vLLM's nargs='+').

A request's answer is max_tokens tokens long (`tok0 tok1 ...`; a model that never stops), `chunks` when it sets
none, or eos-after when that is shorter. Each "request" event records the body's n, max_tokens,
max_completion_tokens, max_output_tokens, model, stream, use_beam_search, best_of and temperature as the fake
received them. A request
whose client goes away (connection closed) before its answer is complete, stream or not, gets a "cancelled"
event: vLLM 0.21 aborts such a request (its disconnect handling), so this is the record of an abort. Like vLLM 0.21 it binds its port first and answers only once
its (simulated) engine is up, printing vLLM's own stage log lines on the way. Like the
turingbox plugin, it writes `<runtime_dir>/worker-<n>.json` for each worker (TP ranks x DP engines), with the
KV cache size as the plugin reports it: kv-cache-bytes when it "profiled", the size it was given with
--kv-cache-memory-bytes otherwise (and vLLM's line for either).

Switches: a `--fake-NAME VALUE` flag (e.g. after `turingbox serve ... --`) or the environment
variable FAKE_VLLM_NAME (upper case, '-' -> '_'):
  stage-seconds F     time spent in each of loading / compiling / capturing (0)
  startup-seconds F   extra delay before loading starts: a slow start (0)
  chunks N            content chunks per response when the request sets no max_tokens (5)
  eos-after N         the answer ends (finish_reason "stop") after N tokens even when max_tokens allows more (0: never)
  check-model 1       like vLLM 0.21 (_check_model): a request naming a model that is not one of the served names
                      gets 404 NotFoundError, param "model" (0, the default: any name; older tests send "m")
  chunk-delay F       seconds before each chunk (0)
  first-chunk-delay F seconds between the response headers and the first chunk: prefill (0)
  prefill-per-token F and F seconds more per prompt token (a token-id list's length, else its words): a TTFT
                      that grows with the prompt, for the prefill bench (0)
  role-chunk 1        chat streams start like vLLM's: a role-only chunk (content "") written right
                      before the first content chunk, as two writes (0)
  die-after-chunks N  exit in the middle of a stream after sending N chunks (0 = never)
  exit-code N         exit code when dying (3); die-signal N: kill itself with signal N instead
  fail-at STAGE       exit with an error during loading | compiling | capturing
  fail-line TEXT      with fail-at: a line printed before the error, e.g. vLLM's "Available KV cache memory: -3 GiB"
  control-dir DIR     while DIR/hang exists every request hangs (turn a hang on and off at run time)
  fail-requests 1     answer every completion request with HTTP 500 (as vLLM does on an engine error)
  events FILE         JSON lines: started, request, cancelled, completed, sigterm, dying
  record FILE         JSON lines: every completion request's path and whole body, as received
  structured-outputs M  what a grammar request (response_format, a forced tool_choice) gets: "" answers it like
                      any other (the default); apply: a forced tool call's `tool_calls` / a JSON object, as vLLM
                      with a grammar backend does (non-streaming); refuse: HTTP 400 "structured outputs are not
                      supported" (a server without structured-output support)
  structured-delay F  grammar requests answer F seconds late: a grammar that compiles slowly (0)
  plugin MODE         ok | missing | fail: the worker status files written (ok)
  kv-cache-bytes N    the KV cache size its memory profile "measures" (10 GiB, as its log line says)
  jit-after-ready S   "kernel=count,..." reported as JIT compiles after ready
  ignore-sigterm 1    ignore SIGTERM (serve must escalate to SIGKILL)
  sigterm-seconds F   time to shut down after SIGTERM (0)
  child 1             start a child process in the same process group (like vLLM's engine core)
  keepalive-race 1    close a kept-alive connection instead of answering its second GET: what a client sees
                      when uvicorn's keep-alive timeout (vLLM: 5 s) fires just as the request arrives
  keepalive-race-methods M,N  the methods keepalive-race applies to (GET)
  close-after-error 1 after an error answer (4xx/5xx from a completion route), close the connection
                      ~20 ms later without `Connection: close`, unread bytes and all, as vLLM 0.21's uvicorn
                      does after "Exception in ASGI application" (1: the default, as vLLM behaves)
  max-model-len N     prompts longer than this (in words) get vLLM's 400 (4096)
  metrics PAGE        recorded: GET /metrics answers a page recorded from vLLM 0.21.0 on an H200
                      (tests/fixtures/vllm-0.21.0-metrics.txt; the default); none: 404, like a vLLM without it

Like vLLM 0.21 with a --speculative-config, min_p > 0 or a logit_bias gets vLLM's 400 ("... are not yet
supported with speculative decoding.").
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULTS = {
    "stage-seconds": "0", "startup-seconds": "0", "chunks": "5", "chunk-delay": "0", "first-chunk-delay": "0", "role-chunk": "0",
    "die-after-chunks": "0", "exit-code": "3", "die-signal": "0", "fail-at": "", "fail-line": "", "control-dir": "",
    "events": "", "plugin": "ok", "jit-after-ready": "", "ignore-sigterm": "0", "sigterm-seconds": "0",
    "child": "0", "fail-requests": "0", "keepalive-race": "0", "close-after-error": "1", "max-model-len": "4096",
    "metrics": "recorded",
    # "compiled" / "loaded": log vLLM 0.21's line for two torch.compile graphs compiled or loaded from its cache
    "graphs": "",
    "keepalive-race-methods": "GET",
    "eos-after": "0", "check-model": "0",
    "prefill-per-token": "0", "record": "", "structured-outputs": "", "structured-delay": "0",
    # data-parallel engines whose workers report (empty: all); fewer stands for an engine whose plugin is not active
    "engines-reporting": "",
    "kv-cache-bytes": str(10 << 30),
    # what the plugin's worker says of its fix keeping --kv-cache-memory-bytes out of vLLM's compile key
    "kv-key-fix": "applied",
}
RECORDED_FIELDS = ("n", "max_tokens", "max_completion_tokens", "max_output_tokens", "model", "stream", "use_beam_search",
                   "best_of", "temperature")
# vLLM 0.21's own message (sampling_params.py, _validate_spec_decode).
SPEC_DECODE_REFUSAL = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
MAX_LOGPROBS = 20          # vLLM 0.21's ModelConfig.max_logprobs default
VOCAB_SIZE = 248320        # Qwen3.6's vocabulary, what -1 stands for


def sample_logprobs(body: dict, path: str):
    """SamplingParams.logprobs as vLLM 0.21's request models set it: chat top_logprobs when logprobs is true,
    completions logprobs, responses top_logprobs when include asks for output logprobs."""
    if path.endswith("/chat/completions"):
        value = body.get("top_logprobs") if body.get("logprobs") else None
    elif path.endswith("/responses"):
        value = body.get("top_logprobs") if "message.output_text.logprobs" in (body.get("include") or []) else None
    else:
        value = body.get("logprobs")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def flag_value(argv: list[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def flag_values(argv: list[str], flag: str) -> list[str]:
    """An nargs='+' flag's values (the last occurrence wins, as argparse does)."""
    values: list[str] = []
    for i, arg in enumerate(argv):
        if arg == flag:
            values = []
            for v in argv[i + 1:]:
                if v.startswith("-"):
                    break
                values.append(v)
        elif arg.startswith(flag + "="):
            values = [arg.split("=", 1)[1]]
    return values


def parse(argv: list[str]) -> dict:
    if len(argv) < 2 or argv[0] != "serve":
        sys.exit("fake_vllm: usage: fake_vllm.py serve MODEL --host H --port P ...")
    names = flag_values(argv, "--served-model-name") or [argv[1]]
    opts = {"model": argv[1],
            "host": flag_value(argv, "--host") or "127.0.0.1",
            "port": int(flag_value(argv, "--port") or 8000),
            "served": names[0], "served_names": names,
            "tp": int(flag_value(argv, "--tensor-parallel-size") or 1),
            "dp": int(flag_value(argv, "--data-parallel-size") or 1),
            "api_key": flag_value(argv, "--api-key"),
            "kv_given": flag_value(argv, "--kv-cache-memory-bytes"),
            "speculative": flag_value(argv, "--speculative-config") is not None}
    extra = flag_value(argv, "--additional-config")
    try:
        opts["turingbox"] = (json.loads(extra) if extra else {}).get("turingbox", {})
    except ValueError:
        opts["turingbox"] = {}
    for name, default in DEFAULTS.items():
        env = "FAKE_VLLM_" + name.upper().replace("-", "_")
        opts[name] = flag_value(argv, "--fake-" + name) or os.environ.get(env) or default
    return opts


O: dict = {}
RECORDED_METRICS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "vllm-0.21.0-metrics.txt")
_events_lock = threading.Lock()
_log_lock = threading.Lock()
_request_ids = iter(range(1, 1 << 30))


def log(level: str, where: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    with _log_lock:
        print(f"(APIServer pid={os.getpid()}) {level} {stamp} [{where}] {message}", flush=True)


def event(kind: str, **fields) -> None:
    if not O.get("events"):
        return
    line = json.dumps({"event": kind, "t": time.time(), "pid": os.getpid(), **fields})
    with _events_lock, open(O["events"], "a") as f:
        f.write(line + "\n")


def record(path: str, body: dict) -> None:
    if O.get("record"):
        with _events_lock, open(O["record"], "a") as f:
            f.write(json.dumps({"path": path, "body": body}) + "\n")


def prompt_token_count(body: dict) -> int:
    """The prompt's length in the fake's tokens: a token-id list's length, else its words."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    if prompt is None:
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    return len(str(prompt).split())


def is_grammar(body: dict) -> bool:
    """A request vLLM answers under a grammar: a response_format, or a tool call it must make."""
    return bool(body.get("response_format")) or isinstance(body.get("tool_choice"), dict) \
        or body.get("tool_choice") == "required"


def structured_message(body: dict) -> dict:
    """What a model under vLLM's grammar answers: the forced function's call, or a JSON object."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_0", "type": "function",
            "function": {"name": choice["function"]["name"], "arguments": "{\"city\": \"Paris\"}"}}]}
    return {"role": "assistant", "content": "{\"city\": \"Paris\", \"country\": \"France\"}"}


def die(why: str) -> None:
    log("ERROR", "core.py:1100", "EngineCore encountered a fatal error.")
    log("ERROR", "fake_vllm.py:1", f"fake vllm: dying on purpose ({why})")
    event("dying", why=why)
    sys.stdout.flush()
    sig = int(O["die-signal"])
    if sig:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # behaviour: the signal ends this process; nothing after the kill runs
    os._exit(int(O["exit-code"]))


def hang_if_asked() -> None:
    control = O.get("control-dir")
    while control and os.path.exists(os.path.join(control, "hang")):
        time.sleep(0.05)  # behaviour: a request hangs for as long as DIR/hang exists


def client_gone(sock: socket.socket) -> bool:
    """True when the client closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-vllm/0.21.0"

    def setup(self):
        super().setup()
        # Like uvicorn: no Nagle delay between the header and body writes.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def parse_request(self):
        if not super().parse_request():
            return False
        served = getattr(self, "_served_on_connection", 0)
        self._served_on_connection = served + 1
        if served and self.command in O["keepalive-race-methods"].split(",") and O["keepalive-race"] == "1":
            self.close_connection = True            # no response at all: the client reads EOF
            return False
        return True

    def log_message(self, fmt, *args):      # vLLM-like access log line
        log("INFO", "h11_impl.py:0", f'{self.address_string()} - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error_then_close(self, status: int, message: str, kind: str) -> None:
        """An error answer from inside the app: vLLM's uvicorn then drops the connection a few ms later."""
        self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})
        if O["close-after-error"] not in ("0", ""):
            self.wfile.flush()
            time.sleep(0.02)  # behaviour: long enough for a pooled client to write its next request into it
            self.close_connection = True

    def _refusal(self, body: dict, path: str = "") -> tuple[int, str] | None:
        """vLLM's own 400s for what the fake can check: spec-decode parameters, prompt length."""
        # vLLM's ResponsesRequest has no min_p field: one sent there never reaches SamplingParams; greedy sampling
        # sets min_p to 0 (SamplingParams.__post_init__); beam search samples with parameters of its own
        greedy = isinstance(body.get("temperature"), (int, float)) and body["temperature"] < 1e-5
        min_p = 0 if path.endswith("/responses") or greedy else (body.get("min_p") or 0)
        if O["speculative"] and not body.get("use_beam_search") and (min_p > 1e-5 or body.get("logit_bias")):
            return 400, SPEC_DECODE_REFUSAL
        asked = sample_logprobs(body, path)
        if asked is not None and (asked == -1 or asked > MAX_LOGPROBS):
            return 400, (f"Requested sample logprobs of {VOCAB_SIZE if asked == -1 else asked}, which is greater "
                         f"than max allowed: {MAX_LOGPROBS} (parameter=logprobs, value={asked})")
        prompt = body.get("prompt")
        if prompt is None:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
        words = len(str(prompt).split())
        if words > int(O["max-model-len"]):
            return 400, (f"This model's maximum context length is {O['max-model-len']} tokens. However, your "
                         f"request has {words} input tokens. Please reduce the length of the input messages.")
        return None

    def _authorized(self) -> bool:
        if not O["api_key"]:
            return True
        if self.headers.get("Authorization") == f"Bearer {O['api_key']}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):
        hang_if_asked()
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/metrics" and O["metrics"] == "recorded":
            with open(RECORDED_METRICS, "rb") as f:
                page = f.read()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
        elif self.path == "/v1/models":
            if self._authorized():
                self._json(200, {"object": "list", "data": [
                    {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                     "root": O["model"], "max_model_len": 4096} for name in O["served_names"]]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFoundError", "code": 404}})

    def _not_allowed(self):
        """What vLLM's FastAPI app answers to other methods: 405 on its routes, 404 elsewhere."""
        path = self.path.partition("?")[0]
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if path in ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses"):
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._json(404, {"detail": "Not Found"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = _not_allowed

    def do_HEAD(self):
        self.send_response(405 if self.path.partition("?")[0] in ("/health", "/v1/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        hang_if_asked()
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        if path == "/tokenize":
            if not self._authorized():
                return
            # vLLM's /tokenize answer shape; the fake's "tokenizer" is one id per character (1000 + code point)
            try:
                req = json.loads(raw or b"{}")
                # the chat form (TokenizeChatRequest): the messages' text, as the template would join it
                prompt = "".join(str(m.get("content") or "") for m in req["messages"]) if "messages" in req \
                    else str(req.get("prompt", ""))
            except (ValueError, AttributeError, TypeError):
                self._json(400, {"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}})
                return
            tokens = [1000 + ord(c) for c in prompt]
            event("tokenize", prompt=prompt[:40])
            self._json(200, {"count": len(tokens), "max_model_len": int(O["max-model-len"]),
                             "tokens": tokens, "token_strs": None})
            return
        if path == "/detokenize":
            if not self._authorized():
                return
            try:
                text = "".join(chr(int(t) - 1000) for t in json.loads(raw or b"{}")["tokens"])
            except (ValueError, AttributeError, TypeError, KeyError):
                self._json(400, {"error": {"message": "invalid tokens", "type": "BadRequestError", "code": 400}})
                return
            self._json(200, {"prompt": text})
            return
        if path not in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            self._json(404, {"error": {"message": f"no route {path}", "type": "NotFoundError", "code": 404}})
            return
        if not self._authorized():
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._error_then_close(400, f"invalid JSON: {exc}", "BadRequestError")
            return
        record(path, body)
        model = body.get("model")
        if O["check-model"] not in ("0", "") and model and model not in O["served_names"]:
            # vLLM 0.21 serving.py _check_model: an empty or missing name means the first served model
            event("request", id=0, path=path, refused=404, model=model)
            self._json(404, {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError",
                                       "param": "model", "code": 404}})
            return
        if O["fail-requests"] not in ("0", ""):
            event("request", id=0, path=path, failed=True)
            self._error_then_close(500, "EngineCore encountered an issue (fake).", "InternalServerError")
            return
        grammar = is_grammar(body)
        if grammar and O["structured-outputs"] == "refuse":
            event("request", id=0, path=path, refused=400)
            self._json(400, {"error": {"message": "structured outputs are not supported", "type": "BadRequestError",
                                       "param": None, "code": 400}})
            return
        if grammar and float(O["structured-delay"]):
            time.sleep(float(O["structured-delay"]))  # behaviour: a grammar that takes this long to compile
        refused = self._refusal(body, path)
        in_generator = refused is not None and (refused[1] == SPEC_DECODE_REFUSAL
                                                or refused[1].startswith("Requested sample logprobs"))
        if in_generator and body.get("stream"):
            # vLLM validates sampling parameters inside a stream's generator: 200, then one error event; its
            # responses API raises there, so the stream breaks off after the 200 without an event.
            event("request", id=0, path=path, refused=refused[0], stream=True)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if path.endswith("/responses"):
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            err = {"error": {"message": refused[1], "type": "BadRequestError", "param": None, "code": 400}}
            self._chunk(b"data: " + json.dumps(err).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        if refused is not None:
            event("request", id=0, path=path, refused=refused[0])
            self._error_then_close(refused[0], refused[1], "BadRequestError")
            return
        rid = next(_request_ids)
        chat = path.endswith("chat/completions")
        try:
            n = int(body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
                    or O["chunks"])
            choices = int(body.get("n") or 1)
            if n < 1:
                self._error_then_close(400, f"max_tokens must be at least 1, got {n}.", "BadRequestError")
                return
        except (TypeError, ValueError):
            # vLLM's pydantic 400 echoes the whole request as the error's input: it can be large.
            self._error_then_close(400, "1 validation error: max_tokens: Input should be a valid integer "
                                        f"[input_value={json.dumps(body)}]", "BadRequestError")
            return
        stream = bool(body.get("stream")) and path != "/v1/responses"
        event("request", id=rid, path=path, query=query, stream=stream, chunks=n, bytes=len(raw),
              authorization=self.headers.get("Authorization"), request_headers=dict(self.headers.items()),
              allowed_token_ids=body.get("allowed_token_ids"),
              body={k: body[k] for k in RECORDED_FIELDS if k in body})
        eos = int(O["eos-after"])
        finish = "stop" if eos and eos < n else "length"
        n = min(n, eos) if eos else n
        prefill = float(O["first-chunk-delay"]) + float(O["prefill-per-token"]) * prompt_token_count(body)
        if stream:
            self._stream(rid, chat, n, bool((body.get("stream_options") or {}).get("include_usage")), choices, finish,
                         prefill)
        else:
            # "Generate" while watching the client, as vLLM's with_cancellation does: a client that leaves aborts it.
            if not self._wait(prefill + float(O["chunk-delay"]) * n):
                event("cancelled", id=rid, chunks_sent=0)
                self.close_connection = True
                return
            text = "".join(f"tok{i} " for i in range(n))
            if path == "/v1/responses":
                self._json(200, {"id": f"resp-fake-{rid}", "object": "response", "created_at": int(time.time()),
                                 "model": O["served"], "status": "completed", "output": [
                                     {"type": "message", "role": "assistant", "id": f"msg-{rid}", "status": "completed",
                                      "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                                 "usage": {"input_tokens": 3, "output_tokens": n, "total_tokens": n + 3}})
                event("completed", id=rid, chunks=n)
                return
            message = structured_message(body) if chat and grammar and O["structured-outputs"] == "apply" \
                else {"role": "assistant", "content": text}
            choice = [{"index": c, "message": message, "finish_reason": finish}
                      if chat else {"index": c, "text": text, "finish_reason": finish} for c in range(choices)]
            prompt_tokens = 3
            if not chat and body.get("prompt_logprobs") is not None:
                # like vLLM: one entry per prompt token (a word here), None for the first
                prompt_tokens = max(1, len(str(body.get("prompt") or "").split()))
                for c in choice:
                    c["prompt_logprobs"] = [None] + [{"1": {"logprob": -1.0, "rank": 1, "decoded_token": "w"}}] * (
                        prompt_tokens - 1)
            self._json(200, {"id": f"cmpl-fake-{rid}", "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": O["served"], "choices": choice,
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n * choices,
                                       "total_tokens": n * choices + prompt_tokens}})
            event("completed", id=rid, chunks=n)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds` in short steps; False as soon as the client has gone."""
        end = time.monotonic() + seconds
        while True:
            if client_gone(self.connection):
                return False
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.02))  # behaviour: generation takes `seconds`

    def _stream(self, rid: int, chat: bool, n: int, usage: bool, choices: int = 1, finish: str = "length",
                first_delay: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        delay = float(O["chunk-delay"])
        die_after = int(O["die-after-chunks"])
        sent = 0
        try:
            for i in range(n):
                if i == 0 and first_delay and not self._wait(first_delay):
                    event("cancelled", id=rid, chunks_sent=sent)
                    self.close_connection = True
                    return
                if delay:
                    time.sleep(delay)  # behaviour: decoding one chunk takes chunk-delay
                if client_gone(self.connection):
                    event("cancelled", id=rid, chunks_sent=sent)
                    self.close_connection = True
                    return
                if chat and i == 0 and O["role-chunk"] not in ("0", ""):
                    role = {"id": f"cmpl-fake-{rid}", "object": "chat.completion.chunk", "created": int(time.time()),
                            "model": O["served"], "fake_seq": -1, "choices": [
                                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                    self._chunk(b"data: " + json.dumps(role).encode() + b"\n\n")
                for c in range(choices):        # with n > 1, one chunk per choice at each step, as vLLM interleaves
                    if chat:
                        delta = {"content": f"tok{i} "} if i else {"role": "assistant", "content": "tok0 "}
                        choice = {"index": c, "delta": delta, "finish_reason": finish if i == n - 1 else None}
                        obj = "chat.completion.chunk"
                    else:
                        choice = {"index": c, "text": f"tok{i} ", "finish_reason": finish if i == n - 1 else None}
                        obj = "text_completion"
                    payload = {"id": f"cmpl-fake-{rid}", "object": obj, "created": int(time.time()),
                               "model": O["served"], "choices": [choice], "fake_seq": i, "fake_sent_at": time.time()}
                    self._chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")
                sent += 1
                if die_after and sent == die_after:
                    die(f"after {sent} chunks of request {rid}")
            if usage:
                u = {"id": f"cmpl-fake-{rid}", "object": "chat.completion.chunk", "choices": [],
                     "usage": {"prompt_tokens": 3, "completion_tokens": n * choices, "total_tokens": n * choices + 3}}
                self._chunk(b"data: " + json.dumps(u).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            event("completed", id=rid, chunks=sent)
        except (BrokenPipeError, ConnectionResetError):
            event("cancelled", id=rid, chunks_sent=sent)
            self.close_connection = True


def write_worker_status() -> None:
    runtime_dir = O["turingbox"].get("runtime_dir") or os.environ.get("TBPLUGIN_RUNTIME_DIR")
    if not runtime_dir or O["plugin"] == "missing":
        return
    jit = {}
    for item in filter(None, O["jit-after-ready"].split(",")):
        name, _, count = item.partition("=")
        jit[name] = int(count or 1)
    os.makedirs(runtime_dir, exist_ok=True)
    # one file per worker of every data-parallel engine, numbered engine x TP + rank as the plugin's
    # contract.status_rank numbers them (vLLM runs a dense model's DP engines independently)
    engines = int(O["engines-reporting"]) if O["engines-reporting"] else O["dp"]
    for rank in range(O["tp"] * engines):
        ok = O["plugin"] == "ok"
        status = {"plugin_version": "fake", "pid": os.getpid(), "rank": rank, "stage": "ready" if ok else "failed",
                  "warmup": {"kernels": 7, "seconds": 0.1, "ok": ok, "error": None if ok else "fake warmup failure"},
                  "jit_after_ready": jit, "gdn_path": O["turingbox"].get("gdn", "vllm"),
                  "active": {"vllm_fixes": {"kv_size_out_of_compile_key": O["kv-key-fix"]}},
                  "kv_cache": {"bytes": kv_cache_bytes(), "given": O["kv_given"] is not None}}
        tmp = os.path.join(runtime_dir, f".worker-{rank}.tmp")
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, os.path.join(runtime_dir, f"worker-{rank}.json"))


def kv_cache_bytes() -> int:
    """What vLLM sizes the KV cache at: the bytes it was given, else what its memory profile measured."""
    return int(O["kv_given"] if O["kv_given"] is not None else O["kv-cache-bytes"])


def on_sigterm(sig, frame) -> None:
    event("sigterm", signal=sig)
    log("INFO", "launcher.py:110", "Shutting down FastAPI HTTP server.")
    if O["ignore-sigterm"] not in ("0", ""):
        log("INFO", "fake_vllm.py:1", "fake vllm: ignoring SIGTERM on purpose")
        return
    wait = float(O["sigterm-seconds"])
    threading.Thread(target=lambda: (time.sleep(wait), os._exit(0)), daemon=True).start()  # behaviour: a slow exit


def startup_stage(name: str, lines: list[tuple[str, str]], end_lines: list[tuple[str, str]]) -> None:
    for where, message in lines:
        log("INFO", where, message)
    if O["fail-at"] == name:
        if O["fail-line"]:
            log("INFO", "gpu_worker.py:462", O["fail-line"])
        log("ERROR", "core.py:1100", f"EngineCore failed to start: RuntimeError: fake failure while {name}")
        log("ERROR", "core.py:1101", "Traceback (most recent call last): ...")
        event("dying", why=f"fail-at {name}")
        sys.stdout.flush()
        os._exit(int(O["exit-code"]))
    time.sleep(float(O["stage-seconds"]))  # behaviour: each start stage takes stage-seconds
    for where, message in end_lines:
        log("INFO", where, message)


def main(argv: list[str]) -> None:
    O.update(parse(argv))
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    log("INFO", "utils.py:286", f"vLLM server version 0.21.0 (fake), serving model {O['model']}")
    # vLLM logs its non-default args, secrets included: serve must mask them in what it passes on.
    log("INFO", "utils.py:240", f"non-default args: {{'model': {O['model']!r}, 'api_key': {O['api_key']!r}, "
                                f"'hf_token': {flag_value(argv, '--hf-token')!r}}}")
    # Like vLLM 0.21 (setup_server before the engine starts): the port is bound and listening at
    # once, but requests wait unanswered until the engine is up.
    ThreadingHTTPServer.request_queue_size = 2048      # uvicorn's backlog (http.server's default is 5)
    server = ThreadingHTTPServer((O["host"], O["port"]), Handler)
    server.daemon_threads = True
    if O["child"] not in ("0", ""):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # behaviour: a child that lives on
        event("child", child_pid=child.pid)
    event("started", argv=argv, port=O["port"], pgid=os.getpgid(0),
          multiproc_method=os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"),   # how real vLLM starts its engine core
          pythonpath=os.environ.get("PYTHONPATH"))                           # what its imports would find first
    time.sleep(float(O["startup-seconds"]))  # behaviour: a slow start
    startup_stage("loading", [("gpu_model_runner.py:4858", f"Starting to load model {O['model']}...")],
                  [("default_loader.py:398", "Loading weights took 0.01 seconds"),
                   ("gpu_model_runner.py:4960", "Model loading took 0.50 GiB memory and 0.020000 seconds")])
    graph_lines = {"compiled": ("backends.py:393", "Compiling a graph for compile range (1, 8192) takes 0.01 s"),
                   "loaded": ("backends.py:292", "Directly load the compiled graph(s) for compile range (1, 8192) "
                                                 "from the cache, took 0.010 s")}
    graphs = [graph_lines[O["graphs"]]] * 2 if O["graphs"] in graph_lines else []
    kv_gib = kv_cache_bytes() / 2**30
    kv_line = (f"Initial free memory 139.10 GiB, reserved {kv_gib:.2f} GiB memory for KV Cache as specified by "
               "kv_cache_memory_bytes config and skipped memory profiling." if O["kv_given"] is not None
               else f"Available KV cache memory: {kv_gib:.2f} GiB")
    startup_stage("compiling", [("backends.py:1149", "Dynamo bytecode transform time: 0.01 s"), *graphs],
                  [("monitor.py:53", "torch.compile took 0.02 s in total"),
                   ("gpu_worker.py:463", kv_line),
                   ("kv_cache_utils.py:1710", "GPU KV cache size: 100,000 tokens")])
    startup_stage("capturing", [("gpu_model_runner.py:6305", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%")],
                  [("gpu_model_runner.py:6244", "Graph capturing finished in 1 secs, took 0.10 GiB"),
                   ("core.py:307", "init engine (profile, create kv cache, warmup model) took 1.00 s")])
    write_worker_status()
    log("INFO", "api_server.py:617", f"Starting vLLM server on http://{O['host']}:{O['port']}")
    event("serving")
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main(sys.argv[1:])
