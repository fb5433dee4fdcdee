"""The outermost ASGI layer: route labels, metrics, API keys and the body-size limit.

Plain ASGI rather than a ``BaseHTTPMiddleware``: it adds no task or stream per request (the
hit path is tens of microseconds), and it sees every response, including 401, 404 and 413,
so ``retrieval_http_requests_total`` counts what clients actually got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from retrieval.errors import OverloadedError
from retrieval.service.auth import ApiKeys, allows
from retrieval.service.auth import Scope as KeyScope
from retrieval.service.errors import (
    RETRY_AFTER_SECONDS,
    AuthenticationError,
    ForbiddenError,
    PayloadTooLargeError,
    RequestTimeoutError,
    error_body,
)
from retrieval.service.metrics import ServiceMetrics, observe_refused

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("retrieval.service")

# The console's page and assets hold no data (a browser cannot send a key to load them); its
# API compares builds, so it needs an admin key (``retrieval.console``).
CONSOLE_PAGES = frozenset({"/console", "/console/console.js", "/console/console.css"})
CONSOLE_API = frozenset({"/v1/console/schema", "/v1/console/search", "/v1/console/compare",
                         "/v1/console/gate"})
ROUTES = frozenset({"/v1/search", "/v1/search/batch", "/v1/index", "/healthz", "/readyz",
                    "/metrics", "/openapi.json", "/v1/documents", "/v1/documents/delete",
                    "/v1/documents/get", "/v1/snapshot"}) | CONSOLE_PAGES | CONSOLE_API
OPEN_ROUTES = frozenset({"/healthz", "/readyz"})
# The scope a route needs beyond read (``retrieval.service.auth``).
ROUTE_SCOPES: dict[str, KeyScope] = {"/v1/documents": "write", "/v1/documents/delete": "write",
                                  "/v1/snapshot": "admin"}
ROUTE_SCOPES.update(dict.fromkeys(CONSOLE_API, "admin"))


CLIENT_GONE = 499  # the status recorded for a request whose client left before its body


class ClientGone(Exception):
    """The connection closed before the request's body arrived whole."""


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": payload})


async def answer_over_limit(scope: Scope, send: Send, limit: int | None) -> None:
    """The answer past ``server.max_connections`` (uvicorn's ``limit_concurrency``; the
    protocol runs this instead of uvicorn's plain-text 503, which no metric counted): the
    service's overload 503, counted, closing its connection to free one."""
    started = time.perf_counter()
    error = OverloadedError(f"this worker holds {limit} connections and requests, its limit; "
                            "retry shortly, or raise server.max_connections")
    try:
        await send_json(send, 503, error_body(error), [
            (b"retry-after", RETRY_AFTER_SECONDS.encode()), (b"connection", b"close")])
    finally:
        route = scope["path"] if scope["path"] in ROUTES else "other"
        observe_refused(503, time.perf_counter() - started, route, scope["method"])


