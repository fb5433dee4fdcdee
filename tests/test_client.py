"""RemoteRetriever without a retrieval server: error bodies map back to the library's classes,
and what it sends to (and reads from) a plain HTTP server in a thread."""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import numpy as np
import pytest

from indexes.docstore import Document
from indexes.errors import ArtifactError, InvalidWriteError, SchemaMismatchError
from retrieval import (
    FilterTypeError,
    InvalidQueryError,
    LimitExceededError,
    LogGapError,
    MalformedFilterError,
    RetrievalError,
    UnknownFieldError,
)
from retrieval.cli import main
from retrieval.client import RemoteRetriever, raise_for_error
from retrieval.errors import ConfigError, OverloadedError, RetrieverClosedError
from retrieval.features import FeatureRequestError, FeatureSchemaError
from retrieval.integrations.errors import MissingExtraError
from retrieval.service import (
    AuthenticationError,
    NotFoundError,
    PayloadTooLargeError,
    RequestFieldError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailableError,
)
from retrieval.service.errors import ForbiddenError, HeaderTooLargeError
from retrieval.sharding.errors import ShardUnavailableError


def response(status: int, kind: str, message: str = "what went wrong") -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": kind, "message": message}})


@pytest.mark.parametrize(("status", "kind", "expected"), [
    (400, "UnknownFieldError", UnknownFieldError),
    (400, "FilterTypeError", FilterTypeError),
    (400, "MalformedFilterError", MalformedFilterError),
    (400, "InvalidQueryError", InvalidQueryError),
    (413, "LimitExceededError", LimitExceededError),
    (413, "PayloadTooLargeError", PayloadTooLargeError),
    (422, "RequestFieldError", RequestFieldError),
    (401, "AuthenticationError", AuthenticationError),
    (503, "ServiceUnavailableError", ServiceUnavailableError),
    (500, "ServerError", ServerError),
    (400, "FeatureRequestError", FeatureRequestError),  # not in retrieval.errors
    (503, "ShardUnavailableError", ShardUnavailableError),
    (409, "LogGapError", LogGapError),
    (503, "SomethingNewerError", ServiceUnavailableError),  # a newer server's class
    (500, "SomethingNewerError", ServerError),
])
def test_error_bodies_are_raised_as_the_named_class(status: int, kind: str,
                                                    expected: type[Exception]) -> None:
    with pytest.raises(expected, match="what went wrong") as caught:
        raise_for_error(response(status, kind))
    assert type(caught.value) is expected
    assert caught.value.status_code == status  # type: ignore[attr-defined]


