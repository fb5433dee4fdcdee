"""``RemoteRetriever``: the ``Retriever`` search API over HTTP (``retrieval serve``), and
the ``IndexWriter`` writes (``upsert``, ``delete``) with fetching documents by id.

Same ``search`` / ``search_batch`` / ``asearch`` / ``asearch_batch`` signatures and the same
``SearchResult`` models; an error body from the server is raised as the same typed error class
(``LimitExceededError``, ``UnknownFieldError``, ...), with the attributes its constructor takes
(``ShardUnavailableError.shard``, ...), so calling code does not change when the retriever moves
to its own tier; an error page of a proxy in front of the service is typed by its status
(401, 413, 429, 503, ...). Connections are pooled (one sync and one async httpx client,
created on first use). Needs the ``service`` extra (httpx).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import httpx
import numpy as np
from pydantic import TypeAdapter

import retrieval.errors as library_errors
import retrieval.features  # noqa: F401 (its error classes, for ERROR_CLASSES)
import retrieval.service.errors  # noqa: F401 (its error classes, for ERROR_CLASSES)
import retrieval.sharding.errors  # noqa: F401 (its error classes, for ERROR_CLASSES)
from indexes.docstore import Document
from indexes.errors import RetrievalError
from indexes.wal.checks import as_document, check_ids, document_list, given_vectors
from retrieval.models import SearchResult
from retrieval.request_path.validate import check_batch_queries
from retrieval.service.errors import (
    AuthenticationError,
    ForbiddenError,
    HeaderTooLargeError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailableError,
    WriteTimeoutError,
)
from retrieval.service.schemas import FetchResult, WriteAck

Filters = dict[str, Any] | str | None
T = TypeVar("T")


def _error_classes() -> dict[str, type[RetrievalError]]:
    """Every error class of the library by name (the names are unique): the service names
    any of them, a feature store's, a shard's or a publish's included."""
    found: dict[str, type[RetrievalError]] = {}
    pending: list[type[RetrievalError]] = [RetrievalError]
    while pending:
        kind = pending.pop()
        found[kind.__name__] = kind
        pending.extend(kind.__subclasses__())
    return found


ERROR_CLASSES = _error_classes()

# The class of a response that names none of ours: an error page of a proxy or load balancer
# in front of the service (its rate limit, its body size limit, its auth), or a newer
# server's class. The service's own statuses for these classes (``STATUS_BY_ERROR``); 429
# is a proxy's "too many requests", which the library calls overloaded. Others: ServerError.
CLASS_BY_STATUS: dict[int, type[RetrievalError]] = {
    401: AuthenticationError, 403: ForbiddenError, 404: NotFoundError,
    408: RequestTimeoutError, 413: PayloadTooLargeError, 429: library_errors.OverloadedError,
    431: HeaderTooLargeError, 502: ServiceUnavailableError, 503: ServiceUnavailableError,
    504: ServiceUnavailableError,
}


def raise_for_error(response: httpx.Response) -> None:
    """Re-raise a non-2xx response as the error class the server named (by its status when
    it names none of ours), with ``status_code`` set. A redirect is a ``ServerError`` naming
    where it points: httpx follows none (a POST's body would not follow), and its empty body
    was read as a response of the service."""
    if 200 <= response.status_code < 300:
        return
    if response.status_code < 400:
        location = response.headers.get("location") or "no location"
        error: RetrievalError = ServerError(
            f"HTTP {response.status_code} redirect to {location}: the client follows no "
            "redirects; give it the URL the redirect names (a proxy in front of the service "
            "sends these, e.g. from http to https)")
        error.status_code = response.status_code  # type: ignore[attr-defined]
        raise error
    try:
        detail = response.json()["error"]
        name, message = str(detail["type"]), str(detail["message"])
        details = detail.get("details")
        if not isinstance(details, dict):  # an older server sends none
            details = {}
    except (ValueError, KeyError, TypeError):
        name, message, details = "", f"HTTP {response.status_code}: {response.text[:200]}", {}
    kind = ERROR_CLASSES.get(name) or CLASS_BY_STATUS.get(response.status_code, ServerError)
    error = rebuild_error(kind, message, details)
    error.status_code = response.status_code  # type: ignore[attr-defined]
    raise error


