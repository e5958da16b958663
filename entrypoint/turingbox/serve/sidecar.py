"""The sidecar on the public port: health, metrics, the plan, and the /v1 proxy to vLLM.

The proxy passes vLLM's response through chunk by chunk as it arrives (no re-chunking, each
chunk written at once), cancels the upstream request when the client goes away, refuses new
requests before ready and while draining (503 + Retry-After), and ends a stream that vLLM
broke off with a clean SSE error event.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import httpcore
from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from prometheus_client import CONTENT_TYPE_LATEST

from turingbox.serve import admission, stages
from turingbox.serve.metrics import ServeMetrics, route_label
from turingbox.serve.options import ServeOptions

log = logging.getLogger("turingbox.serve")

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "trailers", "transfer-encoding", "upgrade", "proxy-connection"}
_DROP_REQUEST = _HOP_BY_HOP | {"host", "content-length", "expect"}
_DROP_RESPONSE = _HOP_BY_HOP | {"date", "server"}
_DROP_REQUEST_B = {h.encode() for h in _DROP_REQUEST}
_DROP_RESPONSE_B = {h.encode() for h in _DROP_RESPONSE}
PROXY_METHODS = ["GET", "POST"]     # all vLLM 0.21 serves under /v1; nothing else reaches it
# vLLM 0.21's token routes outside /v1 (vllm/entrypoints/serve/tokenize/api_router.py), proxied like /v1: a client
# of vLLM's server counts tokens with them
TOKEN_ROUTES = ("/tokenize", "/detokenize")
TOKEN_METHODS = ["POST"]             # vLLM's only method on them
DRAINING_RETRY_AFTER_S = 5
_NEED_KEY = "A valid API key is required: send 'Authorization: Bearer <key>'."


@dataclass
class ServeState:
    """What the sidecar answers from; the controller writes it, the handlers read it."""

    tracker: stages.StartupTracker
    options: ServeOptions
    plan: dict | None = None              # redacted: safe to show
    upstream_url: str | None = None
    upstream_api_key: str | None = None   # a key vLLM itself was given (passed after --)
    draining: bool = False
    startup_ok: bool = False
    upstream_dead: str | None = None      # why vLLM is gone (liveness fails)
    probe_failure: str | None = None      # after ready: why vLLM's /health did not answer
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    dead: asyncio.Event = field(default_factory=asyncio.Event)   # set together with upstream_dead

    def mark_upstream_dead(self, reason: str) -> None:
        self.upstream_dead = reason
        self.dead.set()

    def __post_init__(self) -> None:
        self.idle.set()

    def request_started(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self.idle.set()

    def is_ready(self) -> bool:
        return (self.tracker.stage == stages.READY and not self.draining and self.upstream_dead is None
                and self.probe_failure is None)

    def not_ready_body(self) -> dict[str, Any]:
        body = self.tracker.snapshot()
        if self.upstream_dead is not None:
            body.update(stage=stages.FAILED, estimate_s=None, reason=self.upstream_dead)
        elif self.draining:
            body.update(stage=stages.DRAINING, estimate_s=None, reason=stages.DESCRIPTIONS[stages.DRAINING])
        elif self.probe_failure is not None and self.tracker.stage == stages.READY:
            body.update(stage="unresponsive", estimate_s=None, reason=self.probe_failure)
        return body

    def retry_after(self) -> str:
        estimate = self.tracker.estimate()
        if self.draining or estimate is None:
            return str(DRAINING_RETRY_AFTER_S)
        return str(max(1, min(int(math.ceil(estimate)), 600)))


def _error_body(status: int, message: str, kind: str, **extra: Any) -> dict:
    """An OpenAI-shaped error body, so OpenAI clients show the message."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status, **extra}}


