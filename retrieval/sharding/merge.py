"""The one merge of shard answers: global top-C, the candidate policy, fusion, top-k.

The merged candidates are laid out exactly as the unsharded pipeline lays out its own: BM25
top-C best first (ties to the lower global row, as ``BM25Index.top_candidates``), then the
dense leg's new rows in dense order (ties to the lower row, as ``indexes.ann.exact_top``). So
min-max / z-score normalization and fusion (``retrieval.pipeline.fuse``) run over the same
candidates in the same order, and the result equals the unsharded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.config import RetrieverConfig
from retrieval.fusion import top_k_order
from retrieval.pipeline import fuse, policy_wants_dense
from retrieval.request import SearchRequest
from retrieval.sharding.shard import HitRequest, ShardAnswer


@dataclass
class Merged:
    """The merged candidates (global rows) and the final top-k as hit requests per shard."""

    candidates: int
    allowed: int
    top: list[tuple[int, HitRequest]]  # (shard index, hit) best first


def best_first(rows: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` best scores, best first, ties to the lower row."""
    return np.lexsort((rows, -np.asarray(scores, dtype=np.float64)))[:n]


def _concat(answers: Sequence[ShardAnswer], name: str) -> np.ndarray:
    return np.concatenate([getattr(a, name) for a in answers])


def merge_answers(answers: Sequence[ShardAnswer], request: SearchRequest,
                  config: RetrieverConfig, starts: Sequence[int]) -> Merged:
    """Merge the answers of the shards that start at global rows ``starts`` (sorted)."""
    rows, bm25, cosine = (_concat(answers, n) for n in ("rows", "bm25", "cosine"))
    keep = best_first(rows, bm25, request.candidates)
    rows, bm25, cosine = rows[keep], bm25[keep], cosine[keep]
    unknown = any(a.unknown_term for a in answers)
    if policy_wants_dense(config, request, bm25, lambda: unknown):
        rows, bm25, cosine = _with_dense(answers, request, config, rows, bm25, cosine)
    fused = fuse(bm25, cosine.astype(np.float32), config)
    order = top_k_order(fused, request.k)
    owners = np.searchsorted(np.asarray(starts), rows[order], side="right") - 1
    top = [(int(shard), HitRequest(int(rows[i]), float(fused[i]), float(bm25[i]),
                                   float(cosine[i])))
           for i, shard in zip(order, owners, strict=True)]
    return Merged(int(rows.size), sum(a.allowed for a in answers), top)


def _with_dense(answers: Sequence[ShardAnswer], request: SearchRequest,
                config: RetrieverConfig, rows: np.ndarray, bm25: np.ndarray,
                cosine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The merged BM25 candidates plus the global dense top rows that are not among them."""
    dense_rows = _concat(answers, "dense_rows")
    keep = best_first(dense_rows, _concat(answers, "dense_score"),
                      max(config.dense_candidates, request.k))
    dense_rows = dense_rows[keep]
    new = ~np.isin(dense_rows, rows)
    return (np.concatenate([rows, dense_rows[new]]),
            np.concatenate([bm25, _concat(answers, "dense_bm25")[keep][new]]),
            np.concatenate([cosine, _concat(answers, "dense_cosine")[keep][new]]))
