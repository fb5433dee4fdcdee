"""Request and result models of the public search API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

# hit/miss: looked up; off: no cache configured; provided: caller passed the query vector;
# skipped: not needed (the result itself came from the cache).
CacheStatus = Literal["hit", "miss", "off", "provided", "skipped"]


class PassageContext(BaseModel):
    """Neighbouring passages of a hit: ``text`` is ``parent text[start:end]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    start: int
    end: int
    first_passage: int
    last_passage: int


class Explanation(BaseModel):
    """Why a hit scored what it did (``search(..., explain=True)``): its score in each leg,
    its rank there among the candidates, how the legs were normalized and mixed, and what
    features added."""

    model_config = ConfigDict(extra="forbid")

    bm25: float = Field(description="the BM25 score (the sum of bm25_terms)")
    bm25_terms: dict[str, float] = Field(description="analyzed query term -> its BM25 part")
    bm25_rank: int = Field(description="rank by BM25 among the candidates re-ranked (1 = best)")
    vector: float = Field(description="cosine between the query and document vectors")
    vector_rank: int = Field(description="rank by cosine among the candidates re-ranked")
    candidates: int = Field(description="how many candidates were re-ranked and fused")
    fusion: str = Field(description="zscore, minmax or rrf (RetrieverConfig.fusion)")
    vector_weight: float = Field(description="the vector leg's weight in the mix")
    normalization: dict[str, float] = Field(
        description="what each leg was normalized with over the candidates: zscore: the "
        "means and standard deviations, then the mix's min and max (rescaled to [0, 1]); "
        "minmax: each leg's min and max; rrf: its k")
    fused: float = Field(description="the fused score, before features")
    features: float = Field(0.0, description="what feature weights added to the fused score")
    coverage: float = Field(0.0, description="the BM25 score as a share of the most any "
                            "document could score for these terms (the relevance score's "
                            "keyword evidence, with the cosine)")


class Hit(BaseModel):
    """One retrieved passage with the score of every stage that ranked it.

    Immutable: a hit is shared between the result that computed it and the cache's decoded
    results, so later hits of the same entry cost no JSON parsing. Its dicts (``metadata``,
    ``features``) are shared too and are not copied per caller (copying 10 hits' dicts took
    19 us against a whole 44 us SciFact cache hit): change a ``model_copy(deep=True)``,
    never the hit itself.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    doc_id: str
    score: float = Field(description="final score (fused, plus weighted features)")
    bm25_score: float = Field(description="raw BM25 score")
    vector_score: float = Field(description="cosine between query and document vectors")
    relevance: float | None = Field(
        None, description="estimated probability that the hit is relevant, comparable across "
        "queries (calibrated on judged queries: retrieval.relevance); threshold it with "
        "min_score. None when the build's model has no calibration or the search ran without "
        "its query vector")
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    features: dict[str, bool | int | float] = Field(
        default_factory=dict, description="feature values, typed as their view declares them "
        "(int64 -> int, bool -> bool, float32/float64 -> float)")
    feature_status: dict[str, Literal["present", "stale", "missing"]] = Field(
        default_factory=dict, description="per feature view: the document's values found "
        "('present'), found but older than the view's max age ('stale'), or not found "
        "('missing': the defaults, e.g. for a document written after the last "
        "materialization, or with the store unreachable)")
    # Passage builds: the hit is one passage of document ``parent_id`` (= ``doc_id``);
    # ``text`` is ``parent text[start:end]``. None in builds of one row per document.
    parent_id: str | None = Field(None, description="the passage's document (passage builds)")
    passage: int | None = Field(None, description="position of the passage in its document")
    start: int | None = Field(None, description="character offset of the passage in the "
                              "document's text (the title is not counted)")
    end: int | None = Field(None, description="end offset (exclusive) in the document's text")
    explanation: Explanation | None = Field(
        None, description="why it ranked there (search(..., explain=True) only)")
    context: PassageContext | None = Field(
        None, description="the neighbouring passages, when the search asked for context")


class CacheInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    result: CacheStatus = "off"
    embedding: CacheStatus = "off"


class SearchResult(BaseModel):
    """Hits plus everything needed to explain and reproduce them."""

    model_config = ConfigDict(extra="forbid")

    query: str
    hits: list[Hit]
    timings: dict[str, float] = Field(description="milliseconds per stage, and total")
    build_id: str
    feature_snapshot_id: str | None = Field(None, description="view=snapshot pairs read")
    features_available: bool | None = Field(
        None, description="False when the feature store was unreachable and defaults were used")
    candidates: int = Field(0, description="BM25 candidates that were re-ranked")
    allowed: int = Field(0, description="documents allowed by the filters")
    cache: CacheInfo = Field(default_factory=CacheInfo)
    warnings: list[str] = Field(
        default_factory=list, description="filter values no document holds, each with the "
        "closest value the index has (a misspelt value otherwise just returns no hits); a query "
        "longer than the query encoder's window (its words past it count for BM25 alone)")
    corrections: dict[str, str] = Field(
        default_factory=dict, description="query words no document holds, each with the index "
        "term it was searched as (typo tolerance)")
    query_encoder: str | None = Field(
        None, description="id of the encoder whose query vector ranked the hits (None: the "
        "caller gave the vector, or the embedding missed the deadline)")
    degraded: list[str] = Field(
        default_factory=list, description="stages skipped to meet the deadline: 'embed' "
        "(ranked by BM25 alone, vector_score 0), 'features' (no feature adjustment)")
    # Set on a cache entry's decoded result (``retrieval.result_json``): lets copies served
    # from it be written as JSON without serializing the hits again.
    _shared: Any = PrivateAttr(None)
