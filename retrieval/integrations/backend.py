"""What an adapter needs from the engine, and the hit → framework-object mapping they share.

Adapters depend on ``SearchBackend``, not on ``Retriever``: any object with the four search
methods (the in-process ``Retriever``, or a remote client with the same signatures) plugs in.
A backend written to an older protocol, whose methods lack a keyword option such as
``deadline_ms``, works until an adapter is asked for that option; then the adapter refuses
with ``NotASearchBackendError`` (``check_options``) rather than drop it or let the backend's
call fail on an unexpected keyword.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from retrieval.errors import InvalidQueryError, MalformedFilterError
from retrieval.integrations.errors import NotASearchBackendError
from retrieval.models import Hit, SearchResult
from retrieval.relevance import check_min_score
from retrieval.request_path.validate import check_min_seq

log = logging.getLogger("retrieval.integrations")

FilterSpec = dict[str, Any] | str | None
# Keys the adapters add to a document's own metadata; they win over a same-named field.
SCORE_KEYS = ("score", "bm25_score", "vector_score", "relevance", "build_id")
# Keys locating a passage in its document (passage builds only).
PASSAGE_KEYS = ("parent_id", "passage", "start", "end")
# The result's own notes, copied into every hit's metadata only when the result has them:
# ``degraded`` (stages skipped to meet the deadline) and ``warnings`` (filter values no
# document holds). A framework hands its caller documents only, so this is where they go.
NOTE_KEYS = ("degraded", "warnings")
_METHODS = ("search", "search_batch", "asearch", "asearch_batch")
# (backend class, method) -> the keywords it takes (None: any); a few entries per program.
_CLASS_KEYWORDS: dict[tuple[type, str], frozenset[str] | None] = {}


@runtime_checkable
class SearchBackend(Protocol):
    """The public search API of ``Retriever``, as the adapters call it: the keyword options
    ``group_by``, ``context``, ``min_score``, ``min_seq`` and ``deadline_ms`` are passed only
    when set, and only to a method that takes them (``check_options``)."""

    def search(self, query: str, filters: FilterSpec = None, k: int | None = None, *,
               candidates: int | None = None, **options: Any) -> SearchResult: ...

    def search_batch(self, queries: Sequence[str], filters: FilterSpec = None,
                     k: int | None = None, *, candidates: int | None = None,
                     **options: Any) -> list[SearchResult]: ...

    async def asearch(self, query: str, filters: FilterSpec = None, k: int | None = None,
                      **options: Any) -> SearchResult: ...

    async def asearch_batch(self, queries: Sequence[str], filters: FilterSpec = None,
                            k: int | None = None, **options: Any) -> list[SearchResult]: ...


def check_backend(backend: object) -> SearchBackend:
    missing = [name for name in _METHODS if not callable(getattr(backend, name, None))]
    if missing:
        raise NotASearchBackendError(
            f"{type(backend).__name__} cannot back a framework retriever: it has no "
            f"{', '.join(missing)}; pass a retrieval.Retriever (Retriever.load(path)) or a "
            "client with the same search methods"
        )
    return backend  # type: ignore[return-value]  # the methods were checked just above


def check_options(backend: object, methods: Sequence[str], options: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """``options`` for a call of each of ``methods`` of ``backend``, as a dict;
    ``NotASearchBackendError`` naming the first option a method does not take (a backend
    written before the option existed): a deadline or a read-your-writes bound asked for is
    never dropped, and the backend's own call never fails on an unexpected keyword. Each
    method's signature is read once per class."""
    for method in methods:
        taken = _keywords_taken(backend, method)
        refused = [] if taken is None else [name for name in options if name not in taken]
        if refused:
            raise NotASearchBackendError(
                f"{type(backend).__name__}.{method} takes no {refused[0]} keyword (it follows "
                f"an older search protocol), so the adapter cannot pass "
                f"{refused[0]}={options[refused[0]]!r}; add {refused[0]} (or **options) to "
                f"its {', '.join(_METHODS)}, pass a retrieval.Retriever or RemoteRetriever, "
                f"or leave {refused[0]} unset")
    return dict(options)


def _keywords_taken(backend: object, method: str) -> frozenset[str] | None:
    """The keyword arguments ``backend.method`` takes; None when it takes any (``**options``)
    or has no signature to read. Cached per class, unless the object holds the method
    itself."""
    cls = type(backend)
    if method in getattr(backend, "__dict__", ()) or not hasattr(cls, method):
        return _keywords(getattr(backend, method))
    key = (cls, method)
    if key not in _CLASS_KEYWORDS:  # two threads may both read it: the same answer
        _CLASS_KEYWORDS[key] = _keywords(getattr(cls, method))
    return _CLASS_KEYWORDS[key]


