"""The request head's limits on the public port: a size (431) and a deadline to send it (408), which uvicorn's
httptools protocol lacks."""
from __future__ import annotations

import json

from turingbox.serve.errors import error_body


def _plain_response(status: int, reason: bytes, message: str) -> bytes:
    body = json.dumps(error_body(status, message, "invalid_request_error")).encode()
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