class Guard:
    """Authenticates, bounds the body, and records route/method/status/duration."""

    def __init__(self, app: ASGIApp, *, keys: ApiKeys, metrics: ServiceMetrics,
                 max_body_bytes: int, metrics_auth: bool,
                 body_timeout_seconds: float = 10.0, max_write_body_bytes: int | None = None,
                 open_writes: bool = False, console: bool = False) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_write_body_bytes = max_write_body_bytes or max_body_bytes
        self.open_writes = open_writes
        self.body_timeout_seconds = body_timeout_seconds
        self.open_routes = OPEN_ROUTES if metrics_auth else OPEN_ROUTES | {"/metrics"}
        self.console = console  # keyless, a console on (loopback) may use its API
        # Without the console its paths are unknown ones (404), not routes needing a key.
        self.routes = ROUTES if console else ROUTES - CONSOLE_PAGES - CONSOLE_API
        if console:
            self.open_routes |= CONSOLE_PAGES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope["path"]
        route = path if path in self.routes else "other"
        status = [500]

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, send_recording, route)
        except ClientGone:  # no one to answer: nginx's 499 in the metrics
            status[0] = CLIENT_GONE
        finally:
            self.metrics.observe_request(route, scope["method"], status[0],
                                         time.perf_counter() - started)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        if route not in self.open_routes and not await self._authorized(scope, send, route):
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            limit = self.max_write_body_bytes if route == "/v1/documents" else \
                self.max_body_bytes
            try:  # asyncio.timeout, not wait_for: no task per request on the hot path
                async with asyncio.timeout(self.body_timeout_seconds):
                    body = await self._read_body(scope, receive, limit)
            except TimeoutError:  # e.g. a Content-Length longer than what was sent
                late = RequestTimeoutError(
                    f"the request body did not arrive within {self.body_timeout_seconds:g} s "
                    "(is Content-Length right?); send it whole")
                await send_json(send, 408, error_body(late), [(b"connection", b"close")])
                return
            if body is None:
                setting = "server.max_write_body_bytes" if limit != self.max_body_bytes \
                    else "server.max_body_bytes"
                error = PayloadTooLargeError(
                    f"request body exceeds {limit} bytes; send less (e.g. split the batch) or "
                    f"raise {setting}")
                await send_json(send, 413, error_body(error), [(b"connection", b"close")])
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _authorized(self, scope: Scope, send: Send, route: str) -> bool:
        """Whether the request's key may use ``route``; else 401 / 403 is sent."""
        needed = ROUTE_SCOPES.get(route, "read")
        if not self.keys.enabled:
            if self.console and route in CONSOLE_API and not loopback_page(scope):
                denied = ForbiddenError(
                    "the console's API answers its own page on loopback on a server without "
                    "keys; open the console at http://127.0.0.1:PORT/console (or configure "
                    "API keys)")
                await send_json(send, 403, error_body(denied))
                return False
            # open_writes opens writes, not admin routes (a snapshot is the whole root)
            if needed == "read" or (self.open_writes and needed == "write") or (
                    self.console and route in CONSOLE_API):
                return True
            hint = " (or set server.open_writes on a trusted network)" \
                if needed == "write" else ""
            denied = ForbiddenError(
                f"{route} needs an API key of {needed} scope and this server has no keys: "
                f"add 'TOKEN {needed}' to server.api_keys_file{hint}")
            await send_json(send, 403, error_body(denied))
            return False
        granted = self.keys.scope_of(_header(scope, b"authorization"))
        if granted is None:
            error = AuthenticationError(
                "missing or unknown API key; send 'Authorization: Bearer <key>'")
            await send_json(send, 401, error_body(error),
                            [(b"www-authenticate", b'Bearer realm="retrieval"')])
            return False
        if not allows(granted, needed):
            denied = ForbiddenError(f"{route} needs a key of {needed} scope; this key has "
                                    f"{granted} scope")
            await send_json(send, 403, error_body(denied))
            return False
        return True

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> bytes | None:
        """The whole body, or None as soon as it is known to exceed ``limit``; ``ClientGone``
        when the client left before sending all of it."""
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # Not the body's end: what came may parse (an upsert's first documents did,
                # and were written for a request its client never finished).
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def loopback_page(scope: Scope) -> bool:
    """Whether a request comes from a page this server served on loopback: its Host names a
    loopback address (not a name another site pointed here: DNS rebinding), and its Origin,
    where sent, is that host (another site's page sends its own, even in no-cors mode)."""
    host = (_header(scope, b"host") or "").lower()
    name = host.split("]")[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    origin = _header(scope, b"origin")
    return name in LOOPBACK_NAMES and (origin is None or
                                       urlsplit(origin.lower()).netloc == host)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _replay(body: bytes, downstream: Receive) -> Receive:
    """The buffered body once, then the real channel (which reports the disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await downstream()

    return receive