def _keywords(function: Callable[..., Any]) -> frozenset[str] | None:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the call itself will tell
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                   inspect.Parameter.POSITIONAL_OR_KEYWORD))


def check_count(name: str, value: object) -> int | None:
    """``k`` / ``candidates`` set on an adapter: None (the engine's default) or a positive int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidQueryError(f"{name} must be a positive integer or None (the retriever's "
                                f"configured default), got {value!r}")
    return value


def check_filters(filters: object, accepted: str = "a dict, a DSL string or None") -> FilterSpec:
    """A dict or DSL filter (validated against the index by the engine on each search)."""
    if filters is None or isinstance(filters, str):
        return filters
    if isinstance(filters, Mapping):
        return dict(filters)
    raise MalformedFilterError(f"filters must be {accepted}, not "
                               f"{type(filters).__name__}; e.g. {{'year': {{'gte': 2010}}}} or "
                               "'year >= 2010'")


def check_deadline_ms(value: object) -> float | None:
    """``deadline_ms`` set on an adapter: None (the retriever's configured deadline) or a
    positive number of milliseconds (the engine checks the upper bound on each search)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value <= 0:
        raise InvalidQueryError(f"deadline_ms must be a positive number of milliseconds or "
                                f"None (the retriever's configured deadline), got {value!r}")
    return float(value)


def read_options(min_seq: object = None, deadline_ms: object = None) -> dict[str, Any]:
    """``min_seq`` (read-your-writes: see at least the write that returned this seq) and
    ``deadline_ms`` for the engine, only when set (backends without them keep the plain
    signature)."""
    options: dict[str, Any] = {}
    if min_seq is not None:
        options["min_seq"] = check_min_seq(min_seq)
    deadline = check_deadline_ms(deadline_ms)
    if deadline is not None:
        options["deadline_ms"] = deadline
    return options


def grouping_options(group_by: object, context: object, min_score: object = None
                     ) -> dict[str, Any]:
    """``group_by`` / ``context`` / ``min_score`` for the engine, only when set (backends
    without them keep the plain signature)."""
    options: dict[str, Any] = {}
    if min_score is not None:
        options["min_score"] = check_min_score(min_score)
    if group_by is not None:
        options["group_by"] = group_by
    if context:
        options["context"] = context
    return options


def passage(hit: Hit) -> str:
    """The text a framework hands to its model: the title (when there is one), then the body,
    or the hit's neighbouring passages when the search asked for context."""
    body = hit.context.text if hit.context is not None else hit.text
    return f"{hit.title}\n\n{body}" if hit.title else body


def hit_id(hit: Hit) -> str:
    """A framework object's id: the document id, ``id#position`` for a passage."""
    return hit.doc_id if hit.passage is None else f"{hit.doc_id}#{hit.passage}"


def passage_location(hit: Hit) -> dict[str, Any]:
    """Where a passage sits in its document (``PASSAGE_KEYS``); empty outside passage builds."""
    if hit.parent_id is None:
        return {}
    return {"parent_id": hit.parent_id, "passage": hit.passage, "start": hit.start,
            "end": hit.end}


def result_notes(result: SearchResult) -> dict[str, list[str]]:
    """The result's ``degraded`` and ``warnings`` that are not empty (``NOTE_KEYS``), for
    every hit's metadata. A result without hits has no document to carry its warnings (and a
    misspelt filter value is the usual reason it found nothing), so those are logged."""
    if not result.hits and result.warnings:
        log.warning("a search found nothing: %s", "; ".join(result.warnings))
    return {key: getattr(result, key) for key in NOTE_KEYS if getattr(result, key)}


def hit_metadata(hit: Hit, build_id: str, notes: Mapping[str, list[str]] | None = None
                 ) -> dict[str, Any]:
    """The document's own metadata plus the scores of every stage and the build it came from,
    in passage builds where the passage sits in its document, and the result's ``notes``
    (``result_notes``). A new dict per call, lists included: the caller may add to it, and
    the framework object it goes into owns it."""
    metadata = {**hit.metadata, "score": hit.score, "bm25_score": hit.bm25_score,
                "vector_score": hit.vector_score, "relevance": hit.relevance,
                "build_id": build_id}
    if hit.parent_id is not None:
        metadata.update(passage_location(hit))
    if notes:
        metadata.update({key: list(values) for key, values in notes.items()})
    return metadata
