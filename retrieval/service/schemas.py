"""Request and response bodies of the HTTP API (results are the library's own models)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from retrieval.models import SearchResult

Filters = dict[str, Any] | str | None
# A list's validation stops at its first wrong item: {"queries": [1, 1, ...]} of 1 MiB made
# 500,000 errors, seconds of work on the event loop for a message that names ten.
FAIL_FAST = Field(fail_fast=True)
Texts = Annotated[list[str], FAIL_FAST]
Vector = Annotated[list[float], FAIL_FAST]
GROUP_BY_HELP = ('"document": at most one hit per document (its best passage) and k counts '
                 'documents; passage builds only change anything')
CONTEXT_HELP = "neighbouring passages returned around each hit (passage builds), 0 to 5"
EXPLAIN_HELP = ("every hit carries an explanation: BM25 score by query term, cosine, its rank "
                "in each leg, the fusion's normalization, the features' part")
MIN_SCORE_HELP = ("keep only hits whose relevance (the calibrated probability that a hit is "
                  "relevant, comparable across queries) is at least this, from 0 to 1")
MIN_SEQ_HELP = ("see at least the writes up to this sequence number (the seq a write "
                "returned): read-your-writes on any worker")
REQUEST_ID_HELP = ("a client id for this write: a retry with the same id and body is answered "
                   "with the first seq and logged once; the same id with another body is 409")
DEADLINE_HELP = ("budget for this search in ms (default: the server's deadline_ms); past it "
                 "the search degrades (e.g. BM25 only) and says so in degraded")
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
    deadline_ms: float | None = Field(None, description=DEADLINE_HELP)
    group_by: str | None = Field(None, description=GROUP_BY_HELP)
    context: int | None = Field(None, description=CONTEXT_HELP)
    min_seq: int | None = Field(None, ge=0, description=MIN_SEQ_HELP)
    explain: bool = Field(False, description=EXPLAIN_HELP)
    min_score: float | None = Field(None, description=MIN_SCORE_HELP)


class BatchBody(BaseModel):
    """``POST /v1/search/batch``: ``Retriever.search_batch`` (same filters for every query)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: Texts
    filters: Filters = Field(None, description=FILTERS_HELP)
    k: int | None = None
    candidates: int | None = None
    deadline_ms: float | None = Field(
        None, description=DEADLINE_HELP + "; one budget for the whole batch, each query "
                                          "degrading past it on its own")
    group_by: str | None = Field(None, description=GROUP_BY_HELP)
    context: int | None = Field(None, description=CONTEXT_HELP)
    min_seq: int | None = Field(None, ge=0, description=MIN_SEQ_HELP)
    explain: bool = Field(False, description=EXPLAIN_HELP)
    min_score: float | None = Field(None, description=MIN_SCORE_HELP)


class WriteDocument(BaseModel):
    """One document of an upsert: ``IndexWriter.upsert``'s dict form, plus its vector."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    vector: Vector | str | None = Field(
        None, description="its embedding from the index's encoder, as numbers or as a base64 "
        "string of its little-endian float32 bytes (8x smaller and faster to parse, as "
        "OpenAI's encoding_format=base64); all documents of a request or none, whole-document "
        "builds only; without one the server embeds the text")


class UpsertBody(BaseModel):
    """``POST /v1/documents``: add or replace documents by id (one log record)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    documents: Annotated[list[WriteDocument], FAIL_FAST]
    request_id: str | None = Field(None, description=REQUEST_ID_HELP)


class DeleteBody(BaseModel):
    """``POST /v1/documents/delete``: delete documents by id (absent ids are no-ops)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: Texts
    request_id: str | None = Field(None, description=REQUEST_ID_HELP)


class WriteAck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(description="the write's log sequence number: pass it as min_seq to see it")
    replayed: bool = Field(description="a retry of an earlier write with this request_id: "
                           "answered with that write's seq, nothing logged again")


class FetchBody(BaseModel):
    """``POST /v1/documents/get``: documents by id, as the index serves them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: Texts
    min_seq: int | None = Field(None, ge=0, description=MIN_SEQ_HELP)


class StoredDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    text: str
    title: str
    metadata: dict[str, Any]


class FetchResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[StoredDocument] = Field(description="the ids found, in the order asked")
    missing: list[str] = Field(description="ids no document has")
    applied_seq: int = Field(description="the last write this worker serves")


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
    details: dict[str, str | int | float | bool] | None = Field(
        None, description="the attributes the error is rebuilt with, where it has any (e.g. "
        "the field of an UnknownFieldError)")


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str
    build_id: str | None = None
    detail: str | None = Field(None, description="why a ready worker is degraded (serving the "
                               "last good build while the live one fails to load)")
