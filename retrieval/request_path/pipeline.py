"""The uncached request pipeline over one snapshot: filter, BM25 (+ dense leg), re-rank, fuse,
hydrate.

Candidates come from BM25 and, by ``candidate_policy``, from the dense leg (``indexes.ann``):
``guardrail`` adds the dense top ``dense_candidates`` when BM25 finds too few candidates (a
misspelled or paraphrased query), ``union`` always adds them. Dense-only candidates get their
real BM25 score: 0 when BM25 returned fewer than C rows (then every row sharing a query term is
already a candidate), else a binary search of each row in the query terms' postings.

The query embedding arrives as a ``PendingVector``: already known (cache hit, caller-supplied,
batch-encoded) or still being computed concurrently while filter and BM25 run. With the union
policy and the vector known, the dense leg is searched by the pool thread of a BM25 stage
shared by the cores, before it takes BM25's blocks (``dense_rows_early``): at 1M passages
the union search path took 1.44-1.46 / 2.14-2.21 ms p50 / p95 instead of 1.59-1.65 /
2.30-2.46. The "dense" stage is then only the wait for it and the merge.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from indexes.bm25 import Corrected
from indexes.docstore import Document
from indexes.errors import LimitExceededError
from indexes.fan_out import beside
from retrieval.config import RetrieverConfig
from retrieval.features.ranking import fused_score_range
from retrieval.filters import evaluate_counted
from retrieval.filters.named import combined_mask
from retrieval.loaded_build import LoadedBuild
from retrieval.models import CacheInfo, CacheStatus, Explanation, Hit, SearchResult
from retrieval.relevance import Calibration, coverage, keyword_bound
from retrieval.request_path.deadline import NO_DEADLINE, Deadline
from retrieval.request_path.explain import explain_hits
from retrieval.request_path.feature_stage import FeatureOutcome, FeatureStage
from retrieval.request_path.fusion import linear_fusion, rrf_fusion, top_k_order, zscore_fusion
from retrieval.request_path.grouping import Scored, group_candidates, passage_fields
from retrieval.request_path.timing import StageTimer
from retrieval.request_path.validate import SearchRequest


class PendingVector:
    """A query vector; ``get`` returns (vector, encode ms or None when not encoded here).

    ``get(timeout)`` returns ``(None, None)`` when the vector is not ready within ``timeout``
    seconds (the search then degrades to BM25 ranking). ``encoded_before``: encoded by the
    caller just before the pipeline, so the time since the last stage is the encode.
    """

    encoded_before = False

    def get(self, timeout: float | None = None
            ) -> tuple[np.ndarray | None, float | None]:  # pragma: no cover - interface
        raise NotImplementedError


class ReadyVector(PendingVector):
    def __init__(self, vector: np.ndarray, encode_ms: float | None = None) -> None:
        self._value = (vector, encode_ms)
        self.encoded_before = encode_ms is not None

    def get(self, timeout: float | None = None) -> tuple[np.ndarray | None, float | None]:
        return self._value


class FutureVector(PendingVector):
    """An embedding computed in another thread (a worker pool or the encode batcher)."""

    def __init__(self, future: Future[tuple[np.ndarray, float]]) -> None:
        self._future = future

    def get(self, timeout: float | None = None) -> tuple[np.ndarray | None, float | None]:
        try:
            vector, ms = self._future.result(timeout)
        except CancelledError:  # another search sharing the call gave up on it before it ran
            return None, None
        except FutureTimeout:
            if not self._future.done():
                self._future.cancel()  # this search moves on; an encode not started never runs
                return None, None
            return self._settled()
        return vector, ms

    def _settled(self) -> tuple[np.ndarray | None, float | None]:
        """The outcome of a call done after all when the wait ran out: its vector, set just
        then; its error raised again (the encoder's own TimeoutError, a remote model's); no
        vector when another search cancelled it meanwhile."""
        if self._future.cancelled():
            return None, None
        vector, ms = self._future.result(0)
        return vector, ms


def reachable(rows: np.ndarray, bm25: np.ndarray, cosine: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates a shard answered for: a remote shard left out with ``allow_partial``
    scores its rows NaN (a live snapshot's own keyword leg found them; nothing can rank or
    fetch them now), and the result says ``partial:<shard>``."""
    lost = np.isnan(cosine) | np.isnan(bm25)
    if not lost.any():
        return rows, bm25, cosine
    return rows[~lost], bm25[~lost], cosine[~lost]


def timed_encode(encode: Callable[[list[str]], np.ndarray], text: str) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    vectors = encode([text])
    return vectors[0], (time.perf_counter() - started) * 1e3


