#!/usr/bin/env python3
"""Tiny OpenAI-shaped server for bench tests: /v1/models and streaming /v1/completions whose first
token arrives after OVERHEAD + len(prompt token ids) * PER_TOKEN seconds. Usage: PORT OVERHEAD PER_TOKEN"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, OVERHEAD, PER_TOKEN = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])


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
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "ttft-model", "max_model_len": 40000}]})
        else:
            self._send(404, {"error": "no route"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        prompt = body.get("prompt")
        n = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        time.sleep(OVERHEAD + n * PER_TOKEN)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in (json.dumps({"choices": [{"index": 0, "text": "x"}]}), "[DONE]"):
            chunk = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
