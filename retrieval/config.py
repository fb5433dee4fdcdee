"""Retriever configuration (pydantic; an unknown key is an error, not a silent default)."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from retrieval.cache import CacheConfig
from retrieval.features import FeatureStoreConfig
from retrieval.features.ranking import FeatureWeights
from retrieval.request_path.batching import BatchingConfig
from retrieval.request_path.feature_stage import RecencyWeight
from retrieval.strict import StrictConfig
from retrieval.tracing import TracingConfig


class Limits(StrictConfig):
    """Bounds that protect the process from oversized input; each breach is a typed error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_query_chars: int = Field(
        4096, ge=1, description="characters of one query text. The query encoder reads only "
        "the first tokens of its model's window (256 for all-MiniLM-L6-v2, about 1,000 "
        "characters of English): words past it count for BM25 alone, and the result's "
        "warnings say so")
    max_query_tokens: int = Field(1024, ge=1)
    max_k: int = Field(1000, ge=1)
    max_candidates: int = Field(10_000, ge=1)
    max_filter_clauses: int = Field(64, ge=1)
    max_in_values: int = Field(100_000, ge=1, description="values in one IN / NOT IN list "
                               "(access-control lists of ids); parsed and masked in linear time")
    max_batch_hits: int | None = Field(
        None, ge=1, description="queries x k of one search_batch (None: unbounded, for offline "
        "evaluation in-process; the HTTP service bounds it: server.max_batch_hits)")
    max_batch_candidates: int | None = Field(
        None, ge=1, description="queries x candidates of one search_batch (None: unbounded; "
        "the service: server.max_batch_candidates)")


# Settings that never change what a search returns: how it runs (threads, checksums, mmap,
# caches, tracing, reloading, admission), the default k (a key holds k), the encoder's
# location (a key holds the encoder's id) and the deadline (degraded results are not cached).
NOT_RANKING = frozenset({
    "default_k", "parallel_stages", "verify_checksums", "mmap", "encoder_backend",
    "distilled_encoder_path", "encoder_model_path", "cache", "batching", "tracing",
    "feature_snapshot_refresh_seconds", "reload_interval_seconds", "live_lag_seconds",
    "deadline_ms", "max_in_flight"})


