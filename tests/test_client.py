"""RemoteRetriever without a server: error bodies map back to the library's classes."""

from __future__ import annotations

import socket

import httpx
import numpy as np
import pytest

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
from retrieval.features import FeatureRequestError
from retrieval.service import (
    AuthenticationError,
    PayloadTooLargeError,
    RequestFieldError,
    ServerError,
    ServiceUnavailableError,
)
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


def test_unreachable_server_is_service_unavailable() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with RemoteRetriever(f"http://127.0.0.1:{port}", timeout=2.0) as remote, \
            pytest.raises(ServiceUnavailableError, match="cannot reach"):
        remote.search("statins")


def test_query_vectors_are_refused_with_a_clear_error() -> None:
    with RemoteRetriever("http://127.0.0.1:9") as remote:
        with pytest.raises(InvalidQueryError, match="query text"):
            remote.search("x", query_vector=np.zeros(384, dtype=np.float32))
        with pytest.raises(RetrievalError):
            remote.search_batch(["x"], query_vectors=np.zeros((1, 384), dtype=np.float32))


def test_the_remote_searches_take_every_argument_the_retrievers_do() -> None:
    """``explain`` was missing from ``RemoteRetriever.search_batch`` (a TypeError), though
    the batch body takes it. ``abandoned`` is the in-process event a server sets."""
    import inspect

    from retrieval import Retriever

    for name in ("search", "search_batch", "asearch", "asearch_batch"):
        local = set(inspect.signature(getattr(Retriever, name)).parameters) - {"abandoned"}
        remote = set(inspect.signature(getattr(RemoteRetriever, name)).parameters)
        assert local <= remote, (name, local - remote)
