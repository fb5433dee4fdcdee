"""RemoteRetriever without a server: error bodies map back to the library's classes."""

from __future__ import annotations

import socket
from pathlib import Path

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
