"""One shard's half of a sharded search: its candidates, and later the hits it owns.

A shard runs the same stages as the unsharded pipeline (``retrieval.pipeline``) over its rows:
the filter mask, BM25 top-C inside it and, when the candidate policy might call the dense leg,
its dense top rows. Rows leave the shard as global rows (the shard's first global row added).
The query arrives analyzed once by the router (``ShardQuery.tokens``): every shard holds the
global vocabulary and the analyzer of the whole index (``indexes.sharding.slices``).

Re-ranking (the cosines of the candidates) is done where it is cheapest. In-process
(``ShardQuery.rerank`` False) the router scores only the merged global top-C after the merge:
S shards' top-C would cost S times the vector gathers. Over Ray (``rerank`` True) a shard
scores its own candidates in the same round trip, since another trip costs far more than the
gathers; it then also gives its dense rows their cosines and real BM25 scores.

The dense leg, sharded: whether the guardrail fires depends on the merged candidates, which a
shard does not see. But the guardrail's conditions are monotone: the merged BM25 count is at
least each shard's and the merged best score at least each shard's best, and every shard holds
the global vocabulary. So when the guardrail fires on the merged candidates it fires on every
shard's own candidates too: a shard that finds it would not fire locally may skip its dense
search, and the merge (``merge``) decides on the merged candidates, exactly as unsharded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit
from retrieval.pipeline import filter_mask, make_hit, policy_wants_dense
from retrieval.request import SearchRequest


@dataclass(frozen=True)
class ShardQuery:
    """One search as every shard receives it: validated, analyzed and embedded once."""

    request: SearchRequest
    tokens: Sequence[str]  # the query's BM25 terms (``pipeline.query_tokens``)
    vector: np.ndarray  # float32 (d,)
    rerank: bool = True  # the shard computes its candidates' cosines (see the module docstring)


@dataclass
class ShardAnswer:
    """A shard's candidates in global rows; arrays aligned per row.

    ``rows`` int64 (m,) BM25 top-C best first, ``bm25`` float64 (m,); ``dense_rows`` int64 and
    ``dense_score`` float32 the shard's dense top rows best first (None when the dense leg could
    not be needed). With ``ShardQuery.rerank``: ``cosine`` float32 (m,), and ``dense_cosine``,
    ``dense_bm25`` of the dense rows; else None (the router scores the merged candidates).
    """

    shard: int
    rows: np.ndarray
    bm25: np.ndarray
    allowed: int
    unknown_term: bool = False
    cosine: np.ndarray | None = None
    dense_rows: np.ndarray | None = None
    dense_score: np.ndarray | None = None
    dense_cosine: np.ndarray | None = None
    dense_bm25: np.ndarray | None = None


@dataclass(frozen=True)
class FinalHits:
    """Final hits to hydrate, best first: global rows int64 and the scores the merge gave them
    (final score, BM25 score, cosine), aligned."""

    rows: np.ndarray
    score: np.ndarray
    bm25: np.ndarray
    cosine: np.ndarray
    features: list[dict[str, float]] | None = None  # each hit's feature values, when ranked

    def take(self, positions: np.ndarray) -> FinalHits:
        features = self.features
        return FinalHits(self.rows[positions], self.score[positions], self.bm25[positions],
                         self.cosine[positions],
                         None if features is None else [features[i] for i in positions.tolist()])

    def items(self) -> Iterator[tuple[int, float, float, float, dict[str, float]]]:
        """(row, score, bm25, cosine, feature values) of each hit, as Python values."""
        features = self.features or [{} for _ in range(self.rows.size)]
        return zip(self.rows.tolist(), self.score.tolist(), self.bm25.tolist(),
                   self.cosine.tolist(), features, strict=True)


def find_rows(rows: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool (w,): each of ``wanted`` is among ``rows``; the positions in ``rows`` of those that
    are). A sorted lookup: ``np.isin`` costs several times more at these sizes."""
    if rows.size == 0:
        return np.zeros(wanted.size, dtype=bool), np.empty(0, dtype=np.int64)
    by_row = np.argsort(rows, kind="stable")
    at = np.minimum(np.searchsorted(rows[by_row], wanted), rows.size - 1)
    inside = rows[by_row[at]] == wanted
    return inside, by_row[at[inside]]


class Shard:
    """A loaded shard build and the global row where it starts."""

    def __init__(self, index: int, snapshot: LoadedBuild, start: int) -> None:
        self.index = index
        self.snapshot = snapshot
        self.start = start

    @property
    def name(self) -> str:
        return self.snapshot.path.name

    def warm_up(self) -> None:
        self.snapshot.bm25.top_candidates(["warmup"], 1)

    def answer(self, query: ShardQuery, config: RetrieverConfig) -> ShardAnswer:
        """This shard's BM25 candidates under the filter, and its dense rows when the policy
        might want them (see the module docstring)."""
        snapshot, request = self.snapshot, query.request
        mask, allowed = filter_mask(snapshot, request)
        rows, bm25 = snapshot.bm25.top_candidates(query.tokens, request.candidates, mask)
        answer = ShardAnswer(self.index, rows.astype(np.int64) + self.start, bm25, allowed)
        if config.candidate_policy == "guardrail" and config.guardrail_unknown_terms:
            vocab = snapshot.bm25.vocab  # the global vocabulary: the same answer on every shard
            answer.unknown_term = any(token not in vocab for token in query.tokens)
        if query.rerank:
            answer.cosine = snapshot.vectors.scores(query.vector, rows)
        if policy_wants_dense(config, request, bm25, lambda: answer.unknown_term):
            self._add_dense(answer, query, mask, rows, bm25, config)
        return answer

    def _add_dense(self, answer: ShardAnswer, query: ShardQuery, mask: np.ndarray | None,
                   rows: np.ndarray, bm25: np.ndarray, config: RetrieverConfig) -> None:
        request = query.request
        dense_rows, dense_score = self.snapshot.dense.search(
            query.vector, max(config.dense_candidates, request.k), mask)
        answer.dense_rows = dense_rows.astype(np.int64) + self.start
        answer.dense_score = np.asarray(dense_score, dtype=np.float32)
        if not query.rerank:
            return
        # Real BM25 scores: from the candidates where present; else from the postings when
        # BM25 was cut at C (when it was not, every row holding a query term is a candidate).
        inside, where = find_rows(rows, dense_rows)
        scores = np.zeros(dense_rows.size, dtype=np.float64)
        scores[inside] = bm25[where]
        if rows.size >= request.candidates and (~inside).any():
            scores[~inside] = self.bm25_of(query, dense_rows[~inside])
        answer.dense_cosine = self.snapshot.vectors.scores(query.vector, dense_rows)
        answer.dense_bm25 = scores

    def cosines(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray:
        """Cosines float32 of the query with this shard's ``rows`` (its own numbering)."""
        return self.snapshot.vectors.scores(query.vector, rows)

    def bm25_of(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray:
        """BM25 scores float64 of this shard's ``rows`` (0 where no query term occurs)."""
        return self.snapshot.bm25.score_rows(query.tokens, rows)

    def hits(self, final: FinalHits) -> list[Hit]:
        """Hydrate hits of this shard from its doc store, in the given order."""
        return [self.hit(*item) for item in final.items()]

    def hit(self, row: int, score: float, bm25: float, cosine: float,
            features: dict[str, float]) -> Hit:
        """The hit of global ``row`` of this shard with the scores the merge gave it."""
        return make_hit(self.snapshot, row - self.start, score, bm25, cosine, features)
