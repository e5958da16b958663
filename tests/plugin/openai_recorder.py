#!/usr/bin/env python3
"""OpenAI-shaped server that records every request body (one JSON line each) and answers grammar
requests the way vLLM does: a forced tool call gets `tool_calls`, response_format json gets a JSON
object. Usage: PORT RECORD_FILE [refuse|slow]. `refuse`: HTTP 400 to grammar requests (a server
without structured-output support); `slow`: grammar requests answer after 5 s."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, RECORD = int(sys.argv[1]), sys.argv[2]
MODE = sys.argv[3] if len(sys.argv) > 3 else ""
LOCK = threading.Lock()


def is_grammar(body):
    return bool(body.get("response_format")) or isinstance(body.get("tool_choice"), dict) \
        or body.get("tool_choice") == "required"


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": "demo", "max_model_len": 8192}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with LOCK, open(RECORD, "a") as f:
            f.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if is_grammar(body) and MODE == "refuse":
            self._send(400, {"error": {"message": "structured outputs are not supported", "code": 400}})
            return
        if is_grammar(body) and MODE == "slow":
            time.sleep(5)
        chat = self.path.endswith("chat/completions")
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            delta = {"delta": {"content": "x"}} if chat else {"text": "x"}
            for data in (json.dumps({"choices": [{"index": 0, **delta}]}), "[DONE]"):
                chunk = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
            return
        if not chat:
            self._send(200, {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})
            return
        message = {"role": "assistant", "content": "plain text"}
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_0", "type": "function",
                "function": {"name": choice["function"]["name"], "arguments": "{\"city\": \"Paris\"}"}}]}
        elif body.get("response_format"):
            message = {"role": "assistant", "content": "{\"city\": \"Paris\", \"country\": \"France\"}"}
        self._send(200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
