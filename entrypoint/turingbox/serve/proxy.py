"""The streaming proxy to vLLM: /v1/* and vLLM's token routes (/tokenize, /detokenize), plain ASGI on httpcore.

It passes vLLM's response through chunk by chunk as it arrives (no re-chunking, each chunk written at once),
cancels the upstream request when the client goes away, refuses new requests before ready and while draining
(503 + Retry-After), applies the admission limits (serve/admission.py), and ends a stream that vLLM broke off with
a clean SSE error event.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import httpcore

from turingbox.serve import admission
from turingbox.serve.auth import NEED_KEY, key_ok
from turingbox.serve.errors import add_remedy, error_body, send_json, spec_remedy, sse_error_event, sse_event
from turingbox.serve.metrics import ServeMetrics, route_label
from turingbox.serve.state import ServeState

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
# What the upstream pool raises when vLLM cannot be reached or breaks an exchange off.
UPSTREAM_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.TimeoutException, OSError)
_CONNECT_ERRORS = (httpcore.ConnectError, httpcore.ConnectTimeout, ConnectionRefusedError)
# Raised before any byte of a response arrived, mostly on a pooled connection that the server had closed
# (or was closing) under us, when the request never reached vLLM's app. Sending it once more is safe even
# when it did reach the app: uvicorn cancels a handler whose connection is gone, so vLLM aborts that
# request, and a generation has no other side effect.
_RETRY_ERRORS = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError, ConnectionResetError,
                 BrokenPipeError)
_MAX_ERROR_BODY = 64 * 1024          # error bodies rewritten whole; larger ones (echoed input) pass as they are
_PARSE_INLINE_BYTES = 256 * 1024     # larger bodies are parsed in a thread: a 32 MiB json.loads takes the loop ~0.3 s
# vLLM's uvicorn closes idle keep-alive connections after 5 s: retire ours before that, so a request
# is never written into a connection the server is closing at the same moment.
UPSTREAM_KEEPALIVE_S = 4.0
_UPSTREAM_TIMEOUTS = {"timeout": {"connect": 10.0, "read": None, "write": None, "pool": None}}


def _content_length(headers: list) -> int | None:
    for k, v in headers:
        if k.lower() == b"content-length":
            return int(v) if v.isdigit() else None
    return None


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Proxy:
    """The ASGI app of the proxied routes: one upstream connection pool and one admission gate per serve."""

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

    async def aclose(self) -> None:
        await self.pool.aclose()

    # -- admission limits (serve/admission.py)

    def limits(self) -> admission.Limits | None:
        """The limits for the plan being served (None before there is one); logged once per plan."""
        plan = self.state.plan or {}
        values = admission.settings_of(self.state.options)
        key = (tuple(values.values()), plan.get("max_num_seqs"), plan.get("max_model_len"),
               plan.get("data_parallel_size"), plan.get("num_speculative_tokens"),
               tuple(plan.get("mtp_refused_parameters") or ()))
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
        await send_json(send, refusal.status, refusal.body(), refusal.headers())
        return str(refusal.status)

    # -- plain ASGI: it runs on every token of every stream

    def _upstream_target(self) -> tuple[bytes, bytes, int]:
        url = self.state.upstream_url or ""
        if self._upstream is None or self._upstream[0] != url:
            scheme, _, rest = url.partition("://")
            host, _, port = rest.rstrip("/").rpartition(":")
            self._upstream = (url, scheme.encode(), host.encode(), int(port))
        return self._upstream[1:]

    async def __call__(self, scope, receive, send) -> None:
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
            await send_json(send, 405, error_body(405, f"Method {scope['method']} is not allowed here.",
                                                  "invalid_request_error"), {"Allow": ", ".join(allowed)})
            return
        if not key_ok(st.options.api_key, authorization):
            m.requests.labels(route, "401").inc()
            m.rejected.labels("unauthorized").inc()
            await send_json(send, 401, error_body(401, NEED_KEY, "invalid_request_error"),
                            {"WWW-Authenticate": "Bearer"})
            return
        if not st.is_ready() or st.upstream_url is None:
            reason = "draining" if st.draining else "not_ready"
            m.rejected.labels(reason).inc()
            m.requests.labels(route, "503").inc()
            body = st.not_ready_body()
            await send_json(send, 503, error_body(503, body.get("reason") or "The server is not ready.",
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
            await send_json(send, 408, error_body(408, "The request body stalled for longer than "
                                                       f"{st.options.client_timeout_seconds:g} s (setting "
                                                       "client_timeout_seconds).", "invalid_request_error"),
                            {"Connection": "close"})
            return "408"
        if isinstance(body, int):
            m.rejected.labels("too_large").inc()
            await send_json(send, 413, error_body(413, f"The request body is larger than the limit of {body} "
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
            # client left (or time ran out) before vLLM even answered
            if (left_early := await self._unless_left(sending, disconnected, left(), limits, send)) is not None:
                return left_early
            try:
                upstream = sending.result()
            except UPSTREAM_ERRORS as exc:
                m.upstream_errors.labels("connect" if isinstance(exc, _CONNECT_ERRORS) else "protocol").inc()
                reason = sc_state.upstream_dead or f"the model server did not answer ({type(exc).__name__})."
                await send_json(send, 502, error_body(502, reason, "upstream_error"))
                return "502"
            headers = [(k, v) for k, v in upstream.headers if k.lower() not in _DROP_RESPONSE_B]
            content_type = next((v for k, v in upstream.headers if k.lower() == b"content-type"), b"")
            is_sse = content_type.startswith(b"text/event-stream")
            remedy = self._remedy()
            # (An error answer's connection is retired in `finally`.)
            if upstream.status == 400 and remedy and not is_sse and (_content_length(headers) or _MAX_ERROR_BODY + 1) \
                    <= _MAX_ERROR_BODY:
                reading = asyncio.create_task(self._error_answer(upstream, headers, remedy))
                if (left_early := await self._unless_left(reading, disconnected, left(), limits, send)) is not None:
                    return left_early
                try:
                    headers, body = reading.result()
                except UPSTREAM_ERRORS as exc:
                    m.upstream_errors.labels("broken_stream").inc()
                    await send_json(send, 502, error_body(502, f"the model server broke off its error answer "
                                                               f"({type(exc).__name__}).", "upstream_error"))
                    return "502"
                m.first_byte.labels(route).observe(time.perf_counter() - t0)
                await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return str(upstream.status)
            chunks = upstream.aiter_stream().__aiter__()
            head, broken = b"", None
            if is_sse and upstream.status == 200:
                # vLLM checks a stream's parameters inside its generator: a refused stream is a 200 whose first
                # event is the error. Read up to that event before answering, so a refusal is the 4xx it is.
                # (vLLM sends its first event only with the first token anyway: the client waits no longer.)
                peeking = asyncio.create_task(_first_event(chunks))
                if (left_early := await self._unless_left(peeking, disconnected, left(), limits, send)) is not None:
                    return left_early
                try:
                    head = peeking.result()
                except UPSTREAM_ERRORS as exc:     # broken before its first event: the pump says why, as before
                    broken = exc
                refused = _stream_refusal(head)
                if refused is not None:
                    status, body = refused
                    m.first_byte.labels(route).observe(time.perf_counter() - t0)
                    m.stream_refusals.inc()
                    data = add_remedy(body, remedy)
                    await send({"type": "http.response.start", "status": status, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
                    await send({"type": "http.response.body", "body": data, "more_body": False})
                    return str(status)
            if is_sse:
                headers.append((b"x-accel-buffering", b"no"))
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            pump = asyncio.create_task(self._pump(chunks, head, broken, send, is_sse, route, t0,
                                                  remedy if is_sse else b""))
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

    async def _unless_left(self, task: asyncio.Task, disconnected: asyncio.Task, timeout: float | None,
                           limits: admission.Limits | None, send) -> str | None:
        """Waits for `task` until the client leaves or the request's time runs out: None when the task finished
        first; else the task is cancelled and the outcome answered (504 past the deadline, 499 for a client gone)."""
        await asyncio.wait({task, disconnected}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if limits is not None and not disconnected.done():
            return await self._refuse(send, admission.timeout_refusal(limits))
        self.metrics.client_disconnects.inc()
        return "499"

    async def _pump(self, chunks, head: bytes, broken: BaseException | None, send, is_sse: bool, route: str,
                    t0: float, remedy: bytes = b"") -> None:
        """vLLM's answer on to the client: `head` (a stream's first event, read already), then the rest of
        `chunks`; `broken`: the stream broke off while its first event was read."""
        m = self.metrics
        try:
            if broken is not None:
                raise broken
            first = True
            async for chunk in _chain(head, chunks):
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


async def _chain(head: bytes, chunks):
    if head:
        yield head
    async for chunk in chunks:
        yield chunk


async def _first_event(chunks) -> bytes:
    """A stream's bytes up to the end of its first SSE event (or of the stream, or _MAX_ERROR_BODY)."""
    head = b""
    while b"\n\n" not in head and len(head) <= _MAX_ERROR_BODY:
        try:
            head += await chunks.__anext__()
        except StopAsyncIteration:
            break
    return head


def _stream_refusal(head: bytes) -> tuple[int, bytes] | None:
    """(status, JSON body) when a stream's first event is vLLM's error for the request (a 4xx code), as
    vLLM's create_streaming_error_response writes it: `data: {"error": {"message", "type", "param", "code"}}`."""
    first = head.split(b"\n\n", 1)[0]
    if not first.startswith(b"data: {"):
        return None
    try:
        obj = json.loads(first[len(b"data: "):])
    except ValueError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or not 400 <= code < 500 or len(obj) != 1:
        return None
    return code, json.dumps({"error": err}, separators=(",", ":")).encode()
