"""uvicorn's httptools protocol with the limits it lacks on a request's head.

httptools accepts any number and size of headers and waits for them without a deadline: 1 MB
headers and 10,000 headers were accepted, and 20,100 idle half-sent heads held their
connections until the descriptor limit. This protocol answers 431 (header fields too large)
past ``server.max_headers`` headers or ``server.max_header_bytes`` bytes of them, and 408 when
a request's head is not complete ``server.header_timeout_seconds`` after the connection opened
or the request's first byte arrived; both close the connection. The body has its own timeout
(``guard``), idle keep-alive connections uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from retrieval.errors import RetrievalError
from retrieval.service.errors import HeaderTooLargeError, RequestTimeoutError, error_body
from retrieval.service.settings import ServerSettings

LINGER_SECONDS = 2.0


def guarded_protocol(server: ServerSettings) -> type[asyncio.Protocol]:
    """The protocol class uvicorn runs (``http=``), with ``server``'s limits."""

    class Guarded(HeadLimits):
        max_headers = server.max_headers
        max_header_bytes = server.max_header_bytes
        header_timeout = server.header_timeout_seconds

    return Guarded


class HeadLimits(HttpToolsProtocol):
    max_headers = 100
    max_header_bytes = 16_384
    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:  # the next request of a kept-alive connection
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value)
        if len(self.headers) >= self.max_headers or self._head_bytes > self.max_header_bytes:
            self._refuse(431, HeaderTooLargeError(
                f"the request head exceeds {self.max_headers} headers or "
                f"{self.max_header_bytes} bytes (server.max_headers, server.max_header_bytes); "
                "send fewer or shorter headers"))
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request being answered
            self._refuse(408, RequestTimeoutError(
                f"the request head did not arrive within {self.header_timeout:g} s "
                "(server.header_timeout_seconds); send it whole"))

    def _refuse(self, status: int, error: RetrievalError) -> None:
        """Answer ``status`` with the service's error body and close the connection."""
        self._refused = True
        self._stop_head_timer()
        body = json.dumps(error_body(error)).encode()
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        self.transport.write(b"".join([
            b"HTTP/1.1 %d %s\r\n" % (status, reason), b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        # A lingering close: the answer and a FIN now, what the client still sends is read and
        # dropped for a moment (closing with unread data would reset the connection, and the
        # client would lose the answer), then the connection closes whatever the client does.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)
