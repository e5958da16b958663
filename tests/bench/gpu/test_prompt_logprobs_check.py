"""bench/gpu/prompt_logprobs_check.py, the GPU check of the plugin's fix_prompt_logprobs_vs_drafter (vllm#53488), run
end to end against a real HTTP server that answers /v1/completions' prompt_logprobs as vLLM 0.21 shapes them: a
causal stand-in (a token's logprob depends on the tokens up to it) passes; one whose short, graph-sized prompts get
other rows (as the drafter's overwrite gives), or NaN rendered as vLLM's 400, fails."""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "bench", "gpu"))
import prompt_logprobs_check as plp  # noqa: E402

GRAPH_MAX = 512          # vLLM's default largest CUDA graph: steps up to this many tokens replay a graph


def causal_logprob(prefix: list[int]) -> float:
    return -(int(hashlib.sha256(json.dumps(prefix).encode()).hexdigest()[:6], 16) % 1500) / 100


def serve(mode: str):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "demo", "object": "model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            ids = body["prompt"]
            graph = len(ids) <= GRAPH_MAX
            if mode == "nan" and graph:
                self._send(400, {"error": {"message": "Out of range float values are not JSON compliant: nan",
                                           "type": "BadRequestError", "param": None, "code": 400}})
                return
            rows = [None]
            for i in range(1, len(ids)):
                lp = causal_logprob(ids[:i + 1])
                if mode == "overwritten" and graph:
                    lp = causal_logprob([7] + ids[:i + 1])        # another model's rows
                rows.append({str(ids[i]): {"logprob": lp, "rank": 3, "decoded_token": "x"},
                             "11": {"logprob": -0.5, "rank": 1, "decoded_token": "y"}})
            self._send(200, {"object": "text_completion", "model": "demo", "choices": [
                {"index": 0, "text": "z", "finish_reason": "length", "prompt_logprobs": rows}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("mode,ok", [("causal", True), ("overwritten", False), ("nan", False)])
def test_the_check_passes_only_target_rows(tmp_path, mode, ok):
    server = serve(mode)
    try:
        out = tmp_path / "plp.json"
        rc = plp.main(["--url", f"http://127.0.0.1:{server.server_port}", "--out", str(out), "--rounds", "4",
                       "--filler", "600"])
    finally:
        server.shutdown()
    record = json.loads(out.read_text())
    assert (rc == 0) is ok and record["ok"] is ok and record["rounds"] == 4
    if mode == "causal":
        assert record["max_abs_diff"] == 0 and all(p["positions"] == p["k"] - 1 for p in record["pairs"])
    elif mode == "overwritten":
        assert record["max_abs_diff"] > record["tolerance"]
    else:
        assert record["errors"] == 4 and "nan" in record["pairs"][0]["error"]


def test_a_nan_logprob_is_not_finite_and_fails_the_verdict():
    row = plp.compare([None, -1.0, float("nan")], [None, -1.0, -2.0])
    assert row == {"positions": 2, "finite": False, "max_abs_diff": 0.0}
    assert plp.verdict([{"k": 3, **row}], 0.25)["ok"] is False
    assert math.isnan(plp.prompt_token_logprobs({"prompt_logprobs": [None, {"5": {"logprob": None}}]}, [4, 5])[1])
