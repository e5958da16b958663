"""The sidecar's own answers in vLLM's shapes: OpenAI-shaped error bodies (as JSON responses, raw ASGI answers and
SSE error events, so OpenAI clients show the message), and the appliance's remedy appended to vLLM's refusals."""
from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse


def error_body(status: int, message: str, kind: str, **extra: Any) -> dict:
    """An OpenAI-shaped error body, so OpenAI clients show the message."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status, **extra}}


def error_response(status: int, message: str, kind: str, headers: dict | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, **extra), status_code=status, headers=headers)


async def send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def sse_event(body: dict) -> bytes:
    """An error event as vLLM itself sends one when a stream fails, followed by [DONE]."""
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def sse_error_event(message: str, status: int = 502) -> bytes:
    return sse_event(error_body(status, message, "upstream_error"))


# vLLM 0.21's refusal of sampling parameters under speculative decoding (sampling_params.py,
# _validate_spec_decode), as a 400 body or, for a stream, an SSE error event after 200: the sidecar
# appends the appliance's remedy to the sentence (plain text without quotes: valid inside the JSON string).
SPEC_DECODE_REFUSAL = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
_SPEC_DECODE_REFUSAL = SPEC_DECODE_REFUSAL[SPEC_DECODE_REFUSAL.index("not yet"):].encode()


def spec_remedy(plan: dict | None) -> bytes:
    """What the sidecar appends to vLLM's spec-decode refusal: b"" when the plan runs no MTP."""
    spec = int((plan or {}).get("num_speculative_tokens") or 0)
    if not spec:
        return b""
    refused = " and ".join((plan or {}).get("mtp_refused_parameters") or ["min_p", "logit_bias"])
    return (f" turingbox turned on MTP speculative decoding ({spec} draft tokens); restart with TURINGBOX_MTP=0 "
            f"(or --mtp 0) to use {refused}.").encode()


def add_remedy(data: bytes, remedy: bytes) -> bytes:
    return data.replace(_SPEC_DECODE_REFUSAL, _SPEC_DECODE_REFUSAL + remedy, 1) if remedy else data