def _error(status: int, message: str, kind: str, headers: dict | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(_error_body(status, message, kind, **extra), status_code=status, headers=headers)


def sse_event(body: dict) -> bytes:
    """An error event as vLLM itself sends one when a stream fails, followed by [DONE]."""
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def sse_error_event(message: str, status: int = 502) -> bytes:
    return sse_event(_error_body(status, message, "upstream_error"))


# What the upstream pool raises when vLLM cannot be reached or breaks an exchange off.
UPSTREAM_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.TimeoutException, OSError)
_CONNECT_ERRORS = (httpcore.ConnectError, httpcore.ConnectTimeout, ConnectionRefusedError)
# Raised before any byte of a response arrived, mostly on a pooled connection that the server had closed
# (or was closing) under us, when the request never reached vLLM's app. Sending it once more is safe even
# when it did reach the app: uvicorn cancels a handler whose connection is gone, so vLLM aborts that
# request, and a generation has no other side effect.
_RETRY_ERRORS = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError, ConnectionResetError,
                 BrokenPipeError)
# vLLM 0.21's refusal of sampling parameters under speculative decoding (sampling_params.py,
# _validate_spec_decode), as a 400 body or, for a stream, an SSE error event after 200: the sidecar
# appends the appliance's remedy to the sentence (plain text without quotes: valid inside the JSON string).
_SPEC_DECODE_REFUSAL = b"not yet supported with speculative decoding."
_MAX_ERROR_BODY = 64 * 1024          # error bodies rewritten whole; larger ones (echoed input) pass as they are
_PARSE_INLINE_BYTES = 256 * 1024     # larger bodies are parsed in a thread: a 32 MiB json.loads takes the loop ~0.3 s


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


def _content_length(headers: list) -> int | None:
    for k, v in headers:
        if k.lower() == b"content-length":
            return int(v) if v.isdigit() else None
    return None
# vLLM's uvicorn closes idle keep-alive connections after 5 s: retire ours before that, so a request
# is never written into a connection the server is closing at the same moment.
UPSTREAM_KEEPALIVE_S = 4.0
_UPSTREAM_TIMEOUTS = {"timeout": {"connect": 10.0, "read": None, "write": None, "pool": None}}


def _plain_response(status: int, reason: bytes, message: str) -> bytes:
    body = json.dumps(_error_body(status, message, "invalid_request_error")).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body))) + body


def limited_protocol(max_header_bytes: int, header_timeout_s: float):
    """uvicorn's httptools protocol with a limit on the request head and a deadline to send it.

    uvicorn with httptools (what vLLM's own server runs) takes request heads of any size and waits
    for an unfinished head forever, so one client could hold memory or connections at will. Over
    the limit the client gets 431, past the deadline 408, and the connection is closed.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _HeadTooLarge(Exception):
        pass

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _raw_head_bytes = 0       # bytes received while a head is unfinished (bounds httptools' buffer)
        _in_head = True
        _head_timer = None
        _refusal: bytes | None = None

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._raw_head_bytes += len(data)
                if self._raw_head_bytes > 2 * max_header_bytes + 65536:
                    # One header line without an end never reaches on_header: stop it here.
                    self._too_large()
                    self.transport.write(self._refusal)
                    self.transport.close()
                    return
            super().data_received(data)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return      # a request is being answered: its head was complete
            self.transport.write(_plain_response(408, b"Request Timeout", f"The request head did not arrive "
                                                 f"within {header_timeout_s:g} s (setting client_timeout_seconds)."))
            self.transport.close()

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._in_head = True
            self._arm()
            super().on_message_begin()

        def _too_large(self) -> None:
            self._refusal = _plain_response(
                431, b"Request Header Fields Too Large", f"The request head is larger than the limit of "
                f"{max_header_bytes} bytes (setting max_header_bytes).")

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > max_header_bytes:
                self._too_large()
                raise _HeadTooLarge

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_head = False
            self._raw_head_bytes = 0
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if self._refusal is None:           # a genuinely malformed request
                super().send_400_response(msg)
                return
            self.transport.write(self._refusal)
            self.transport.close()

    return LimitedHttpToolsProtocol


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class Live(BaseModel):
    status: str = Field(description="'alive' (also while starting) or 'dead' (vLLM is gone)")
    stage: Optional[str] = None
    reason: Optional[str] = None


class Ready(BaseModel):
    status: str
    stage: str
    ready_after_s: float


class Started(BaseModel):
    status: str
    ready_after_s: Optional[float] = None


class NotReady(BaseModel):
    model_config = ConfigDict(extra="allow")
    stage: str = Field(description="planning, downloading (a Hugging Face id's files; `progress` says how "
                                    "far), starting, loading, compiling, capturing, warming, draining, failed or "
                                    "unresponsive")
    elapsed_s: Optional[float] = None
    estimate_s: Optional[float] = Field(None, description="seconds left by the typical stage lengths; "
                                                          "null when unknown or final")
    reason: Optional[str] = None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail


_UNAUTHORIZED = {401: {"model": ErrorBody, "description": "API key missing or wrong"}}
_JSON_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}


async def proxy_token() -> Response:
    """Schema only: the token routes are proxied by the sidecar's ASGI entry point, like /v1."""
    return _error(404, "The token routes are proxied by the sidecar's ASGI entry point.", "not_found")