def rebuild_error(kind: type[RetrievalError], message: str, details: dict[str, Any]
                  ) -> RetrievalError:
    """``kind`` with ``message`` and the attributes its constructor takes past the message
    (``ShardUnavailableError.shard``, ``FeatureSchemaError.column`` and ``.row``): the
    values the error body's ``details`` carries, None (or the constructor's default) for the
    ones it does not.

    Built by its constructor where it takes the message first (it sets its attributes its
    own way, e.g. ``ArtifactError.path`` as a ``Path``); else (``MissingExtraError`` writes
    its own message) or when it refuses a value, the attributes are set as sent: calling
    code reads ``error.shard`` in-process and remotely alike, never an AttributeError."""
    arguments = _arguments(kind)
    names = [p.name for p in arguments if p.name != "message"]
    if not arguments or arguments[0].name == "message":
        given = {p.name: details.get(p.name) for p in arguments[1:]
                 if p.name in details or p.default is inspect.Parameter.empty}
        try:
            return cast(Any, kind)(message, **given)
        except (TypeError, ValueError):
            pass
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    for name in names:
        setattr(error, name, details.get(name))
    return error


def _arguments(kind: type[RetrievalError]) -> tuple[inspect.Parameter, ...]:
    """The named arguments of ``kind``'s constructor (after ``self``); () for Exception's."""
    init = kind.__init__
    if not inspect.isfunction(init):  # Exception's own: the message alone
        return ()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p for p in list(inspect.signature(init).parameters.values())[1:]
                 if p.kind in named)


def _no_vectors(query_vector: Any) -> None:
    if query_vector is not None:
        raise library_errors.InvalidQueryError(
            "RemoteRetriever does not send query vectors; pass the query text")