def run_pipeline(
    snapshot: LoadedBuild, request: SearchRequest, pending: PendingVector, timer: StageTimer,
    config: RetrieverConfig, embed_status: CacheStatus | None = None,
    features: FeatureStage | None = None, deadline: Deadline = NO_DEADLINE,
    relevance: Calibration | None = None, encoder_id: str | None = None,
) -> tuple[SearchResult, np.ndarray | None]:
    """Search one validated request; returns the result and the query vector it used (None
    when the embedding missed the deadline and the result is ranked by BM25 alone).
    ``relevance``: the calibration that gives every hit its ``relevance`` (None: no score);
    ``encoder_id``: the encoder that embeds (or embedded, for a cached vector) the query."""
    snapshot.begin_search()
    if pending.encoded_before:
        timer.lap("embed")
    mask, allowed = filter_mask(snapshot, request)
    timer.lap("filter")
    terms = keyword_terms(snapshot, request.query, config)
    with beside(dense_rows_early(snapshot, request, pending, mask, config)) as early:
        rows, bm25 = snapshot.bm25.top_candidates(terms.tokens, request.candidates, mask)
    timer.lap("bm25")
    query_vector, embed_ms = pending.get(deadline.remaining())
    timer.lap("embed_wait")  # how long the caller waited for the encoder after BM25 finished
    degraded: list[str] = []
    if query_vector is None:
        degraded.append("embed")
        cosine = np.zeros(rows.size, dtype=np.float32)
        fused = linear_fusion(bm25, cosine, 0.0)  # BM25 alone, min-max normalized
    else:
        if embed_ms is not None and not pending.encoded_before:
            timer.record("embed", embed_ms)
        if wants_dense(config, request, bm25, snapshot):
            rows, bm25 = add_dense(snapshot, request, terms.tokens, query_vector, mask, rows,
                                   bm25, config, early.result())
            timer.lap("dense")
        cosine = snapshot.vectors.scores(query_vector, rows)
        rows, bm25, cosine = reachable(rows, bm25, cosine)
        timer.lap("rerank")
        fused = fuse(bm25, cosine, config)
    (rows, bm25, cosine, fused), scored, kept = group_candidates(
        snapshot, request, (rows, bm25, cosine, fused),
        lambda n: widened(snapshot, request, terms.tokens, query_vector, mask, rows, bm25, n,
                          config))
    reranked = int(scored[0].size)  # widened for grouping: what fusion normalized over
    order = top_k_order(fused, request.k)
    timer.lap("fuse")
    outcome = None
    if features is not None and deadline.expired():
        degraded.append("features")
    elif features is not None:
        order, fused, outcome = apply_features(snapshot, rows, fused, request.k, config, features)
        timer.lap("features")
    per_hit = outcome.per_hit if outcome is not None else [{}] * len(order)
    found_as = outcome.status if outcome is not None and outcome.status else [{}] * len(order)
    documents = snapshot.docs.get_many(rows[order])  # one call per shard on remote layouts
    covered = coverage(bm25[order], keyword_bound(terms.tokens, snapshot.bm25)) \
        if relevance is not None or request.explain else None
    scores: list[float | None] = [None] * len(order)
    if relevance is not None and query_vector is not None and covered is not None:
        scores = relevance.score(cosine[order], covered, np.arange(1, order.size + 1)).tolist()
    whys: list[Explanation | None] = [None] * len(order)
    if request.explain:
        fused_as = config if query_vector is not None else \
            config.model_copy(update={"fusion": "minmax", "vector_weight": 0.0})
        whys = list(explain_hits(snapshot, terms.tokens, *ungrouped(scored, kept, fused, order),
                                 outcome.adjustment if outcome is not None else None,
                                 fused_as, covered))
    hits = [make_hit(snapshot, int(rows[i]), doc, fused[i], bm25[i], cosine[i], values,
                     request.context, why, score, found)
            for i, doc, values, why, score, found in zip(order, documents, per_hit, whys,
                                                         scores, found_as, strict=True)
            if doc is not None]  # on a remote shard lost since ranking (allow_partial)
    timer.lap("hydrate")
    degraded.extend(snapshot.degradations())
    # A vector from the cache or a batch's one encoder call comes with its status; without
    # one, a vector that took no encode time was the caller's.
    provided = embed_status == "provided" if embed_status is not None else \
        embed_ms is None and query_vector is not None
    status: Any = embed_status or ("provided" if provided else "miss")
    result = SearchResult(
        query=request.query, hits=hits, timings=timer.finish(), build_id=snapshot.build_id,
        candidates=reranked, allowed=allowed, cache=CacheInfo(embedding=status),
        feature_snapshot_id=outcome.snapshot_id if outcome else None,
        features_available=outcome.available if outcome else None, degraded=degraded,
        warnings=list(request.warnings), corrections=terms.corrections,
        query_encoder=encoder_id if query_vector is not None and not provided else None,
    )
    return result, query_vector


