"""Request and response bodies of the HTTP API (results are the library's own models)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from retrieval.models import SearchResult

Filters = dict[str, Any] | str | None
GROUP_BY_HELP = ('"document": at most one hit per document (its best passage) and k counts '
                 'documents; passage builds only change anything')
CONTEXT_HELP = "neighbouring passages returned around each hit (passage builds), 0 to 5"
FILTERS_HELP = ('a filter object ({"year": {"gte": 2010}}) or the DSL '
                '("year >= 2010 AND department = \\"cardiology\\""); {"$named": "name"} '
                'refers to a filter registered in the service\'s Retriever (ANDed with any '
                'other keys of the object)')


class SearchBody(BaseModel):
    """``POST /v1/search``: the arguments of ``Retriever.search``. Types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str
    filters: Filters = Field(None, description=FILTERS_HELP)
    k: int | None = Field(None, description="hits to return (default: the server's default_k)")
    candidates: int | None = Field(None, description="BM25 candidates to re-rank")
    deadline_ms: float | None = Field(
        None, description="budget for this search in ms (default: the server's deadline_ms); "
                          "past it the search degrades (e.g. BM25 only) and says so in degraded")
    group_by: str | None = Field(None, description=GROUP_BY_HELP)
    context: int | None = Field(None, description=CONTEXT_HELP)


class BatchBody(BaseModel):
    """``POST /v1/search/batch``: ``Retriever.search_batch`` (same filters for every query)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[str]
    filters: Filters = Field(None, description=FILTERS_HELP)
    k: int | None = None
    candidates: int | None = None
    group_by: str | None = Field(None, description=GROUP_BY_HELP)
    context: int | None = Field(None, description=CONTEXT_HELP)


class BatchResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    results: list[SearchResult]


class IndexInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    build_id: str
    documents: int
    created_at: str
    encoder: dict[str, Any]
    metadata_fields: dict[str, str] = Field(description="field name -> kind")


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="error class name, e.g. LimitExceededError")
    message: str


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str
    build_id: str | None = None
    detail: str | None = Field(None, description="why a ready worker is degraded (serving the "
                               "last good build while the live one fails to load)")