class RemoteRetriever:
    """A client of ``retrieval serve`` with the search methods of ``Retriever``."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 10.0,
                 max_connections: int = 64, verify: bool | str = True) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {_sendable_key(api_key)}"} if api_key else {}
        self._options: dict[str, Any] = {
            "base_url": self.url, "headers": headers, "timeout": httpx.Timeout(timeout),
            "limits": httpx.Limits(max_connections=max_connections,
                                   max_keepalive_connections=max_connections),
            "verify": verify,
        }
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None  # the loop _aclient belongs to

    # -- sync ---------------------------------------------------------------------------------

    def search(self, query: str, filters: Filters = None, k: int | None = None, *,
               candidates: int | None = None, query_vector: np.ndarray | None = None,
               deadline_ms: float | None = None, group_by: str | None = None,
               context: int = 0, min_seq: int | None = None,
               explain: bool = False, min_score: float | None = None) -> SearchResult:
        """``Retriever.search`` on the server."""
        _no_vectors(query_vector)
        body = _body(query=query, filters=filters, k=k, candidates=candidates,
                     deadline_ms=deadline_ms, group_by=group_by, context=context or None,
                     min_seq=min_seq, explain=explain or None, min_score=min_score)
        return _answer(SearchResult.model_validate_json, self._post("/v1/search", body))

    def search_batch(self, queries: Sequence[str], filters: Filters = None,
                     k: int | None = None, *, candidates: int | None = None,
                     query_vectors: np.ndarray | None = None,
                     deadline_ms: float | None = None, group_by: str | None = None,
                     context: int = 0, min_seq: int | None = None,
                     explain: bool = False, min_score: float | None = None
                     ) -> list[SearchResult]:
        """``Retriever.search_batch`` on the server (one request; ``deadline_ms`` is the
        server's budget for the whole batch)."""
        check_batch_queries(queries)  # a string was sent as a batch of its characters
        _no_vectors(query_vectors)
        body = _body(queries=list(queries), filters=filters, k=k, candidates=candidates,
                     deadline_ms=deadline_ms, group_by=group_by, context=context or None,
                     min_seq=min_seq, explain=explain or None, min_score=min_score)
        return _answer(_batch, self._post("/v1/search/batch", body))

    # -- writes -------------------------------------------------------------------------------

    def upsert(self, documents: Iterable[Document | dict[str, Any]],
               vectors: np.ndarray | None = None, *, request_id: str | None = None,
               retries: int = 2) -> WriteAck:
        """``IndexWriter.upsert`` on the server (a key of write scope); the ack's ``seq`` is
        durable when this returns. A connection error is retried ``retries`` times with the
        same ``request_id`` (default: a fresh one), so a retry is never logged twice; no
        answer within the timeout is a ``WriteTimeoutError`` (the write may have been applied;
        sending it again with its ``request_id`` is safe).

        A NaN metadata value is sent as Python's json writes it, which the service reads: it is
        kept as in-process (an infinite one is refused there as in-process)."""
        docs = [as_document(item, i) for i, item in enumerate(document_list(documents))]
        # base64 of the float32 bytes: 8x fewer bytes than JSON numbers, and no float repr
        matrix = given_vectors(vectors)
        rows = None if matrix is None else [
            base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode()
            for row in matrix]
        if rows is not None and len(rows) != len(docs):
            raise library_errors.InvalidWriteError(
                f"{len(rows)} vectors for {len(docs)} documents: give one per document")
        body = {"documents": [
            {"id": d.id, "text": d.text, "title": d.title, "metadata": d.metadata,
             **({"vector": rows[i]} if rows is not None else {})}
            for i, d in enumerate(docs)], "request_id": request_id or uuid.uuid4().hex}
        return _answer(WriteAck.model_validate_json, self._write("/v1/documents", body, retries))

    def delete(self, ids: Iterable[str], *, request_id: str | None = None,
               retries: int = 2) -> WriteAck:
        """``IndexWriter.delete`` on the server; retried as ``upsert`` is."""
        body = {"ids": check_ids(ids), "request_id": request_id or uuid.uuid4().hex}
        return _answer(WriteAck.model_validate_json,
                       self._write("/v1/documents/delete", body, retries))

    def get_documents(self, ids: Sequence[str], *, min_seq: int | None = None
                      ) -> list[Document | None]:
        """``Retriever.get_documents`` on the server: None where no document has the id."""
        result = _answer(FetchResult.model_validate_json,
                         self._post("/v1/documents/get", _body(ids=list(ids), min_seq=min_seq)))
        found = {d.id: Document(id=d.id, text=d.text, title=d.title, metadata=d.metadata)
                 for d in result.documents}
        return [found.get(doc_id) for doc_id in ids]

    def index_info(self) -> dict[str, Any]:
        """``GET /v1/index``: the serving build's id, document count, encoder and fields."""
        return _answer(lambda content: dict(json.loads(content)),
                       self._request("GET", "/v1/index"))

    def _sync(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(**self._options)
        return self._client

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self._request("POST", path, _encoded(body, library_errors.InvalidQueryError))

    def _write(self, path: str, body: dict[str, Any], retries: int) -> httpx.Response:
        content = _encoded(body, library_errors.InvalidWriteError)
        return self._request("POST", path, content, retries, body["request_id"])

    def _request(self, method: str, path: str, content: bytes | None = None,
                 retries: int = 0, request_id: str | None = None) -> httpx.Response:
        """The response; a server it cannot reach is ``ServiceUnavailableError`` (after
        ``retries`` more tries), an error response its typed error."""
        headers = JSON if content is not None else None
        for attempt in range(retries + 1):
            try:
                response = self._sync().request(method, path, content=content, headers=headers)
                break
            except httpx.TransportError as exc:
                if attempt == retries:
                    raise self._no_answer(path, exc, request_id) from exc
        raise_for_error(response)
        return response

    def _no_answer(self, path: str, exc: httpx.TransportError, request_id: str | None
                   ) -> ServiceUnavailableError:
        """The error for a request that got no answer. A write sent whole may have been
        applied (it was "cannot reach" though the server had logged it): the caller is told
        how to repeat it safely."""
        if request_id is not None and isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
            timeout = self._options["timeout"].read
            return WriteTimeoutError(
                f"no answer from {self.url}{path} within the client's timeout ({timeout} s): "
                f"the write may have been applied; sending it again with request_id="
                f"{request_id!r} is safe (applied once either way), or give a longer timeout",
                request_id)
        return ServiceUnavailableError(f"cannot reach {self.url}{path}: {exc!r}")

    # -- async --------------------------------------------------------------------------------

    async def asearch(self, query: str, filters: Filters = None, k: int | None = None,
                      **options: Any) -> SearchResult:
        """``search`` for asyncio apps (its own pooled async client)."""
        _no_vectors(options.pop("query_vector", None))
        body = _body(query=query, filters=filters, k=k, **options)
        return _answer(SearchResult.model_validate_json, await self._apost("/v1/search", body))

    async def asearch_batch(self, queries: Sequence[str], filters: Filters = None,
                            k: int | None = None, **options: Any) -> list[SearchResult]:
        check_batch_queries(queries)
        _no_vectors(options.pop("query_vectors", None))
        body = _body(queries=list(queries), filters=filters, k=k, **options)
        return _answer(_batch, await self._apost("/v1/search/batch", body))

    async def _apost(self, path: str, body: dict[str, Any]) -> httpx.Response:
        content = _encoded(body, library_errors.InvalidQueryError)
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aloop is not loop:  # a client serves one loop
            self._aclient, self._aloop = httpx.AsyncClient(**self._options), loop
        try:
            response = await self._aclient.post(path, content=content, headers=JSON)
        except httpx.TransportError as exc:
            raise self._no_answer(path, exc, None) from exc
        raise_for_error(response)
        return response

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
        self.close()

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RemoteRetriever:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _body(**fields: Any) -> dict[str, Any]:
    """Only the arguments given: the server applies its own defaults to the rest."""
    return {name: value for name, value in fields.items() if value is not None}


JSON = {"content-type": "application/json"}


def _sendable_key(api_key: str) -> str:
    """``api_key``, refused where it is made when no HTTP header can carry it (a newline read
    from a key file, a non-ASCII character): it was a UnicodeEncodeError or h11's
    LocalProtocolError at the first request. The key itself is not shown."""
    bad = next((i for i, c in enumerate(api_key) if not (c.isascii() and c.isprintable())),
               None)
    if bad is not None:
        raise library_errors.ConfigError(
            f"api_key holds {api_key[bad]!r} at position {bad} of {len(api_key)}: a key is "
            "printable ASCII (strip the line end read with it from a file)", "api_key")
    return api_key


def _encoded(body: dict[str, Any], refusal: type[RetrievalError]) -> bytes:
    """``body`` as the JSON bytes sent: numpy numbers as the numbers they hold (in-process
    takes ``k=np.int64(3)``), NaN and infinities as Python's json writes them, which the
    service reads, so it judges them as in-process (a NaN ``min_score`` refused, a NaN
    metadata value kept). What JSON cannot carry at all (a lone surrogate, a set, nesting
    past the recursion limit) is ``refusal`` naming the part, as in-process refuses it:
    httpx raised a bare TypeError, ValueError or RecursionError."""
    try:
        return _json(body)
    except (TypeError, ValueError, RecursionError) as exc:
        part = _unsendable_part(body)
        if part == "filters" and refusal is library_errors.InvalidQueryError:
            refusal = library_errors.MalformedFilterError  # as in-process names a filter's
        raise refusal(f"{part} cannot be sent as JSON: {_why(exc)}") from None


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=True, separators=(",", ":"),
                      default=_plain).encode("utf-8")


def _plain(value: Any) -> Any:
    """A numpy scalar or array as the Python value json writes; else json's own TypeError."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _unsendable_part(body: dict[str, Any]) -> str:
    """The body's first field (``queries[2]`` within a list) JSON cannot carry."""
    for name, value in body.items():
        items = value if isinstance(value, list) else [value]
        for position, item in enumerate(items):
            try:
                _json(item)
            except (TypeError, ValueError, RecursionError):
                return f"{name}[{position}]" if isinstance(value, list) else name
    return "the request"  # pragma: no cover - some part failed above


def _why(exc: Exception) -> str:
    if isinstance(exc, UnicodeEncodeError):
        return (f"it holds a lone surrogate ({exc.object[exc.start]!r}, half of a UTF-16 "
                "pair), which is no text")
    if isinstance(exc, RecursionError):
        return "it nests too deeply"
    return str(exc)


def _answer(parse: Callable[[bytes], T], response: httpx.Response) -> T:
    """The response parsed; a 2xx that is not the service's (a web server or proxy page at
    the URL) is a ``ServerError`` naming it: it was pydantic's ValidationError."""
    try:
        return parse(response.content)
    except (ValueError, TypeError) as exc:  # a ValidationError is a ValueError
        given = response.headers.get("content-type") or "no content type"
        error: RetrievalError = ServerError(
            f"answer from {response.url} is not a retrieval service response ({given}, "
            f"{response.text[:80]!r}): give the URL of `retrieval serve`")
        error.status_code = response.status_code  # type: ignore[attr-defined]
        raise error from exc


_BATCH = TypeAdapter(dict[str, list[SearchResult]])


def _batch(payload: bytes) -> list[SearchResult]:
    return _BATCH.validate_json(payload)["results"]