def ungrouped(scored: Scored, kept: np.ndarray | None, final: np.ndarray, order: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, bm25, cosine, final scores, the hits' positions) over every candidate fusion
    normalized, from the grouped ones the hits index: explanations rank among those."""
    rows, bm25, cosine, fused = scored
    if kept is None:
        return rows, bm25, cosine, final, order
    every = fused.copy()
    every[kept] = final
    return rows, bm25, cosine, every, kept[order]


def apply_features(
    snapshot: LoadedBuild, rows: np.ndarray, fused: np.ndarray, k: int,
    config: RetrieverConfig, features: FeatureStage,
) -> tuple[np.ndarray, np.ndarray, FeatureOutcome]:
    """Re-score the top ``feature_candidates`` fused candidates with features; new top-k.

    Returns (order into rows, final scores aligned with rows, per-hit outcome of the top-k).
    """
    top = top_k_order(fused, max(config.feature_candidates, k))
    outcome = features.apply(snapshot, rows[top])
    # A weight is a share of the fused scores' range, whatever the fusion (RRF's spans a few
    # thousandths): scaled here, where the fused scores are known.
    adjustment = outcome.adjustment * fused_score_range(fused)
    final = fused.copy()
    final[top] += adjustment
    best = top_k_order(final[top], k)
    per_hit = [outcome.per_hit[i] for i in best]
    status = [outcome.status[i] for i in best] if outcome.status is not None else None
    return top[best], final, FeatureOutcome(adjustment[best], per_hit,
                                            outcome.snapshot_id, outcome.available, status)


def filter_mask(snapshot: LoadedBuild, request: SearchRequest) -> tuple[np.ndarray | None, int]:
    """Boolean mask of allowed rows (None = all) and the allowed count."""
    if request.named is not None:
        return combined_mask(request.named, request.filter, snapshot.metadata)
    if request.filter is None:
        return None, snapshot.manifest.n_docs
    return evaluate_counted(request.filter, snapshot.metadata)


@dataclass(frozen=True)
class KeywordTerms:
    """A query's BM25 terms, typos corrected, and what was corrected (word -> term)."""

    tokens: list[str]
    corrections: dict[str, str]


def keyword_terms(snapshot: LoadedBuild, query: str, config: RetrieverConfig) -> KeywordTerms:
    """The query's BM25 terms, at most ``limits.max_query_tokens`` of them. With
    ``typo_tolerance`` a word whose term no row holds is searched as the closest corpus
    word's term (``indexes.typos``), weighted ``typo_weight``; known terms never change."""
    words = snapshot.analyzer.words(query)
    limit = config.limits.max_query_tokens
    if len(words) > limit:
        raise LimitExceededError(f"query has {len(words)} terms, more than the limit {limit}; "
                                 "shorten it or raise limits.max_query_tokens")
    stems = snapshot.analyzer.stem(words)
    typos, vocab = snapshot.bm25.typos, snapshot.bm25.vocab
    if not config.typo_tolerance or typos is None:
        return KeywordTerms(stems, {})
    tokens: list[str] = []
    corrections: dict[str, str] = {}
    for word, stem in zip(words, stems, strict=True):
        fix = None if stem in vocab else typos.closest(word, snapshot.bm25.doc_freq)
        if fix is None or fix not in vocab:  # live deletes may have emptied its term
            tokens.append(stem)
            continue
        tokens.append(Corrected(fix, config.typo_weight))
        corrections[word] = fix
    return KeywordTerms(tokens, corrections)


def wants_dense(config: RetrieverConfig, request: SearchRequest, bm25: np.ndarray,
                snapshot: LoadedBuild) -> bool:
    """Whether the dense leg adds candidates to these BM25 ones (the candidate policy)."""
    return policy_wants_dense(config, request, bm25,
                              lambda: has_unknown_term(snapshot, request.query))


def policy_wants_dense(config: RetrieverConfig, request: SearchRequest, bm25: np.ndarray,
                       unknown_term: Callable[[], bool]) -> bool:
    """``wants_dense`` over BM25 scores (best first) from anywhere, e.g. merged shards."""
    if config.candidate_policy == "keyword":
        return False
    if config.candidate_policy == "union":
        return True
    floor = config.guardrail_min_keyword or max(request.k, request.candidates // 10)
    weak = bm25.size == 0 or float(bm25[0]) < config.guardrail_min_bm25
    return bm25.size < floor or weak or (config.guardrail_unknown_terms and unknown_term())


def has_unknown_term(snapshot: LoadedBuild, query: str) -> bool:
    """A query term no document contains: BM25 cannot match what the user meant by it."""
    vocab = snapshot.bm25.vocab
    return any(token not in vocab for token in snapshot.analyzer(query))


def dense_rows_early(snapshot: LoadedBuild, request: SearchRequest, pending: PendingVector,
                     mask: np.ndarray | None, config: RetrieverConfig
                     ) -> Callable[[], np.ndarray] | None:
    """The dense leg's search as a stage that may run beside BM25 (``indexes.fan_out.
    beside``): with the union policy the dense leg is searched whatever BM25 finds, so when
    the query vector is already at hand (given, cached or encoded before), a BM25 stage
    shared by the cores hands it to the pool thread, which searches it while the caller
    takes BM25's blocks, then takes what blocks are left. None otherwise: ``add_dense``
    then searches it after BM25, as the other policies do."""
    if config.candidate_policy != "union" or not isinstance(pending, ReadyVector):
        return None
    vector = pending.get()[0]
    assert vector is not None
    k = max(config.dense_candidates, request.k)
    return lambda: snapshot.dense.search(vector, k, mask)[0]


def add_dense(
    snapshot: LoadedBuild, request: SearchRequest, tokens: list[str], query_vector: np.ndarray,
    mask: np.ndarray | None, rows: np.ndarray, bm25: np.ndarray, config: RetrieverConfig,
    dense_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BM25 candidates plus the dense leg's top rows within ``mask`` (``dense_rows`` when
    already searched for this request), with their BM25 scores.

    Asks for at least k dense rows, so a search returns min(k, allowed) hits.
    """
    if dense_rows is None:
        dense_rows, _ = snapshot.dense.search(
            query_vector, max(config.dense_candidates, request.k), mask)
    known = np.sort(rows)  # a sorted lookup: np.isin costs ~10x more at these sizes
    at = np.minimum(np.searchsorted(known, dense_rows), max(known.size - 1, 0))
    new = dense_rows[known[at] != dense_rows] if known.size else dense_rows
    if new.size == 0:
        return rows, bm25
    new_scores = np.zeros(new.size, dtype=np.float64)
    if rows.size >= request.candidates:  # BM25 was cut at C: a new row may still match a term
        new_scores = snapshot.bm25.score_rows(tokens, new)
    return (np.concatenate([rows.astype(np.int64), new]),
            np.concatenate([np.asarray(bm25, dtype=np.float64), new_scores]))


def widened(
    snapshot: LoadedBuild, request: SearchRequest, tokens: list[str],
    query_vector: np.ndarray | None,
    mask: np.ndarray | None, rows: np.ndarray, bm25: np.ndarray, n: int,
    config: RetrieverConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidates plus the dense top ``n`` rows, re-ranked and re-fused (grouping by document
    needs more rows when its candidates span fewer than k documents). Without the dense leg
    (keyword policy, or no query vector in time) BM25's top ``n`` instead."""
    if query_vector is None or config.candidate_policy == "keyword":
        rows, bm25 = snapshot.bm25.top_candidates(tokens, max(n, request.candidates), mask)
        if query_vector is None:
            cosine = np.zeros(rows.size, dtype=np.float32)
            return rows, bm25, cosine, linear_fusion(bm25, cosine, 0.0)
    else:
        rows, bm25 = add_dense(snapshot, replace(request, k=n), tokens, query_vector, mask, rows,
                               bm25, config)
    cosine = snapshot.vectors.scores(query_vector, rows)
    return rows, bm25, cosine, fuse(bm25, cosine, config)


def fuse(bm25: np.ndarray, cosine: np.ndarray, config: RetrieverConfig) -> np.ndarray:
    if config.fusion == "rrf":
        return rrf_fusion(bm25, cosine, config.rrf_k)
    if config.fusion == "zscore":
        return zscore_fusion(bm25, cosine, config.vector_weight)
    return linear_fusion(bm25, cosine, config.vector_weight)


def make_hit(snapshot: LoadedBuild, row: int, doc: Document, score: float, bm25: float,
             cosine: float, features: dict[str, float], context: int = 0,
             explanation: Explanation | None = None, relevance: float | None = None,
             feature_status: dict[str, Any] | None = None) -> Hit:
    return Hit(doc_id=doc.id, score=float(score), bm25_score=float(bm25),
               vector_score=float(cosine), relevance=relevance, title=doc.title, text=doc.text,
               metadata=doc.metadata, features=features, feature_status=feature_status or {},
               explanation=explanation,
               **passage_fields(snapshot, row, context))