class Sidecar:
    def __init__(self, state: ServeState, metrics: ServeMetrics) -> None:
        self.state = state
        self.metrics = metrics
        # Straight to httpcore (httpx's layer costs ~0.25 ms a request here); no read timeout: a long
        # prefill may take minutes before the first byte.
        self.pool = httpcore.AsyncConnectionPool(max_connections=None, max_keepalive_connections=256,
                                                 keepalive_expiry=UPSTREAM_KEEPALIVE_S)
        self._upstream: tuple[str, bytes, bytes, int] | None = None     # (url, scheme, host, port)
        self._remedy_for: dict | None = None       # the plan _remedy_text was made for
        self._remedy_text = b""
        self.gate = admission.Gate()
        self._limits_key: tuple | None = None      # (settings, plan numbers) the limits were made for
        self._limits: admission.Limits | None = None
        self.app = self._build_app()

    async def __call__(self, scope, receive, send) -> None:
        """The ASGI app served: /v1/* and vLLM's unversioned token routes go straight to the proxy, the rest to
        FastAPI."""
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or scope["path"] in TOKEN_ROUTES):
            await self.proxy(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def aclose(self) -> None:
        await self.pool.aclose()

    # -- API key

    def key_ok(self, authorization: str | None) -> bool:
        key = self.state.options.api_key
        if not key:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            token = ""
        # Constant time whatever the token's content.
        return hmac.compare_digest(token.strip().encode("utf-8", "replace"), key.encode("utf-8"))

    def authorized(self, request: Request) -> bool:
        return self.key_ok(request.headers.get("authorization"))

    def unauthorized(self) -> JSONResponse:
        self.metrics.rejected.labels("unauthorized").inc()
        return _error(401, _NEED_KEY, "invalid_request_error", headers={"WWW-Authenticate": "Bearer"})

    # -- admission limits (serve/admission.py)

    def limits(self) -> admission.Limits | None:
        """The limits for the plan being served (None before there is one); logged once per plan."""
        plan = self.state.plan or {}
        values = admission.settings_of(self.state.options)
        key = (tuple(values.values()), plan.get("max_num_seqs"), plan.get("max_model_len"),
               plan.get("data_parallel_size"))
        if key != self._limits_key:
            self._limits_key, self._limits = key, admission.limits_from_plan(values, plan)
            if self._limits is not None:
                log.info("admission limits %s",
                         json.dumps(self._limits.as_dict(), sort_keys=True, separators=(",", ":")))
        return self._limits

    async def _admit(self, limits: admission.Limits, route: str, body: bytes) -> admission.Admission:
        try:
            parsed = json.loads(body) if len(body) <= _PARSE_INLINE_BYTES else await asyncio.to_thread(json.loads, body)
        except (ValueError, RecursionError):
            return admission.Admission(body=body)          # not JSON: vLLM's own 400 says so
        return admission.admit(limits, route, body, parsed)

    async def _refuse(self, send, refusal: admission.Refusal) -> str:
        self.metrics.admission_refused.labels(refusal.reason).inc()
        await _send_json(send, refusal.status, refusal.body(), refusal.headers())
        return str(refusal.status)

    # -- FastAPI: health, metrics, plan (and the /v1 route, for the schema only)

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="turingbox sidecar", version="1", docs_url=None, redoc_url=None,
                      description="Health, metrics and the plan of a turingbox appliance; /v1/* is vLLM's "
                                  "OpenAI-compatible API, proxied.")
        st = self.state

        @app.get("/health/live", summary="Liveness: the process and vLLM are alive (200 while starting)",
                 response_model=Live, responses={503: {"model": Live, "description": "vLLM is gone"}})
        async def live() -> JSONResponse:
            if st.upstream_dead is not None:
                return JSONResponse({"status": "dead", "reason": st.upstream_dead}, status_code=503)
            return JSONResponse({"status": "alive", "stage": st.tracker.stage})

        @app.get("/health/ready", summary="Readiness: 200 only when requests will be served",
                 response_model=Ready, responses={503: {"model": NotReady, "description": "not ready: why"}})
        async def ready() -> JSONResponse:
            if st.is_ready():
                return JSONResponse({"status": "ready", "stage": stages.READY,
                                     "ready_after_s": round(st.tracker.ready_after_s or 0.0, 1)})
            return JSONResponse(st.not_ready_body(), status_code=503, headers={"Retry-After": st.retry_after()})

        @app.get("/health/startup", summary="Startup: 200 once startup succeeded",
                 response_model=Started, responses={503: {"model": NotReady, "description": "not started yet"}})
        async def startup() -> JSONResponse:
            if st.startup_ok:
                return JSONResponse({"status": "started", "ready_after_s": st.tracker.ready_after_s})
            return JSONResponse(st.not_ready_body(), status_code=503)

        @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
                 responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                                  "description": "Prometheus text format"}, **_UNAUTHORIZED})
        async def metrics(request: Request) -> Response:
            if st.options.metrics_require_key and not self.authorized(request):
                return self.unauthorized()
            # vLLM's own series too, fetched now from its loopback port (none before ready or once it died)
            upstream = st.upstream_url if st.upstream_dead is None else None
            page = await self.metrics.exposition(upstream, st.upstream_api_key)
            return Response(page, media_type=CONTENT_TYPE_LATEST)

        @app.get("/turingbox/plan", summary="The plan being served (secrets removed)",
                 responses={200: {"description": "the plan (see `turingbox plan --json`)", **_JSON_OBJECT},
                            503: {"model": NotReady, "description": "not planned yet"}, **_UNAUTHORIZED})
        async def plan(request: Request) -> JSONResponse:
            if not self.authorized(request):
                return self.unauthorized()
            if st.plan is None:
                return JSONResponse(st.not_ready_body(), status_code=503)
            return JSONResponse(st.plan)

        @app.get("/turingbox/limits", summary="The admission limits of /v1 (n, max_tokens, total tokens, "
                                              "concurrency, timeout) and which came from the plan",
                 responses={200: {"description": "the limits (serve/admission.py Limits)", **_JSON_OBJECT},
                            503: {"model": NotReady, "description": "not planned yet"}, **_UNAUTHORIZED})
        async def limits(request: Request) -> JSONResponse:
            if not self.authorized(request):
                return self.unauthorized()
            current = self.limits()
            if current is None:
                return JSONResponse(st.not_ready_body(), status_code=503)
            return JSONResponse({**current.as_dict(), "in_flight": self.gate.in_flight})

        # Never reached through __call__ (which proxies /v1/* before routing); declared so the schema
        # says what the public port offers.
        @app.api_route("/v1/{path:path}", methods=PROXY_METHODS, summary="OpenAI API of vLLM, proxied",
                       responses={200: {"description": "vLLM's answer, streamed through unchanged", **_JSON_OBJECT},
                                  400: {"description": "vLLM or the admission limits refused the request",
                                        **_JSON_OBJECT},
                                  404: {"description": "vLLM has no such route or model", **_JSON_OBJECT},
                                  405: {"description": "method not allowed (by the sidecar or vLLM)", **_JSON_OBJECT},
                                  408: {"model": ErrorBody, "description": "the body stalled past client_timeout_seconds"},
                                  413: {"model": ErrorBody, "description": "body over max_request_bytes"},
                                  429: {"model": ErrorBody, "description": "too many requests in flight "
                                                                           "(max_concurrent_requests / _per_key)"},
                                  502: {"model": ErrorBody, "description": "vLLM did not answer"},
                                  503: {"model": ErrorBody, "description": "not ready, or draining"},
                                  504: {"model": ErrorBody, "description": "ran past request_timeout_seconds"},
                                  **_UNAUTHORIZED})
        async def proxy(request: Request, path: str = Path(description="vLLM's route under /v1",
                                                            examples=["models", "chat/completions", "completions"])
                        ) -> Response:
            return _error(404, "The /v1 proxy is served by the sidecar's ASGI entry point.", "not_found")

        for route in TOKEN_ROUTES:     # vLLM serves these beside /v1 (its clients and the soak use /tokenize)
            app.add_api_route(route, proxy_token, methods=TOKEN_METHODS, summary=f"vLLM's {route}, proxied (as /v1)",
                              responses={200: {"description": "vLLM's answer", **_JSON_OBJECT},
                                         400: {"description": "vLLM refused the request", **_JSON_OBJECT},
                                         404: {"description": "vLLM has no such model", **_JSON_OBJECT},
                                         405: {"description": "method not allowed", **_JSON_OBJECT},
                                         408: {"model": ErrorBody, "description": "the body stalled past "
                                                                                  "client_timeout_seconds"},
                                         413: {"model": ErrorBody, "description": "body over max_request_bytes"},
                                         429: {"model": ErrorBody, "description": "too many requests in flight"},
                                         502: {"model": ErrorBody, "description": "vLLM did not answer"},
                                         503: {"model": ErrorBody, "description": "not ready, or draining"},
                                         504: {"model": ErrorBody, "description": "ran past request_timeout_seconds"},
                                         **_UNAUTHORIZED})

        app.openapi = lambda: self._openapi(app)
        return app

    def _openapi(self, app: FastAPI) -> dict:
        """FastAPI's schema plus the bearer key where the sidecar asks for it."""
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "the API key (setting api_key); "
                           "when none is set, no key is needed"}}
            for path, ops in schema["paths"].items():
                if path.startswith(("/v1/", "/turingbox/")) or path in TOKEN_ROUTES or path == "/metrics":
                    for op in ops.values():
                        op["security"] = [{"bearer": []}, {}] if path == "/metrics" else [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    # -- the /v1 proxy (plain ASGI: it runs on every token of every stream)

    def _upstream_target(self) -> tuple[bytes, bytes, int]:
        url = self.state.upstream_url or ""
        if self._upstream is None or self._upstream[0] != url:
            scheme, _, rest = url.partition("://")
            host, _, port = rest.rstrip("/").rpartition(":")
            self._upstream = (url, scheme.encode(), host.encode(), int(port))
        return self._upstream[1:]

    async def proxy(self, scope, receive, send) -> None:
        t0 = time.perf_counter()
        st, m = self.state, self.metrics
        route = route_label(scope["path"])
        authorization = None
        for k, v in scope["headers"]:
            if k == b"authorization":          # the first one, as Starlette's headers.get reads it
                authorization = v.decode("latin-1")
                break
        allowed = TOKEN_METHODS if scope["path"] in TOKEN_ROUTES else PROXY_METHODS
        if scope["method"] not in allowed:      # TRACE, CONNECT, ... (GET on the token routes): never forwarded
            m.requests.labels(route, "405").inc()
            await _send_json(send, 405, _error_body(405, f"Method {scope['method']} is not allowed here.",
                                                    "invalid_request_error"), {"Allow": ", ".join(allowed)})
            return
        if not self.key_ok(authorization):
            m.requests.labels(route, "401").inc()
            m.rejected.labels("unauthorized").inc()
            await _send_json(send, 401, _error_body(401, _NEED_KEY, "invalid_request_error"),
                             {"WWW-Authenticate": "Bearer"})
            return
        if not st.is_ready() or st.upstream_url is None:
            reason = "draining" if st.draining else "not_ready"
            m.rejected.labels(reason).inc()
            m.requests.labels(route, "503").inc()
            body = st.not_ready_body()
            await _send_json(send, 503, _error_body(503, body.get("reason") or "The server is not ready.",
                                                    "service_unavailable", stage=body["stage"],
                                                    estimate_s=body.get("estimate_s")),
                             {"Retry-After": st.retry_after()})
            return
        limits = self.limits() if scope["method"] == "POST" else None     # GETs (models) cost vLLM nothing
        key = None
        if limits is not None:
            key = admission.client_key(authorization if st.options.api_key else None, scope.get("client"))
            refusal = self.gate.enter(limits, key)
            if refusal is not None:
                m.requests.labels(route, "429").inc()
                await self._refuse(send, refusal)
                return
        # Accepted: from here on the request counts for the drain.
        st.request_started()
        m.in_flight.inc()
        code = "000"
        try:
            code = await self._forward(scope, receive, send, route, t0, limits)
        finally:
            took = time.perf_counter() - t0
            if key is not None:
                self.gate.leave(key, took if code not in ("400", "408", "413", "499") else None)
            st.request_finished()
            m.in_flight.dec()
            m.requests.labels(route, code).inc()
            m.latency.labels(route).observe(took)

    async def _read_body(self, scope, receive) -> bytes | int | None:
        """The request body; the limit (int) when it is too large, -1 when the client stalled; None when it left."""
        limit = self.state.options.max_request_bytes
        for k, v in scope["headers"]:
            if k == b"content-length" and (not v.isdigit() or int(v) > limit):
                return limit
        body = bytearray()
        timeout = self.state.options.client_timeout_seconds
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except asyncio.TimeoutError:
                return -1
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                return limit
            if not message.get("more_body", False):
                return bytes(body)

    async def _forward(self, scope, receive, send, route: str, t0: float,
                       limits: admission.Limits | None = None) -> str:
        st, m = self.state, self.metrics
        body = await self._read_body(scope, receive)
        if body is None:
            m.client_disconnects.inc()
            return "499"
        if body == -1:
            m.rejected.labels("client_timeout").inc()
            await _send_json(send, 408, _error_body(408, "The request body stalled for longer than "
                                                         f"{st.options.client_timeout_seconds:g} s (setting "
                                                         "client_timeout_seconds).", "invalid_request_error"),
                             {"Connection": "close"})
            return "408"
        if isinstance(body, int):
            m.rejected.labels("too_large").inc()
            await _send_json(send, 413, _error_body(413, f"The request body is larger than the limit of {body} "
                                                         "bytes (setting max_request_bytes).", "invalid_request_error"))
            return "413"
        deadline = None
        if limits is not None:
            if route in admission.ROUTES:
                admitted = await self._admit(limits, route, body)
                if admitted.refusal is not None:
                    return await self._refuse(send, admitted.refusal)
                body = admitted.body
            if limits.request_timeout_seconds > 0:
                deadline = t0 + limits.request_timeout_seconds
        scheme, host, port = self._upstream_target()
        headers = [(b"host", b"%s:%d" % (host, port))]
        for k, v in scope["headers"]:
            if k in _DROP_REQUEST_B or (k == b"authorization" and st.options.api_key):
                continue      # the sidecar checked the client's key; vLLM gets its own (if it has one)
            headers.append((k, v))
        if st.options.api_key and st.upstream_api_key:
            headers.append((b"authorization", b"Bearer " + st.upstream_api_key.encode("latin-1")))
        if body or scope["method"] in ("POST", "PUT", "PATCH"):
            headers.append((b"content-length", str(len(body)).encode()))
        target = scope.get("raw_path") or scope["path"].encode("latin-1")
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        request = httpcore.Request(scope["method"].encode(), httpcore.URL(scheme=scheme, host=host, port=port,
                                                                            target=target),
                                   headers=headers, content=body, extensions=_UPSTREAM_TIMEOUTS)
        return await self._exchange(request, scope, receive, send, route, t0, limits if deadline else None, deadline)

    async def _send(self, request: httpcore.Request, fresh: list) -> httpcore.Response:
        """The pool's answer; once more on a new connection of its own when a pooled one was dead.

        vLLM's uvicorn closes a connection a few ms after answering an error raised in its app, and
        after 5 s idle, without `Connection: close`: a request written into such a connection gets
        nothing back. The retry's connection is not pooled (`fresh` holds it; closed after use).
        """
        try:
            return await self.pool.handle_async_request(request)
        except _RETRY_ERRORS as exc:
            self.metrics.upstream_errors.labels("retried").inc()
            log.info("vLLM closed a pooled connection before answering (%s): retrying on a new one",
                     type(exc).__name__)
        url = request.url
        conn = httpcore.AsyncHTTPConnection(origin=httpcore.Origin(url.scheme, url.host, url.port))
        fresh.append(conn)
        return await conn.handle_async_request(request)

    async def _retire_connection(self, upstream: httpcore.Response) -> None:
        """Close the connection an error answer came on, so the pool never hands it out again.

        Its socket closed, the pool sees the idle connection as expired (readable) and drops it.
        """
        stream = upstream.extensions.get("network_stream")
        if stream is not None:
            with contextlib.suppress(*UPSTREAM_ERRORS):
                await stream.aclose()

    def _remedy(self) -> bytes:
        plan = self.state.plan
        if self._remedy_for is not plan:           # the plan is set once per start
            self._remedy_for, self._remedy_text = plan, spec_remedy(plan)
        return self._remedy_text

    async def _error_answer(self, upstream: httpcore.Response, headers: list, remedy: bytes) -> tuple[list, bytes]:
        """A small 400 read whole; vLLM's spec-decode refusal gets the remedy added."""
        body = b""
        async for chunk in upstream.aiter_stream():
            body += chunk
        fixed = add_remedy(body, remedy)
        if len(fixed) != len(body):
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(fixed)).encode()))
        return headers, fixed

    async def _exchange(self, request: httpcore.Request, scope, receive, send, route: str, t0: float,
                        limits: admission.Limits | None = None, deadline: float | None = None) -> str:
        """Send to vLLM and stream its answer back; watches for the client going away meanwhile, and for the
        deadline (request_timeout_seconds): past it the upstream exchange is dropped like a client's, so vLLM
        aborts the request, and the client gets 504 (or, mid-stream, an error event)."""
        sc_state, m = self.state, self.metrics

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.perf_counter())
        upstream: httpcore.Response | None = None
        fresh: list = []          # a retry's own connection, closed at the end
        disconnected = asyncio.create_task(_wait_for_disconnect(receive))
        try:
            m.overhead.labels(route).observe(time.perf_counter() - t0)
            sending = asyncio.create_task(self._send(request, fresh))
            await asyncio.wait({sending, disconnected}, timeout=left(), return_when=asyncio.FIRST_COMPLETED)
            if not sending.done():                 # client left (or time ran out) before vLLM even answered
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
                if limits is not None and not disconnected.done():
                    return await self._refuse(send, admission.timeout_refusal(limits))
                m.client_disconnects.inc()
                return "499"
            try:
                upstream = sending.result()
            except UPSTREAM_ERRORS as exc:
                m.upstream_errors.labels("connect" if isinstance(exc, _CONNECT_ERRORS) else "protocol").inc()
                reason = sc_state.upstream_dead or f"the model server did not answer ({type(exc).__name__})."
                await _send_json(send, 502, _error_body(502, reason, "upstream_error"))
                return "502"
            headers = [(k, v) for k, v in upstream.headers if k.lower() not in _DROP_RESPONSE_B]
            content_type = next((v for k, v in upstream.headers if k.lower() == b"content-type"), b"")
            is_sse = content_type.startswith(b"text/event-stream")
            remedy = self._remedy()
            # (An error answer's connection is retired in `finally`.)
            if upstream.status == 400 and remedy and not is_sse and (_content_length(headers) or _MAX_ERROR_BODY + 1) \
                    <= _MAX_ERROR_BODY:
                reading = asyncio.create_task(self._error_answer(upstream, headers, remedy))
                await asyncio.wait({reading, disconnected}, timeout=left(), return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    await asyncio.gather(reading, return_exceptions=True)
                    if limits is not None and not disconnected.done():
                        return await self._refuse(send, admission.timeout_refusal(limits))
                    m.client_disconnects.inc()
                    return "499"
                try:
                    headers, body = reading.result()
                except UPSTREAM_ERRORS as exc:
                    m.upstream_errors.labels("broken_stream").inc()
                    await _send_json(send, 502, _error_body(502, f"the model server broke off its error answer "
                                                                 f"({type(exc).__name__}).", "upstream_error"))
                    return "502"
                m.first_byte.labels(route).observe(time.perf_counter() - t0)
                await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return str(upstream.status)
            if is_sse:
                headers.append((b"x-accel-buffering", b"no"))
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            pump = asyncio.create_task(self._pump(upstream, send, is_sse, route, t0, remedy if is_sse else b""))
            await asyncio.wait({pump, disconnected}, timeout=left(), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():                    # client went away (or time ran out) mid-response: stop vLLM's work
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                if limits is not None and not disconnected.done():
                    refusal = admission.timeout_refusal(limits)
                    m.admission_refused.labels(refusal.reason).inc()
                    if is_sse:                     # the status is sent: say why in the stream, then end it
                        await send({"type": "http.response.body", "more_body": False,
                                    "body": sse_event(refusal.body())})
                    # (not SSE: the length cannot be completed; returning unfinished drops the connection)
                    return str(refusal.status)
                m.client_disconnects.inc()
                return "499"
            pump.result()
            return str(upstream.status)
        finally:
            disconnected.cancel()
            if upstream is not None:
                if upstream.status >= 400:
                    # vLLM drops the connection of an error answer a few ms later: never reuse it.
                    await self._retire_connection(upstream)
                # Closing a response that was not read to the end closes its connection: vLLM sees
                # the disconnect and aborts the generation.
                with contextlib.suppress(*UPSTREAM_ERRORS):
                    await upstream.aclose()
            for conn in fresh:
                with contextlib.suppress(*UPSTREAM_ERRORS):
                    await conn.aclose()

    async def _pump(self, upstream: httpcore.Response, send, is_sse: bool, route: str, t0: float,
                    remedy: bytes = b"") -> None:
        m = self.metrics
        first = True
        try:
            async for chunk in upstream.aiter_stream():
                if first:
                    m.first_byte.labels(route).observe(time.perf_counter() - t0)
                    first = False
                    chunk = add_remedy(chunk, remedy)     # vLLM refuses a stream in its first event
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_ERRORS as exc:
            m.upstream_errors.labels("broken_stream").inc()
            log.warning("vLLM broke off a %s response: %s", route, type(exc).__name__)
            if not is_sse:
                return    # the length/framing cannot be completed: let the server drop the connection
            # A broken stream usually means vLLM died: give the supervisor a moment to learn how, so
            # the client's error (and liveness, from now on) says why.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.state.dead.wait(), timeout=1.0)
            why = self.state.upstream_dead or "The model server stopped before this response was complete."
            await send({"type": "http.response.body", "more_body": True, "body": sse_error_event(why)})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
