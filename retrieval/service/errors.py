"""Errors of the HTTP service and their status codes (no web framework imported here).

The service adds a few errors of its own to the library's tree, so a remote caller catches
the same classes an in-process caller does::

    RetrievalError
    ├── ConfigError
    │   └── ServiceConfigError        a config file or RETRIEVAL_* override is wrong (start-up)
    ├── AuthenticationError           401: missing or wrong API key
    │   └── ForbiddenError            403: the key may not use this route (a read key writing)
    ├── NotFoundError                 404: unknown route (or 405: wrong method)
    ├── ServiceUnavailableError       503: loading, draining, or no usable build
    ├── ServerError                   500: a bug; the body never carries a traceback
    └── InvalidQueryError
        ├── MalformedRequestError     400: the body is not JSON
        │   └── RequestTimeoutError   408: the body did not arrive in time (body_timeout_seconds)
        ├── RequestFieldError         422: unknown field, missing field, wrong type
        └── LimitExceededError
            ├── PayloadTooLargeError  413: the body exceeds server.max_body_bytes
            └── HeaderTooLargeError   431: more headers or header bytes than the server takes
"""

from __future__ import annotations

from typing import Any

from indexes.publish import UnknownBuildError
from retrieval.errors import (
    ArtifactError,
    ConfigError,
    EncoderMismatchError,
    InvalidQueryError,
    InvalidWriteError,
    LimitExceededError,
    RequestReplayError,
    RetrievalError,
    SearchAbandonedError,
    SequenceNotReachedError,
)


class ServiceConfigError(ConfigError):
    """The service configuration is invalid; the message names the key and the source."""


class AuthenticationError(RetrievalError):
    """The request carries no API key, or one the server does not know."""


class ForbiddenError(AuthenticationError):
    """The API key is known but its scope does not allow the route (writes need a key with
    write scope, snapshots one with admin scope)."""


class NotFoundError(RetrievalError):
    """No such route (or the method is not allowed on it)."""


class ServiceUnavailableError(RetrievalError):
    """The server cannot answer now: loading its build, draining, or its build is unusable."""


class WriteTimeoutError(ServiceUnavailableError):
    """(``retrieval.client``) A write got no answer within the client's timeout, though the
    server may have applied it (a large batch is embedded before it is logged). Sending it
    again with ``request_id`` is safe: a write the server logged already is acknowledged as
    a replay, never applied twice."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class ServerError(RetrievalError):
    """An unexpected failure inside the server (logged there with its traceback)."""


class MalformedRequestError(InvalidQueryError):
    """The request body is not valid JSON."""


class RequestFieldError(InvalidQueryError):
    """The request body has an unknown field, lacks a required one, or has a wrong type."""


class RequestTimeoutError(MalformedRequestError):
    """The request body did not arrive in time (a ``Content-Length`` longer than what was
    sent, or a client too slow): the connection's worker is freed instead of waiting."""


class PayloadTooLargeError(LimitExceededError):
    """The request body is larger than the server accepts."""


class HeaderTooLargeError(LimitExceededError):
    """The request has more headers, or more header bytes, than the server accepts
    (``server.max_headers``, ``server.max_header_bytes``)."""


RETRY_AFTER_SECONDS = "1"  # a 503's Retry-After (loading, draining, shedding): ask again soon

# Most specific first: the first class an error is an instance of gives its status.
STATUS_BY_ERROR: tuple[tuple[type[RetrievalError], int], ...] = (
    (SearchAbandonedError, 499),  # the client closed the request (nginx's code): unsent
    (PayloadTooLargeError, 413),
    (HeaderTooLargeError, 431),
    (RequestTimeoutError, 408),
    (RequestFieldError, 422),
    (LimitExceededError, 413),
    (InvalidQueryError, 400),
    (ForbiddenError, 403),
    (AuthenticationError, 401),
    (RequestReplayError, 409),
    (SequenceNotReachedError, 409),
    (InvalidWriteError, 422),
    (NotFoundError, 404),
    (UnknownBuildError, 404),
    (ServerError, 500),
    (ArtifactError, 503),
    (EncoderMismatchError, 503),
    (ServiceUnavailableError, 503),
)


def status_for(error: RetrievalError) -> int:
    """The HTTP status of a library or service error; other RetrievalErrors are 503 (the
    server cannot serve that request with what it has loaded, e.g. a dead feature store)."""
    for kind, status in STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 503


# What a client rebuilds an error with besides its message (``retrieval.client.rebuild_error``:
# ``ShardUnavailableError.shard``, ``FeatureSchemaError.column``...). Never ``path``: it names
# the server's files.
ERROR_DETAILS = ("shard", "column", "row", "key", "field", "member", "extra")


def error_body(error: BaseException, type_name: str | None = None) -> dict[str, dict[str, Any]]:
    """``{"error": {"type", "message", "details"?}}``: the class name a client maps back to
    the class, and the attributes it is rebuilt with (JSON scalars; none: no ``details``)."""
    body: dict[str, Any] = {"type": type_name or type(error).__name__, "message": str(error)}
    details = {name: value for name in ERROR_DETAILS
               if isinstance(value := getattr(error, name, None), str | int | float | bool)}
    if details:
        body["details"] = details
    return {"error": body}
