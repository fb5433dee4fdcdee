"""What an adapter needs from the engine, and the hit → framework-object mapping they share.

Adapters depend on ``SearchBackend``, not on ``Retriever``: any object with the four search
methods (the in-process ``Retriever``, or a remote client with the same signatures) plugs in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from retrieval.errors import InvalidQueryError, MalformedFilterError
from retrieval.integrations.errors import NotASearchBackendError
from retrieval.models import Hit, SearchResult
from retrieval.relevance import check_min_score

FilterSpec = dict[str, Any] | str | None
# Keys the adapters add to a document's own metadata; they win over a same-named field.
SCORE_KEYS = ("score", "bm25_score", "vector_score", "relevance", "build_id")
# Keys locating a passage in its document (passage builds only).
PASSAGE_KEYS = ("parent_id", "passage", "start", "end")
_METHODS = ("search", "search_batch", "asearch", "asearch_batch")


@runtime_checkable
class SearchBackend(Protocol):
    """The public search API of ``Retriever``, as the adapters call it."""

    def search(self, query: str, filters: FilterSpec = None, k: int | None = None, *,
               candidates: int | None = None, **grouping: Any) -> SearchResult: ...

    def search_batch(self, queries: Sequence[str], filters: FilterSpec = None,
                     k: int | None = None, *, candidates: int | None = None,
                     **grouping: Any) -> list[SearchResult]: ...

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


def hit_metadata(hit: Hit, build_id: str) -> dict[str, Any]:
    """The document's own metadata plus the scores of every stage and the build it came from,
    and in passage builds where the passage sits in its document. A new dict per call: the
    caller may add to it, and the framework object it goes into owns it."""
    metadata = {**hit.metadata, "score": hit.score, "bm25_score": hit.bm25_score,
                "vector_score": hit.vector_score, "relevance": hit.relevance,
                "build_id": build_id}
    if hit.parent_id is not None:
        metadata.update(parent_id=hit.parent_id, passage=hit.passage, start=hit.start,
                        end=hit.end)
    return metadata
