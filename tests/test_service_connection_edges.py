"""How the service ends a connection, over TCP: the answers after which it closes say so, the
close lets a client still sending its body read the answer, and the answer past
``server.max_connections`` is the service's own 503.

uvicorn runs in this process with the options ``retrieval serve`` gives it
(``uvicorn_options``: the service's protocol, ``limit_concurrency``) over the real app on a
free 127.0.0.1 port. No build is loaded (``lifespan="off"``): every answer here comes before
a search would run.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port, in_thread

from retrieval.cli.serve import uvicorn_options
from retrieval.service.app import create_app
from retrieval.service.auth import ApiKeys
from retrieval.service.metrics import ServiceMetrics
from retrieval.service.settings import ServeConfig

READ_KEY = "read-key-0123456789"
MAX_BODY = 65_536
BIG_BODY = 8 * 1024 * 1024  # far past MAX_BODY: the client is still sending when answered
Address = tuple[str, int]


@contextmanager
def running(tmp_path: Path, **server: Any) -> Iterator[Address]:
    config = ServeConfig.model_validate({"server": {
        "max_body_bytes": MAX_BODY, "body_timeout_seconds": 1.0, **server}})
    app = create_app(tmp_path / "no-build", config, keys=ApiKeys([(READ_KEY, "read")]))
    options = uvicorn_options(config, "warning")
    options.pop("workers")
    options["port"] = free_port()
    with in_thread(uvicorn.Server(uvicorn.Config(app, lifespan="off", **options))):
        yield options["host"], options["port"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Address]:
    with running(tmp_path_factory.mktemp("edges")) as address:
        yield address


def head_of(method: str, path: str, key: str | None, extra: str = "") -> bytes:
    authorization = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n{authorization}"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


def read_response(sock: socket.socket, buffered: bytes = b"") -> tuple[str, dict[str, str],
                                                                       bytes, bytes]:
    """(status line, headers, body, bytes read past it) of the next response."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {data[:300]!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside the body: {rest[:300]!r}"
        rest += chunk
    return status, headers, rest[:length], rest[length:]


def until_closed(sock: socket.socket) -> bytes:
    """What comes until the server's FIN; a reset fails the read (ConnectionResetError)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def error_type(body: bytes) -> str:
    return str(json.loads(body)["error"]["type"])


# -- answers that close the connection say so -------------------------------------------


@pytest.mark.parametrize("name,method,path,key,status", [
    ("an open GET with a body", "GET", "/healthz", None, 200),
    ("a search without a key", "POST", "/v1/search", None, 401),
    ("a write with a read key", "POST", "/v1/documents", READ_KEY, 403),
])
def test_a_response_says_connection_close_when_the_connection_closes_after_it(
        server: Address, name: str, method: str, path: str, key: str | None,
        status: int) -> None:
    """With its body read whole, the answer keeps the connection. Answered before its body
    (a Content-Length of 1 GB) was read, the connection closes: one byte now and then held it
    open for good (each stopped uvicorn's keep-alive timer, and no timeout applies to a body
    no one reads), so a few such connections took every one the server allows. And the
    response says so: a client could send its next request on a connection going away."""
    body = b'{"query": "x"}'
    length = f"Content-Length: {len(body)}\r\n"
    with socket.create_connection(server, timeout=15) as sock:
        # A body sent after its head, which the search waits for (then 503: no build).
        sock.sendall(head_of("POST", "/v1/search", READ_KEY, length))
        time.sleep(0.2)
        sock.sendall(body)
        line, headers, _, rest = read_response(sock)
        assert line.startswith("HTTP/1.1 503") and "connection" not in headers, (line, headers)
        sock.sendall(head_of(method, path, key, length) + body)
        line, headers, _, rest = read_response(sock, rest)
        assert line.startswith(f"HTTP/1.1 {status}"), (name, line)
        assert "connection" not in headers, (name, headers)
        sock.sendall(head_of(method, path, key, "Content-Length: 1000000000\r\n"))
        line, headers, _, _ = read_response(sock, rest)
        assert line.startswith(f"HTTP/1.1 {status}"), (name, line)
        assert headers.get("connection") == "close", (name, headers)
        sock.sendall(b"x" * 65536)  # more body: read and dropped, not a reset
        assert until_closed(sock) == b""


# -- a client still sending gets the answer, not a reset ---------------------------------


@pytest.mark.parametrize("name,framing", [
    ("declared", f"Content-Length: {BIG_BODY}\r\n"),
    ("chunked", "Transfer-Encoding: chunked\r\n"),
])
def test_a_413_reaches_a_client_still_sending_its_body(server: Address, name: str,
                                                       framing: str) -> None:
    """8 MB sent at once, as a client sends a body before it reads: the 413 came as soon as
    the body was known too large and uvicorn closed the connection at once, with the rest of
    the body unread, which reset it: the send failed (ConnectionResetError) and urllib lost
    the answer. The close now lingers, reading and dropping the rest."""
    body = b"x" * BIG_BODY
    if name == "chunked":
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with socket.create_connection(server, timeout=15) as sock:
        sock.sendall(head_of("POST", "/v1/search", READ_KEY, framing) + body)
        line, headers, answer, _ = read_response(sock)
        assert line.startswith("HTTP/1.1 413"), (name, line)
        assert headers["connection"] == "close" and error_type(answer) == "PayloadTooLargeError"
        assert until_closed(sock) == b""


def test_a_408_reaches_a_client_still_trickling_its_body(server: Address) -> None:
    """A body sent in pieces slower than server.body_timeout_seconds (1 s here), the client
    sending on for a second past it before reading: the 408's close reset the connection
    under the pieces sent after it."""
    with socket.create_connection(server, timeout=15) as sock:
        sock.sendall(head_of("POST", "/v1/search", READ_KEY, f"Content-Length: {MAX_BODY}\r\n"))
        sending_until = time.monotonic() + 2.0
        while time.monotonic() < sending_until:
            sock.sendall(b"x" * 1000)
            time.sleep(0.05)
        line, headers, answer, _ = read_response(sock)
        assert line.startswith("HTTP/1.1 408"), line
        assert headers["connection"] == "close" and error_type(answer) == "RequestTimeoutError"
        assert until_closed(sock) == b""


# -- past server.max_connections ----------------------------------------------------------


def requests_total(address: Address, route: str, method: str, status: int) -> float:
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(head_of("GET", "/metrics", READ_KEY, "Connection: close\r\n"))
        line, _, text, _ = read_response(sock)
    assert line.startswith("HTTP/1.1 200"), line
    return in_exposition(text, route, method, status)


def counted(metrics: ServiceMetrics | None, route: str, method: str, status: int) -> float:
    """The server's count, read in this process (no connection left to ask /metrics on)."""
    assert metrics is not None
    return in_exposition(metrics.exposition(), route, method, status)


