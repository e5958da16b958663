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
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from turingbox.serve import stages
from turingbox.serve.metrics import ServeMetrics, route_label
from turingbox.serve.options import ServeOptions

log = logging.getLogger("turingbox.serve")

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "trailers", "transfer-encoding", "upgrade", "proxy-connection"}
_DROP_REQUEST = _HOP_BY_HOP | {"host", "content-length", "expect"}
_DROP_RESPONSE = _HOP_BY_HOP | {"date", "server"}
PROXY_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
DRAINING_RETRY_AFTER_S = 5


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


def _error(status: int, message: str, kind: str, headers: dict | None = None, **extra: Any) -> JSONResponse:
    """An OpenAI-shaped error body, so OpenAI clients show the message."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status, **extra}},
                        status_code=status, headers=headers)


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The error event vLLM itself sends when a stream fails, followed by [DONE]."""
    payload = {"error": {"message": message, "type": "upstream_error", "param": None, "code": status}}
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"


class UpstreamResponse(Response):
    """Streams one upstream exchange to the client; watches for the client going away meanwhile."""

    def __init__(self, sidecar: "Sidecar", upstream_request: httpx.Request, route: str, t0: float) -> None:
        super().__init__()
        self.sidecar = sidecar
        self.upstream_request = upstream_request
        self.route = route
        self.t0 = t0

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        sc, m = self.sidecar, self.sidecar.metrics
        code = "000"
        upstream: httpx.Response | None = None
        disconnected = asyncio.create_task(_wait_for_disconnect(receive))
        pump: asyncio.Task | None = None
        try:
            m.overhead.labels(self.route).observe(time.perf_counter() - self.t0)
            sending = asyncio.create_task(sc.client.send(self.upstream_request, stream=True))
            await asyncio.wait({sending, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done():                 # client left before vLLM even answered
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
                code = "499"
                m.client_disconnects.inc()
                return
            try:
                upstream = sending.result()
            except httpx.HTTPError as exc:
                kind = "connect" if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) else "protocol"
                m.upstream_errors.labels(kind).inc()
                reason = sc.state.upstream_dead or f"the model server did not answer ({type(exc).__name__})."
                resp = _error(502, reason, "upstream_error")
                code = "502"
                await resp(scope, receive, send)
                return
            code = str(upstream.status_code)
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in upstream.headers.multi_items()
                       if k.lower() not in _DROP_RESPONSE]
            is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
            if is_sse:
                headers.append((b"x-accel-buffering", b"no"))
            await send({"type": "http.response.start", "status": upstream.status_code, "headers": headers})
            pump = asyncio.create_task(self._pump(upstream, send, is_sse))
            await asyncio.wait({pump, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():                    # client went away mid-response: stop vLLM's work
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                code = "499"
                m.client_disconnects.inc()
            else:
                pump.result()
        finally:
            disconnected.cancel()
            if upstream is not None:
                # Closing a response that was not read to the end closes its connection: vLLM sees
                # the disconnect and aborts the generation.
                await upstream.aclose()
            sc.state.request_finished()
            m.in_flight.dec()
            m.requests.labels(self.route, code).inc()
            m.latency.labels(self.route).observe(time.perf_counter() - self.t0)

    async def _pump(self, upstream: httpx.Response, send, is_sse: bool) -> None:
        m = self.sidecar.metrics
        first = True
        try:
            async for chunk in upstream.aiter_raw():
                if first:
                    m.first_byte.labels(self.route).observe(time.perf_counter() - self.t0)
                    first = False
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            m.upstream_errors.labels("broken_stream").inc()
            log.warning("vLLM broke off a %s response: %s", self.route, type(exc).__name__)
            if not is_sse:
                return    # the length/framing cannot be completed: let the server drop the connection
            # A broken stream usually means vLLM died: give the supervisor a moment to learn how, so
            # the client's error (and liveness, from now on) says why.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.sidecar.state.dead.wait(), timeout=1.0)
            why = self.sidecar.state.upstream_dead or "The model server stopped before this response was complete."
            await send({"type": "http.response.body", "more_body": True, "body": sse_error_event(why)})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Sidecar:
    def __init__(self, state: ServeState, metrics: ServeMetrics) -> None:
        self.state = state
        self.metrics = metrics
        # No read timeout: a long prefill may take minutes before the first byte.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            headers={}, follow_redirects=False, trust_env=False)
        self.app = self._build_app()

    def authorized(self, request: Request) -> bool:
        key = self.state.options.api_key
        if not key:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = ""
        # Constant time whatever the token's content.
        return hmac.compare_digest(token.strip().encode("utf-8", "replace"), key.encode("utf-8"))

    def unauthorized(self) -> JSONResponse:
        self.metrics.rejected.labels("unauthorized").inc()
        return _error(401, "A valid API key is required: send 'Authorization: Bearer <key>'.",
                      "invalid_request_error", headers={"WWW-Authenticate": "Bearer"})

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="turingbox sidecar", version="1", docs_url=None, redoc_url=None)
        st = self.state

        @app.get("/health/live", summary="Liveness: the process and vLLM are alive (200 while starting)")
        async def live() -> JSONResponse:
            if st.upstream_dead is not None:
                return JSONResponse({"status": "dead", "reason": st.upstream_dead}, status_code=503)
            return JSONResponse({"status": "alive", "stage": st.tracker.stage})

        @app.get("/health/ready", summary="Readiness: 200 only when requests will be served")
        async def ready() -> JSONResponse:
            if st.is_ready():
                return JSONResponse({"status": "ready", "stage": stages.READY,
                                     "ready_after_s": round(st.tracker.ready_after_s or 0.0, 1)})
            return JSONResponse(st.not_ready_body(), status_code=503, headers={"Retry-After": st.retry_after()})

        @app.get("/health/startup", summary="Startup: 200 once startup succeeded")
        async def startup() -> JSONResponse:
            if st.startup_ok:
                return JSONResponse({"status": "started", "ready_after_s": st.tracker.ready_after_s})
            return JSONResponse(st.not_ready_body(), status_code=503)

        @app.get("/metrics", summary="Prometheus metrics")
        async def metrics(request: Request) -> Response:
            if st.options.metrics_require_key and not self.authorized(request):
                return self.unauthorized()
            return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/turingbox/plan", summary="The plan being served (secrets removed)")
        async def plan(request: Request) -> JSONResponse:
            if not self.authorized(request):
                return self.unauthorized()
            if st.plan is None:
                return JSONResponse(st.not_ready_body(), status_code=503)
            return JSONResponse(st.plan)

        @app.api_route("/v1/{path:path}", methods=PROXY_METHODS, summary="OpenAI API of vLLM, proxied")
        async def proxy(path: str, request: Request) -> Response:
            return await self.proxy(request)

        return app

    async def proxy(self, request: Request) -> Response:
        t0 = time.perf_counter()
        st, m = self.state, self.metrics
        route = route_label(request.url.path)
        if not self.authorized(request):
            m.requests.labels(route, "401").inc()
            return self.unauthorized()
        if not st.is_ready() or st.upstream_url is None:
            reason = "draining" if st.draining else "not_ready"
            m.rejected.labels(reason).inc()
            m.requests.labels(route, "503").inc()
            body = st.not_ready_body()
            return _error(503, body.get("reason") or "The server is not ready.", "service_unavailable",
                          headers={"Retry-After": st.retry_after()}, stage=body["stage"],
                          estimate_s=body.get("estimate_s"))
        # Accepted: from here on the request counts for the drain.
        st.request_started()
        m.in_flight.inc()
        handed_over = False
        try:
            limit = st.options.max_request_bytes
            declared = request.headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > limit):
                return self._too_large(route, limit)
            body = bytearray()
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    return self._too_large(route, limit)
            headers = [(k, v) for k, v in request.headers.items() if k not in _DROP_REQUEST]
            if st.options.api_key:
                # The sidecar checked the client's key; vLLM gets its own (if it has one).
                headers = [(k, v) for k, v in headers if k != "authorization"]
                if st.upstream_api_key:
                    headers.append(("authorization", f"Bearer {st.upstream_api_key}"))
            url = st.upstream_url + request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
            query = request.scope.get("query_string", b"")
            if query:
                url += "?" + query.decode("latin-1")
            upstream_request = self.client.build_request(request.method, url, headers=headers,
                                                         content=bytes(body))
            handed_over = True
            return UpstreamResponse(self, upstream_request, route, t0)
        finally:
            if not handed_over:
                st.request_finished()
                m.in_flight.dec()

    def _too_large(self, route: str, limit: int) -> JSONResponse:
        self.metrics.rejected.labels("too_large").inc()
        self.metrics.requests.labels(route, "413").inc()
        return _error(413, f"The request body is larger than the limit of {limit} bytes "
                           "(setting max_request_bytes).", "invalid_request_error")