class RetrieverConfig(StrictConfig):
    """How a loaded index is searched. Defaults come from the SciFact quality benchmark."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidates: int = Field(300, ge=1, description="BM25 candidates re-ranked by vectors (C)")
    fusion: Literal["minmax", "zscore", "rrf"] = Field(
        "zscore", description="score normalization before the weighted sum (minmax, zscore) "
        "or rank fusion (rrf); zscore chosen on SciFact train qrels (benchmarks/README.md)")
    candidate_policy: Literal["keyword", "guardrail", "union"] = Field(
        "union", description="keyword: BM25 candidates only (a query sharing no known term "
        "with the corpus finds nothing); guardrail: add the dense leg's top dense_candidates "
        "when BM25 finds fewer than guardrail_min_keyword candidates or its best score is below "
        "guardrail_min_bm25; union: always BM25 top-C plus dense top dense_candidates (chosen "
        "on SciFact train qrels, within the latency budget at 100k documents: "
        "benchmarks/README.md). Except with keyword, a search returns min(k, allowed) hits "
        "whenever its query vector is known")
    dense_candidates: int = Field(100, ge=1, description="rows the dense leg adds (C'); a "
                                  "search for more hits than this asks the dense leg for k")
    guardrail_min_keyword: int | None = Field(
        None, ge=1, description="guardrail: fewer BM25 candidates than this calls the dense "
        "leg; None = max(k, candidates // 10)")
    guardrail_unknown_terms: bool = Field(
        False, description="guardrail: a query word the corpus does not contain (a misspelling, "
        "vocabulary the corpus does not use) also calls the dense leg. Off by default: 206 of "
        "SciFact's 1,109 clean queries hold such a word; it raised SciFact's search-path p95 "
        "from 0.93 to 2.32 ms for no clean nDCG@10 gain (misspelled queries: 0.406 against "
        "0.391)")
    guardrail_min_bm25: float = Field(
        0.0, ge=0.0, description="guardrail: a best BM25 score below this calls the dense leg "
        "(0 = off: BM25 scales differ between corpora)")
    vector_weight: float = Field(0.6, ge=0.0, le=1.0,
                                 description="minmax/zscore: weight of the cosine")
    rrf_k: int = Field(60, ge=1)
    typo_tolerance: bool = Field(
        True, description="a query word whose term no document holds is searched as the "
        "closest corpus word within 1 edit (5+ letters) or 2 (9+), weighted typo_weight; "
        "results list them in corrections (builds made with typo_tolerance only)")
    typo_weight: float = Field(0.7, gt=0.0, le=1.0,
                               description="a corrected term's weight against an exact one")
    default_k: int = Field(10, ge=1)
    parallel_stages: bool | None = Field(
        None, description="encode the query while filter+BM25 run; None = auto: when the "
        "encoder runs a lone query on fewer threads than there are cores, or while other "
        "searches are in flight")
    verify_checksums: bool = True
    mmap: bool = True
    encoder_backend: Literal["torch", "onnx", "onnx-int8", "distilled"] = Field(
        "onnx-int8",
        description="query encoder backend; documents are encoded by the torch reference. "
        "onnx-int8 is ~5x faster than torch per query with SciFact nDCG@10 within 0.005; "
        "distilled is a static token table trained into MiniLM's space (`retrieval distill`), "
        "tens of times faster again, at a measured quality cost (docs/how-to/distilled.md)",
    )
    distilled_encoder_path: str | None = Field(
        None, description="distilled: a trained encoder's directory; None = the index root's "
        "own (ROOT/distilled, written by `retrieval distill ROOT`), else the shipped generic one")
    encoder_model_path: str | None = Field(
        None, description="sentence-transformers model directory; None = the packaged default"
    )
    limits: Limits = Field(default_factory=Limits)
    cache: CacheConfig = Field(default_factory=CacheConfig, description="memory by default")
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    feature_store: FeatureStoreConfig | None = Field(
        None, description="online store of nightly features (local directory or Redis URL)"
    )
    features: tuple[FeatureWeights, ...] = Field((), description="weighted views in ranking")
    recency: RecencyWeight | None = Field(None, description="request-time recency feature")
    feature_candidates: int = Field(100, ge=1, description="top fused candidates re-scored")
    feature_snapshot_refresh_seconds: float = Field(1.0, gt=0)
    reload_interval_seconds: float | None = Field(
        None, gt=0, description="poll CURRENT and hot-swap new builds; None = only reload()"
    )
    live_lag_seconds: float | None = Field(
        1.0, gt=0, le=60, description="writes to the index root's write-ahead log are "
        "searchable within this lag (a background thread also hot-swaps every build "
        "published under the root: compaction, gated publish, rollback); None = only at load "
        "and refresh()")
    deadline_ms: float | None = Field(
        None, gt=0, le=86_400_000, allow_inf_nan=False, description="default budget of a "
        "search, or of a whole search_batch call (at most a day); past it a search degrades "
        "(BM25-only ranking, cache/feature reads skipped) instead of waiting. None = no "
        "deadline")
    max_in_flight: int | None = Field(
        None, ge=1, description="searches served at once by this Retriever; one more gets "
        "OverloadedError at once instead of queueing. None = no bound")

    @model_validator(mode="after")
    def _candidates_within_limits(self) -> RetrieverConfig:
        if self.candidates > self.limits.max_candidates:
            raise ValueError(
                f"candidates={self.candidates} exceeds limits.max_candidates="
                f"{self.limits.max_candidates}; lower candidates or raise the limit"
            )
        return self

    def fingerprint(self) -> str:
        """Hash of every setting that may change a result (part of result-cache keys): all
        but those named in ``NOT_RANKING``, so a new setting is in it unless proven not to
        rank."""
        ranking = self.model_dump(mode="json", exclude=set(NOT_RANKING))
        return hashlib.sha256(json.dumps(ranking, sort_keys=True).encode()).hexdigest()[:16]