def in_exposition(text: bytes, route: str, method: str, status: int) -> float:
    wanted = {"route": route, "method": method, "status": str(status)}
    return sum(sample.value for family in text_string_to_metric_families(text.decode())
               for sample in family.samples
               if sample.name == "retrieval_http_requests_total" and sample.labels == wanted)


def test_past_max_connections_the_answer_is_the_services_503_and_counted(tmp_path: Path
                                                                          ) -> None:
    """uvicorn's own answer past its limit_concurrency was a plain-text 'Service
    Unavailable' with no Retry-After, in no metric. Three connections held open (kept alive
    after a request each) and a fourth make the limit of 4."""
    limit = 4
    with running(tmp_path, max_connections=limit, keep_alive_seconds=60.0) as address:
        held = [socket.create_connection(address, timeout=15) for _ in range(limit - 1)]
        try:
            for sock in held:
                sock.sendall(head_of("GET", "/healthz", None))
                assert read_response(sock)[0].startswith("HTTP/1.1 200")
            with socket.create_connection(address, timeout=15) as sock:
                sock.sendall(head_of("GET", "/healthz", None))
                line, headers, answer, _ = read_response(sock)
                assert until_closed(sock) == b""
        finally:
            for sock in held:
                sock.close()
        assert line.startswith("HTTP/1.1 503"), line
        assert headers["content-type"] == "application/json"
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert error_type(answer) == "OverloadedError"
        assert "server.max_connections" in json.loads(answer)["error"]["message"]
        # The held connections are closing: /metrics waits for a free one.
        deadline = time.monotonic() + 30
        while True:
            try:
                counted = requests_total(address, "/healthz", "GET", 503)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "no connection freed for /metrics"
                time.sleep(0.1)
        assert counted == 1


def test_a_head_half_read_behind_a_closing_answer_gets_no_408(tmp_path: Path) -> None:
    """A response that closes its connection lingers up to 2 s; a next head half read
    behind it kept its timer, which fired during the linger: the 408 was written after the
    FIN (a RuntimeError logged, nothing sent) and counted as an answer."""
    # max_connections 1: uvicorn counts the new connection too, so each is answered 503
    with running(tmp_path, header_timeout_seconds=0.3, max_connections=1) as address:
        with socket.create_connection(address, timeout=15) as sock:
            sock.sendall(head_of("GET", "/healthz", None) + b"GET /hea")
            line, headers, _, _ = read_response(sock)
            time.sleep(1.0)  # the client reads its answer but keeps the socket a moment
            assert until_closed(sock) == b""
        assert line.startswith("HTTP/1.1 503") and headers["connection"] == "close"
        assert counted(ServiceMetrics.latest, "other", "other", 408) == 0
