"""uvicorn's httptools protocol with the limits it lacks on a request's head.

httptools accepts any number and size of headers and waits for them without a deadline: 1 MB
headers and 10,000 headers were accepted, and 20,100 idle half-sent heads held their
connections until the descriptor limit. This protocol answers 431 (header fields too large)
past ``server.max_headers`` headers or ``server.max_header_bytes`` bytes of them (the request
line's URL included), and 408 when a request's head is not complete
``server.header_timeout_seconds`` after the connection opened or the request's first byte
arrived (a head waiting behind a request still running gets its time again); both close the
connection, after the responses of the requests pipelined before, and count in
``retrieval_http_requests_total`` under route "other". The body has its own timeout
(``guard``), idle keep-alive connections uvicorn's. A response sent before its request's body
was read whole (a 401, a GET with a body) says ``connection: close`` and closes the
connection: the rest of that body stood between the connection and its next request, and each
byte of it stopped uvicorn's keep-alive timer for good, so one byte now and then held the
connection open forever. Every close after a response the app answered is a lingering one
(uvicorn's closed at once: a client still sending the body of a request answered 413 got a
reset, and urllib lost the answer; its own 400 for malformed HTTP still closes at once).
Past ``server.max_connections`` (uvicorn's ``limit_concurrency``) the answer is the service's
overload 503 (``guard.answer_over_limit``), not uvicorn's plain-text one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

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
        self._head_started = 0.0
        self._head_bytes = 0  # of the URL, header names and values
        self._in_head = False
        self._head_received = 0  # bytes read while the head was incomplete
        self._heads_begun = 0
        self._refused = False
        self._closing = False  # answered and closing: what still comes is dropped
        self._answer_after_response: bytes | None = None
        self._cycle_transport: asyncio.Transport | None = None
        self._keep_alive: bool | None = None  # the request's own, until its body is whole

    @property
    def _raw_head_limit(self) -> int:
        """``max_header_bytes`` as bytes read: with each header's ': ' and CRLF, the method
        and the version."""
        return self.max_header_bytes + 4 * self.max_headers + 64

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._cycle_transport = cast(asyncio.Transport,
                                     CycleTransport(transport, self._linger_and_close))
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._closing:
            return
        was_in_head, heads_begun = self._in_head, self._heads_begun
        super().data_received(data)
        # httptools joins a header value's pieces (uvicorn the URL's) one read at a time, and
        # on_header sees the value only once whole: a 64 MiB header took 20 s to join before
        # any limit applied. A read that began and ended inside one head is all head bytes.
        if self._refused or not (was_in_head and self._in_head) or \
                heads_begun != self._heads_begun:
            return
        self._head_received += len(data)
        if self._head_received > self._raw_head_limit:
            self._refuse(431, self._head_too_large())

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._head_bytes = self._head_received = 0
        self._in_head = True
        self._heads_begun += 1
        if self._head_timer is None:  # the next request of a kept-alive connection
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(url)
        if self._head_bytes > self.max_header_bytes:  # a long URL and no header at all
            self._refuse(431, self._head_too_large())
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value)
        if len(self.headers) >= self.max_headers or self._head_bytes > self.max_header_bytes:
            self._refuse(431, self._head_too_large())
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        if self._refused:
            return
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request to answer (an upgrade makes none)
            self._adopt(self.cycle)

    def _adopt(self, cycle: RequestResponseCycle) -> None:
        # uvicorn's cycle closes the connection after a response that says connection: close;
        # through this transport that close lingers.
        cycle.transport = self._cycle_transport  # type: ignore[assignment]
        # Not kept alive until its body is read whole: a response sent before then says
        # connection: close and closes the connection, for reading on to the next request
        # means reading the rest of a body that may never end (a Content-Length of 1 GB, sent
        # a byte at a time, held the connection past every timeout).
        self._keep_alive, cycle.keep_alive = cycle.keep_alive, False

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        keep_alive, self._keep_alive = self._keep_alive, None
        if keep_alive is not None and not self.cycle.response_started:
            self.cycle.keep_alive = keep_alive  # the body came whole before the response
        super().on_message_complete()

    def shutdown(self) -> None:
        if self._keep_alive is not None:  # a body still coming: the connection ends after it
            self._keep_alive = False
        super().shutdown()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # uvicorn 0.45 and later start every request here (hence the floor in pyproject.toml)
        if app is service_unavailable:  # past server.max_connections: uvicorn's plain 503
            app = self._over_limit
        super()._start_asgi_task(cycle, app)

    async def _over_limit(self, scope: Any, receive: Any, send: Any) -> None:
        from retrieval.service.guard import answer_over_limit  # imports metrics: see _refuse

        await answer_over_limit(scope, send, self.limit_concurrency)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._closing:  # the response said connection: close; it lingers, not waits
            self._unset_keepalive_if_required()
            return
        if self.pipeline or not self.cycle.response_complete or self.transport.is_closing():
            return
        if self._answer_after_response is not None:
            self._unset_keepalive_if_required()
            self._answer_and_close(self._answer_after_response)

    def _head_too_large(self) -> HeaderTooLargeError:
        return HeaderTooLargeError(
            f"the request head exceeds {self.max_headers} headers or {self.max_header_bytes} "
            "bytes (server.max_headers, server.max_header_bytes); send fewer or shorter "
            "headers")

    def _start_head_timer(self) -> None:
        self._head_started = self.loop.time()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._refused or self._closing:
            return
        if self._answering():  # the head waits behind a response: it gets its time again
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)
            return
        self._refuse(408, RequestTimeoutError(
            f"the request head did not arrive within {self.header_timeout:g} s "
            "(server.header_timeout_seconds); send it whole"))

    def _answering(self) -> bool:
        """Whether a request read before is still to be answered (running or queued)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self, status: int, error: RetrievalError) -> None:
        """Answer ``status`` with the service's error body and close the connection; read
        nothing more. Behind a request still to be answered (pipelined), the answer waits for
        its response: written now, it was read as that request's answer, and the response
        that request really got (a write done, say) was lost."""
        # Imported here: prometheus-client picks its multiprocess mode when first imported,
        # and ``retrieval serve`` builds this class before it sets the metrics directory.
        from retrieval.service.metrics import observe_refused

        self._refused = True
        self._stop_head_timer()
        observe_refused(status, self.loop.time() - self._head_started)
        body = json.dumps(error_body(error)).encode()
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        answer = b"".join([
            b"HTTP/1.1 %d %s\r\n" % (status, reason), b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body])
        if self._answering():
            self._answer_after_response = answer
        else:
            self._answer_and_close(answer)

    def _answer_and_close(self, answer: bytes) -> None:
        self._answer_after_response = None
        self.transport.write(answer)
        self._linger_and_close()

    def _linger_and_close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._stop_head_timer()  # a next head half read is dropped, not answered 408
        self.pipeline.clear()  # requests read behind a response that closes go unanswered
        self.flow.resume_reading()  # paused by a body no one read: read on, to drop it
        # A lingering close: the answer and a FIN now, what the client still sends is read and
        # dropped for a moment (closing with unread data would reset the connection, and the
        # client would lose the answer), then the connection closes whatever the client does.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


class CycleTransport:
    """The connection's transport as uvicorn's ``RequestResponseCycle`` uses it (it writes,
    asks ``is_closing`` and closes), with ``close`` the protocol's lingering close: uvicorn's
    own closed at once, and a client still sending (the rest of a body answered 413) got a
    reset instead of the answer."""

    __slots__ = ("close", "is_closing", "write")

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.close = close
