"""The sidecar on the public port: the ASGI entry point, and its FastAPI app (health, metrics, the plan, the
admission limits, the API key, the OpenAPI schema). /v1/* and vLLM's token routes go to the proxy (proxy.py)."""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from prometheus_client import CONTENT_TYPE_LATEST

from turingbox.serve import stages
from turingbox.serve.auth import NEED_KEY, key_ok
from turingbox.serve.errors import error_response
from turingbox.serve.metrics import ServeMetrics
from turingbox.serve.proxy import PROXY_METHODS, TOKEN_METHODS, TOKEN_ROUTES, Proxy
from turingbox.serve.state import ServeState


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
    return error_response(404, "The token routes are proxied by the sidecar's ASGI entry point.", "not_found")



class Sidecar:
    """The ASGI app served on the public port."""

    def __init__(self, state: ServeState, metrics: ServeMetrics) -> None:
        self.state = state
        self.metrics = metrics
        self.proxy = Proxy(state, metrics)
        self.app = self._build_app()

    async def __call__(self, scope, receive, send) -> None:
        """The ASGI app served: /v1/* and vLLM's unversioned token routes go straight to the proxy, the rest to
        FastAPI."""
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or scope["path"] in TOKEN_ROUTES):
            await self.proxy(scope, receive, send)
        else:
            await self.app(scope, receive, send)


    async def aclose(self) -> None:
        await self.proxy.aclose()

    # -- API key (auth.py)

    def authorized(self, request: Request) -> bool:
        return key_ok(self.state.options.api_key, request.headers.get("authorization"))

    def unauthorized(self) -> JSONResponse:
        self.metrics.rejected.labels("unauthorized").inc()
        return error_response(401, NEED_KEY, "invalid_request_error", headers={"WWW-Authenticate": "Bearer"})

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
            current = self.proxy.limits()
            if current is None:
                return JSONResponse(st.not_ready_body(), status_code=503)
            return JSONResponse({**current.as_dict(), "in_flight": self.proxy.gate.in_flight})

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
            return error_response(404, "The /v1 proxy is served by the sidecar's ASGI entry point.", "not_found")

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
