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
from collections.abc import Iterable, Sequence
from typing import Any, cast

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
from retrieval.service.errors import (
    AuthenticationError,
    ForbiddenError,
    HeaderTooLargeError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailableError,
)
from retrieval.service.schemas import FetchResult, WriteAck

Filters = dict[str, Any] | str | None


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
    it names none of ours), with ``status_code`` set."""
    if response.status_code < 400:
        return
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
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
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
        return SearchResult.model_validate_json(self._post("/v1/search", body))

    def search_batch(self, queries: Sequence[str], filters: Filters = None,
                     k: int | None = None, *, candidates: int | None = None,
                     query_vectors: np.ndarray | None = None,
                     deadline_ms: float | None = None, group_by: str | None = None,
                     context: int = 0, min_seq: int | None = None,
                     explain: bool = False, min_score: float | None = None
                     ) -> list[SearchResult]:
        """``Retriever.search_batch`` on the server (one request; ``deadline_ms`` is the
        server's budget for the whole batch)."""
        _no_vectors(query_vectors)
        body = _body(queries=list(queries), filters=filters, k=k, candidates=candidates,
                     deadline_ms=deadline_ms, group_by=group_by, context=context or None,
                     min_seq=min_seq, explain=explain or None, min_score=min_score)
        return _batch(self._post("/v1/search/batch", body))

    # -- writes -------------------------------------------------------------------------------

    def upsert(self, documents: Iterable[Document | dict[str, Any]],
               vectors: np.ndarray | None = None, *, request_id: str | None = None,
               retries: int = 2) -> WriteAck:
        """``IndexWriter.upsert`` on the server (a key of write scope); the ack's ``seq`` is
        durable when this returns. A connection error is retried ``retries`` times with the
        same ``request_id`` (default: a fresh one), so a retry is never logged twice."""
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
        return WriteAck.model_validate_json(self._post("/v1/documents", body, retries))

    def delete(self, ids: Iterable[str], *, request_id: str | None = None,
               retries: int = 2) -> WriteAck:
        """``IndexWriter.delete`` on the server; retried as ``upsert`` is."""
        body = {"ids": check_ids(ids), "request_id": request_id or uuid.uuid4().hex}
        return WriteAck.model_validate_json(self._post("/v1/documents/delete", body, retries))

    def get_documents(self, ids: Sequence[str], *, min_seq: int | None = None
                      ) -> list[Document | None]:
        """``Retriever.get_documents`` on the server: None where no document has the id."""
        result = FetchResult.model_validate_json(
            self._post("/v1/documents/get", _body(ids=list(ids), min_seq=min_seq)))
        found = {d.id: Document(id=d.id, text=d.text, title=d.title, metadata=d.metadata)
                 for d in result.documents}
        return [found.get(doc_id) for doc_id in ids]

    def index_info(self) -> dict[str, Any]:
        """``GET /v1/index``: the serving build's id, document count, encoder and fields."""
        return dict(json.loads(self._request("GET", "/v1/index")))

    def _sync(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(**self._options)
        return self._client

    def _post(self, path: str, body: dict[str, Any], retries: int = 0) -> bytes:
        return self._request("POST", path, body, retries)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 retries: int = 0) -> bytes:
        """The response's bytes; a server it cannot reach is ``ServiceUnavailableError``
        (after ``retries`` more tries), an error response its typed error."""
        for attempt in range(retries + 1):
            try:
                response = self._sync().request(method, path, json=body)
                break
            except httpx.TransportError as exc:
                if attempt == retries:
                    raise ServiceUnavailableError(f"cannot reach {self.url}{path}: {exc!r}"
                                                  ) from exc
        raise_for_error(response)
        return response.content

    # -- async --------------------------------------------------------------------------------

    async def asearch(self, query: str, filters: Filters = None, k: int | None = None,
                      **options: Any) -> SearchResult:
        """``search`` for asyncio apps (its own pooled async client)."""
        _no_vectors(options.pop("query_vector", None))
        body = _body(query=query, filters=filters, k=k, **options)
        return SearchResult.model_validate_json(await self._apost("/v1/search", body))

    async def asearch_batch(self, queries: Sequence[str], filters: Filters = None,
                            k: int | None = None, **options: Any) -> list[SearchResult]:
        _no_vectors(options.pop("query_vectors", None))
        body = _body(queries=list(queries), filters=filters, k=k, **options)
        return _batch(await self._apost("/v1/search/batch", body))

    async def _apost(self, path: str, body: dict[str, Any]) -> bytes:
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aloop is not loop:  # a client serves one loop
            self._aclient, self._aloop = httpx.AsyncClient(**self._options), loop
        try:
            response = await self._aclient.post(path, json=body)
        except httpx.TransportError as exc:
            raise ServiceUnavailableError(f"cannot reach {self.url}{path}: {exc!r}") from exc
        raise_for_error(response)
        return response.content

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


_BATCH = TypeAdapter(dict[str, list[SearchResult]])


def _batch(payload: bytes) -> list[SearchResult]:
    return _BATCH.validate_json(payload)["results"]
