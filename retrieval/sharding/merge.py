"""The one merge of shard answers: global top-C, the candidate policy, fusion, top-k.

The merged candidates are laid out exactly as the unsharded pipeline lays out its own: BM25
top-C best first (ties to the lower global row, as ``BM25Index.top_candidates``), then the
dense leg's new rows in dense order (ties to the lower row, as ``indexes.ann.exact_top``). So
min-max / z-score normalization and fusion (``retrieval.pipeline.fuse``) run over the same
candidates in the same order, and the result equals the unsharded one.

Answers without cosines (``ShardQuery.rerank`` False) are re-ranked here, after the merge,
through ``LateScores``: only the merged candidates are scored, as unsharded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval.config import RetrieverConfig
from retrieval.fusion import top_k_order
from retrieval.pipeline import fuse, policy_wants_dense
from retrieval.sharding.shard import ShardAnswer, ShardQuery, find_rows
from retrieval.sharding.whole import best_first


class LateScores(Protocol):
    """Scores of merged candidates (global rows) computed after the merge."""

    def cosines(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray: ...

    def bm25_of(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray: ...


@dataclass
class Merged:
    """Every merged candidate (global rows, aligned arrays) and the top-k order into them."""

    rows: np.ndarray  # int64
    bm25: np.ndarray  # float64
    cosine: np.ndarray  # float32
    fused: np.ndarray
    order: np.ndarray  # positions of the top k, best first
    allowed: int

    @property
    def candidates(self) -> int:
        return int(self.rows.size)


def _concat(answers: Sequence[ShardAnswer], name: str) -> np.ndarray:
    parts = [getattr(a, name) for a in answers]
    return np.concatenate([p for p in parts if p is not None])


def merge_answers(answers: Sequence[ShardAnswer], query: ShardQuery, config: RetrieverConfig,
                  late: LateScores | None = None) -> Merged:
    """Merge the shards' answers; ``late`` scores them when they came without cosines."""
    request = query.request
    rows, bm25 = _concat(answers, "rows"), _concat(answers, "bm25")
    keep = best_first(rows, bm25, request.candidates)
    rows, bm25 = rows[keep], bm25[keep]
    cosine = None if late is not None else _concat(answers, "cosine")[keep]
    unknown = any(a.unknown_term for a in answers)
    if policy_wants_dense(config, request, bm25, lambda: unknown):
        rows, bm25, cosine = _with_dense(answers, query, config, (rows, bm25, cosine), late)
    if late is not None:
        cosine = late.cosines(query, rows)
    assert cosine is not None
    fused = fuse(bm25, cosine.astype(np.float32, copy=False), config)
    return Merged(rows, bm25, cosine, fused, top_k_order(fused, request.k),
                  sum(a.allowed for a in answers))


def _with_dense(answers: Sequence[ShardAnswer], query: ShardQuery, config: RetrieverConfig,
                merged: tuple[np.ndarray, np.ndarray, np.ndarray | None],
                late: LateScores | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The merged BM25 candidates plus the global dense top rows that are not among them."""
    rows, bm25, cosine = merged
    dense_rows = _concat(answers, "dense_rows")
    keep = best_first(dense_rows, _concat(answers, "dense_score"),
                      max(config.dense_candidates, query.request.k))
    new = keep[~find_rows(rows, dense_rows[keep])[0]]
    rows = np.concatenate([rows, dense_rows[new]])
    if late is None:
        assert cosine is not None
        return (rows, np.concatenate([bm25, _concat(answers, "dense_bm25")[new]]),
                np.concatenate([cosine, _concat(answers, "dense_cosine")[new]]))
    # As unsharded (``pipeline.add_dense``): when BM25 was cut at C a new row may still hold a
    # query term, so it is scored from the postings; else it holds none.
    extra = np.zeros(new.size, dtype=np.float64)
    if bm25.size >= query.request.candidates and new.size:
        extra = late.bm25_of(query, dense_rows[new])
    return rows, np.concatenate([bm25, extra]), None
