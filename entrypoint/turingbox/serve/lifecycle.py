"""The serve process around the controller: its log format, its SIGTERM/SIGINT handlers, and the sidecar's HTTP
server (uvicorn without signal handlers of its own, with the request head's limits, keep-alive longer than
clients keep theirs). What a signal does (the drain) is the controller's."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any, Callable

import uvicorn

from turingbox.serve.http_limits import limited_protocol
from turingbox.serve.options import ServeOptions

KEEPALIVE_S = 65


def configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    # httpx2: huggingface_hub's client (downloads of a hub model) logs every request at INFO
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def handle_stop_signals(on_signal: Callable[[int], None]) -> None:
    """SIGTERM and SIGINT call on_signal(signal number) on the running loop, every time they come."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


def exit_now(code: int) -> None:
    """End the process at once (a second signal): the log and the output flushed, nothing else waited for."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def http_protocol(options: ServeOptions):
    """httptools with the head limit and deadline (see http_limits.limited_protocol); h11 (whose own
    h11_max_incomplete_event_size bounds the head) where httptools is missing."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return limited_protocol(options.max_header_bytes, options.client_timeout_seconds)


class SidecarServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the controller owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def sidecar_server(app: Any, options: ServeOptions) -> SidecarServer:
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning",
                            # Idle client connections are kept longer than clients keep them in their
                            # pools (httpx 5 s, aiohttp 15 s, load balancers 60 s): the client retires
                            # a connection first, never writes a request into one the sidecar is closing.
                            access_log=False, timeout_keep_alive=KEEPALIVE_S, timeout_graceful_shutdown=3,
                            server_header=False, http=http_protocol(options),
                            h11_max_incomplete_event_size=options.max_header_bytes)
    return SidecarServer(config)