def test_a_proxy_error_page_is_still_a_typed_error() -> None:
    with pytest.raises(ServiceUnavailableError, match="HTTP 502"):
        raise_for_error(httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(ServerError, match="HTTP 500"):
        raise_for_error(httpx.Response(500, text="oops"))
    raise_for_error(httpx.Response(200, json={}))  # success: nothing raised


@pytest.mark.parametrize(("status", "expected"), [
    (401, AuthenticationError), (403, ForbiddenError), (404, NotFoundError),
    (408, RequestTimeoutError), (413, PayloadTooLargeError), (429, OverloadedError),
    (431, HeaderTooLargeError), (504, ServiceUnavailableError), (418, ServerError),
])
def test_a_proxy_error_page_is_typed_by_its_status(status: int,
                                                   expected: type[Exception]) -> None:
    """A proxy's own 401 / 413 / 429 page (HTML, no error body of ours) was a ServerError."""
    with pytest.raises(expected, match=f"HTTP {status}: <html>") as caught:
        raise_for_error(httpx.Response(status, text="<html>proxy says no</html>"))
    assert type(caught.value) is expected
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    with pytest.raises(expected):  # JSON, but not ours
        raise_for_error(httpx.Response(status, json={"detail": "rate limited"}))


def error_response(kind: str, details: dict[str, object] | None = None,
                   status: int = 503) -> httpx.Response:
    error: dict[str, object] = {"type": kind, "message": "what went wrong"}
    if details is not None:
        error["details"] = details
    return httpx.Response(status, json={"error": error})


def caught_from(answer: httpx.Response) -> BaseException:
    with pytest.raises(RetrievalError) as caught:
        raise_for_error(answer)
    assert str(caught.value) == "what went wrong"
    return caught.value


def test_an_error_keeps_the_attributes_its_constructor_takes() -> None:
    """``ShardUnavailableError.shard`` and ``FeatureSchemaError.column`` were AttributeErrors
    on the client: the class was rebuilt without its constructor."""
    shard = caught_from(error_response("ShardUnavailableError", {"shard": "shard-001"}))
    assert isinstance(shard, ShardUnavailableError) and shard.shard == "shard-001"
    column = caught_from(error_response("FeatureSchemaError", {"column": "clicks", "row": 3},
                                        422))
    assert isinstance(column, FeatureSchemaError)
    assert (column.column, column.row) == ("clicks", 3)
    artifact = caught_from(error_response("ArtifactError", {"path": "builds/b1/manifest.json"}))
    assert isinstance(artifact, ArtifactError)
    assert artifact.path == Path("builds/b1/manifest.json")  # as its constructor makes it
    field = caught_from(error_response("SchemaMismatchError", {"field": "year"}, 422))
    assert isinstance(field, SchemaMismatchError) and field.field == "year"


@pytest.mark.parametrize(("kind", "attributes"), [
    ("ShardUnavailableError", {"shard": None}),
    ("FeatureSchemaError", {"column": None, "row": None}),
    ("ConfigError", {"key": None}),
    ("ArtifactError", {"path": None}),
    ("MissingExtraError", {"extra": None}),  # it writes its own message in-process
    ("RetrieverClosedError", {}),
])
def test_a_body_without_details_still_gives_every_attribute(
        kind: str, attributes: dict[str, object]) -> None:
    """An older server sends the type and message alone: the attributes read None."""
    error = caught_from(error_response(kind))
    assert type(error).__name__ == kind
    for name, value in attributes.items():
        assert getattr(error, name) == value, name


def test_an_error_built_from_its_own_arguments_keeps_the_servers_message() -> None:
    error = caught_from(error_response("MissingExtraError", {"extra": "langchain"}))
    assert isinstance(error, MissingExtraError) and error.extra == "langchain"
    assert isinstance(caught_from(error_response("RetrieverClosedError")),
                      RetrieverClosedError)
    assert isinstance(caught_from(error_response("ConfigError", {"key": "fusion"}, 422)),
                      ConfigError)


def unused_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_server_is_service_unavailable() -> None:
    with RemoteRetriever(f"http://127.0.0.1:{unused_port()}", timeout=2.0) as remote, \
            pytest.raises(ServiceUnavailableError, match="cannot reach"):
        remote.search("statins")


def test_index_info_of_an_unreachable_server_is_service_unavailable() -> None:
    """It raised httpx.ConnectError, where every other method raises our class."""
    with RemoteRetriever(f"http://127.0.0.1:{unused_port()}", timeout=2.0) as remote, \
            pytest.raises(ServiceUnavailableError, match="cannot reach .*/v1/index"):
        remote.index_info()


def test_query_vectors_are_refused_with_a_clear_error() -> None:
    with RemoteRetriever("http://127.0.0.1:9") as remote:
        with pytest.raises(InvalidQueryError, match="query text"):
            remote.search("x", query_vector=np.zeros(384, dtype=np.float32))
        with pytest.raises(RetrievalError):
            remote.search_batch(["x"], query_vectors=np.zeros((1, 384), dtype=np.float32))


def test_writes_of_one_document_or_id_given_alone_are_refused_before_sending() -> None:
    """``delete("doc-1")`` sent the ids d, o, c, - and 1; a lone document and vectors that
    are no matrix were a TypeError or ValueError from deep inside."""
    with RemoteRetriever("http://127.0.0.1:9") as remote:
        with pytest.raises(InvalidWriteError, match="ids is one string"):
            remote.delete("doc-1")
        with pytest.raises(InvalidWriteError, match="documents is one Document"):
            remote.upsert(Document("d1", "text"))  # type: ignore[arg-type]
        with pytest.raises(InvalidWriteError, match="no matrix of numbers"):
            remote.upsert([Document("d1", "a"), Document("d2", "b")], [[1.0, 2.0], [1.0]])


def test_the_remote_searches_take_every_argument_the_retrievers_do() -> None:
    """``explain`` was missing from ``RemoteRetriever.search_batch`` (a TypeError), though
    the batch body takes it. ``abandoned`` is the in-process event a server sets."""
    import inspect

    from retrieval import Retriever

    for name in ("search", "search_batch", "asearch", "asearch_batch"):
        local = set(inspect.signature(getattr(Retriever, name)).parameters) - {"abandoned"}
        remote = set(inspect.signature(getattr(RemoteRetriever, name)).parameters)
        assert local <= remote, (name, local - remote)


# --- a real HTTP server in a thread: what the client sends, and answers that are not ours ---

class Answering(http.server.BaseHTTPRequestHandler):
    """Records each request's body and answers with the server's next canned answer; an
    answer of None never comes (until the server closes)."""

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        server = cast(AnsweringServer, self.server)
        server.bodies.append(self.rfile.read(int(self.headers.get("content-length", 0))))
        answer = server.answers.pop(0)
        if answer is None:
            server.closing.wait()
            return
        status, headers, body = answer
        self.send_response(status)
        for name, value in {**headers, "content-length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class AnsweringServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    bodies: list[bytes]
    answers: list[tuple[int, dict[str, str], bytes] | None]
    closing: threading.Event

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, *answers: tuple[int, dict[str, str], bytes] | None) -> None:
        self.bodies.clear()
        self.answers[:] = answers


@pytest.fixture(scope="module")
def server() -> Iterator[AnsweringServer]:
    serving = AnsweringServer(("127.0.0.1", 0), Answering)
    serving.bodies, serving.answers, serving.closing = [], [], threading.Event()
    thread = threading.Thread(target=serving.serve_forever, daemon=True)
    thread.start()
    yield serving
    serving.closing.set()
    serving.shutdown()
    serving.server_close()


JSON_TYPE = {"content-type": "application/json"}
NO_HITS = (200, JSON_TYPE, json.dumps({"query": "wing", "hits": [], "timings": {},
                                       "build_id": "b1"}).encode())
ACK = (200, JSON_TYPE, b'{"seq": 7, "replayed": false}')


def test_a_string_given_as_a_batch_is_refused_as_in_process() -> None:
    """search_batch("wing") searched "w", "i", "n" and "g"; in-process refuses it."""
    with RemoteRetriever(f"http://127.0.0.1:{unused_port()}") as remote:
        with pytest.raises(InvalidQueryError, match="queries must be a list"):
            remote.search_batch("wing")
        with pytest.raises(InvalidQueryError, match="queries must be a list"):
            asyncio.run(remote.asearch_batch("wing"))


def deep_filter(depth: int) -> dict[str, object]:
    nested: list[object] = []
    spec = {"a": nested}
    for _ in range(depth):
        nested.append([])
        nested = cast(list[object], nested[-1])
    return spec


def test_what_json_cannot_carry_is_refused_as_the_librarys_error() -> None:
    """A lone surrogate, a set or a filter nested past the recursion limit were httpx's
    UnicodeEncodeError, TypeError and RecursionError: no RetrievalError, and no part named."""
    with RemoteRetriever(f"http://127.0.0.1:{unused_port()}") as remote:
        with pytest.raises(InvalidQueryError, match="query cannot be sent as JSON: it holds "
                           "a lone surrogate"):
            remote.search("wing \ud800")
        with pytest.raises(InvalidQueryError, match=r"queries\[1\] cannot be sent"):
            asyncio.run(remote.asearch_batch(["wing", "flutter \udc00"]))
        with pytest.raises(MalformedFilterError, match="filters cannot be sent as JSON: it "
                           "nests too deeply"):
            remote.search("wing", deep_filter(5000))
        with pytest.raises(MalformedFilterError, match="type set is not JSON serializable"):
            remote.search("wing", {"year": {1962, 1963}})
        with pytest.raises(InvalidWriteError, match=r"ids\[1\] cannot be sent as JSON"):
            remote.delete(["d1", "d2 \ud800"])
        with pytest.raises(InvalidQueryError, match=r"ids\[0\] cannot be sent"):
            remote.get_documents(["\udc00"])


def test_numpy_numbers_and_nan_go_to_the_server_to_judge_as_in_process(server) -> None:
    """``k=np.int64(3)`` (in-process takes it) was a TypeError, a NaN metadata value (in-process
    keeps it; so does the service) or a NaN min_score (the service refuses it as in-process
    does) a ValueError, before anything was sent."""
    with RemoteRetriever(server.url) as remote:
        server.answer(NO_HITS, NO_HITS)
        remote.search("wing", None, np.int64(3), min_score=float("nan"))
        asyncio.run(remote.asearch("wing", None, np.int64(3), deadline_ms=np.float32(50)))
        first, second = (json.loads(body) for body in server.bodies)
        assert first["k"] == 3 and math.isnan(first["min_score"])
        assert second["k"] == 3 and second["deadline_ms"] == 50
        server.answer(ACK)
        assert remote.upsert([{"id": "d1", "text": "wing", "metadata": {"year": float("nan")}}]
                             ).seq == 7
        sent = json.loads(server.bodies[0])["documents"][0]
        assert math.isnan(sent["metadata"]["year"])


def test_an_api_key_no_header_can_carry_is_refused_where_it_is_given() -> None:
    """A key read from a file with its line end was h11's LocalProtocolError, a non-ASCII one
    a UnicodeEncodeError, at the first request. The key itself is not printed."""
    for key in ("s3cret\n", "s3crét"):
        with pytest.raises(ConfigError, match="api_key holds .* at position") as caught:
            RemoteRetriever("http://127.0.0.1:9", key)
        assert "s3cr" not in str(caught.value)


def test_a_redirect_or_a_page_that_is_not_ours_is_a_server_error(server) -> None:
    """A 308 (a proxy sending http to https) and a web server's 200 page were pydantic
    ValidationErrors about invalid JSON: the answer was read as the service's."""
    to = "https://search.example/v1/search"
    with RemoteRetriever(server.url) as remote:
        server.answer((308, {"location": to}, b""))
        with pytest.raises(ServerError, match=f"HTTP 308 redirect to {to}: the client follows "
                           "no redirects") as caught:
            remote.search("wing")
        assert caught.value.status_code == 308  # type: ignore[attr-defined]
        page = (200, {"content-type": "text/html"}, b"<html>Welcome to nginx!</html>")
        server.answer(page, page, page)
        with pytest.raises(ServerError, match=f"answer from {server.url}/v1/search is not a "
                           "retrieval service response .text/html, '<html>Welcome"):
            remote.search("wing")
        with pytest.raises(ServerError, match="/v1/documents is not a retrieval service"):
            remote.upsert([{"id": "d1", "text": "wing"}])
        with pytest.raises(ServerError, match="/v1/index is not a retrieval service"):
            remote.index_info()


def test_a_write_without_an_answer_in_time_may_have_been_applied(server, tmp_path, capsys
                                                                 ) -> None:
    """A write slower than the client's timeout said "cannot reach", though the server had
    written it: the caller is told it may have been applied and how to repeat it safely."""
    from retrieval import WriteTimeoutError

    with RemoteRetriever(server.url, timeout=0.5) as remote:
        server.answer(None)
        with pytest.raises(WriteTimeoutError, match="the write may have been applied; sending "
                           "it again with request_id='r1' is safe") as caught:
            remote.delete(["d1"], request_id="r1", retries=0)
        assert caught.value.request_id == "r1"
        server.answer(None)
        with pytest.raises(ServiceUnavailableError) as searched:  # a read: nothing applied
            remote.search("wing")
        assert not isinstance(searched.value, WriteTimeoutError)
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n")
    server.answer(None, None, None)  # the command retries twice
    assert main(["delete", "--url", server.url, "--ids", str(ids), "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "may have been applied" in err and "running the command again is safe" in err
    with pytest.raises(SystemExit):
        main(["delete", "--url", server.url, "--ids", str(ids), "--timeout", "0"])
    assert "--timeout: must be a number of seconds above 0" in capsys.readouterr().err
