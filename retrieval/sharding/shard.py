"""One shard's half of a sharded search: its candidates, and later the hits it owns.

A shard runs the same stage functions as the unsharded pipeline (``retrieval.pipeline``) over
its rows: the filter mask, BM25 top-C inside it, the cosines of those candidates; and, when the
candidate policy might call the dense leg, its dense top rows with their cosines and real BM25
scores. Rows leave the shard as global rows (the shard's first global row added).

The dense leg, sharded: whether the guardrail fires depends on the merged candidates, which a
shard does not see. But the guardrail's conditions are monotone: the merged BM25 count is at
least each shard's and the merged best score at least each shard's best, and every shard holds
the global vocabulary. So when the guardrail fires on the merged candidates it fires on every
shard's own candidates too: a shard that finds it would not fire locally may skip its dense
search, and the merge (``merge``) decides on the merged candidates, exactly as unsharded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit
from retrieval.pipeline import (
    bm25_candidates,
    filter_mask,
    has_unknown_term,
    make_hit,
    touched_scores,
    wants_dense,
)
from retrieval.request import SearchRequest

_NO_ROWS = np.empty(0, dtype=np.int64)


@dataclass
class ShardAnswer:
    """A shard's candidates in global rows; arrays aligned per row.

    ``rows`` int64 (m,) BM25 top-C best first, ``bm25`` float64 (m,), ``cosine`` float32 (m,);
    ``dense_*`` the shard's dense top rows (best first by ``dense_score``) with their cosines
    and BM25 scores, empty when the dense leg could not be needed.
    """

    shard: int
    rows: np.ndarray
    bm25: np.ndarray
    cosine: np.ndarray
    allowed: int
    unknown_term: bool = False
    dense_rows: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    dense_score: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    dense_cosine: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    dense_bm25: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))


@dataclass(frozen=True)
class HitRequest:
    """One final hit to hydrate: its global row and the scores the merge gave it."""

    row: int
    score: float
    bm25: float
    cosine: float


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

    def answer(self, request: SearchRequest, vector: np.ndarray,
               config: RetrieverConfig) -> ShardAnswer:
        """This shard's BM25 candidates under the filter, their cosines, and its dense rows
        when the policy might want them (see the module docstring)."""
        snapshot = self.snapshot
        mask, allowed = filter_mask(snapshot, request)
        rows, bm25 = bm25_candidates(snapshot, request, mask, config)
        answer = ShardAnswer(self.index, rows.astype(np.int64) + self.start, bm25,
                             snapshot.vectors.scores(vector, rows), allowed)
        if config.candidate_policy == "guardrail" and config.guardrail_unknown_terms:
            answer.unknown_term = has_unknown_term(snapshot, request.query)
        if wants_dense(config, request, bm25, snapshot):
            self._add_dense(answer, request, vector, mask, rows, bm25, config)
        return answer

    def _add_dense(self, answer: ShardAnswer, request: SearchRequest, vector: np.ndarray,
                   mask: np.ndarray | None, rows: np.ndarray, bm25: np.ndarray,
                   config: RetrieverConfig) -> None:
        dense_rows, dense_score = self.snapshot.dense.search(
            vector, max(config.dense_candidates, request.k), mask)
        # Real BM25 scores: from the candidates where present; else from the postings when
        # BM25 was cut at C (when it was not, every row holding a query term is a candidate).
        scores = np.zeros(dense_rows.size, dtype=np.float64)
        position = {int(r): i for i, r in enumerate(rows)}
        inside = np.array([int(r) in position for r in dense_rows], dtype=bool)
        scores[inside] = bm25[[position[int(r)] for r in dense_rows[inside]]]
        if rows.size >= request.candidates and (~inside).any():
            scores[~inside] = touched_scores(self.snapshot, request, dense_rows[~inside])
        answer.dense_rows = dense_rows.astype(np.int64) + self.start
        answer.dense_score = np.asarray(dense_score, dtype=np.float32)
        answer.dense_cosine = self.snapshot.vectors.scores(vector, dense_rows)
        answer.dense_bm25 = scores

    def hits(self, wanted: list[HitRequest]) -> list[Hit]:
        """Hydrate hits of this shard (global rows) from its doc store, in the given order."""
        return [make_hit(self.snapshot, item.row - self.start, item.score, item.bm25,
                         item.cosine, {}) for item in wanted]
