"""Exact dense search: the dense leg of tiny corpora and of builds made before the ANN index,
and the oracle the ANN indexes (``indexes.ann`` IVF, ``indexes.ann_hnsw``) are measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from indexes.topk import best_first
from indexes.vectors import VectorStore

TARGET_RECALL = 0.98  # recall@100 against exact search every ANN setting must reach
# Allowed sets this small are searched exactly over the allowed rows (cheaper than probing).
EXACT_ALLOWED_BELOW = 4096
# A mask allowing at least 1 row in this many is searched by scoring every row in place.
SCORE_ALL_FROM_SHARE = 4


def exact_top(vectors: VectorStore, query: np.ndarray, k: int,
              rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` by inner product over ``rows`` (all rows when None); best first,
    ties by lower row. Returns (rows int64, scores float32)."""
    if k <= 0 or vectors.n_docs == 0 or (rows is not None and rows.size == 0):
        return np.empty(0, np.int64), np.empty(0, np.float32)
    if rows is None:
        rows = np.arange(vectors.n_docs, dtype=np.int64)
        scores = vectors.scores_all(query)  # no gathered copy of every row
    else:
        scores = vectors.scores(query, rows)
    keep = best_first(rows, scores, k)
    return rows[keep].astype(np.int64), scores[keep].astype(np.float32)


# Scores this close to the k-th true one tie with it (float32 sums in another order).
TIE = 1e-5


def recall_at(found: np.ndarray, truth: np.ndarray,
              scores_of: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """Mean over queries of |found ∩ truth| / |truth| (rows; -1 padding ignored).

    ``scores_of`` (rows (q, k) -> their exact scores for each query) counts a found row that
    scores at least the k-th true score as found: among rows tied there (duplicate vectors)
    exact search keeps an arbitrary one, and counting the others as misses drove
    calibration to its widest setting (HNSW ef 4,096, 66x slower) on 2% duplicates."""
    if scores_of is None:
        hits = [len(set(f[f >= 0].tolist()) & set(t[t >= 0].tolist()))
                / max(1, int((t >= 0).sum())) for f, t in zip(found, truth, strict=True)]
        return float(np.mean(hits))
    found_scores, true_scores = scores_of(found), scores_of(truth)
    shares = []
    for rows, scores, true, best in zip(found, found_scores, truth, true_scores, strict=True):
        wanted = int((true >= 0).sum())
        if not wanted:
            shares.append(1.0)
            continue
        kth = float(best[true >= 0].min())
        shares.append(min(wanted, int((scores[rows >= 0] >= kth - TIE).sum())) / wanted)
    return float(np.mean(shares))


def gathered_scores(matrix: np.ndarray, queries: np.ndarray,
                    stored: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> Callable[[np.ndarray], np.ndarray]:
    """``recall_at``'s ``scores_of``: each query's inner products with its rows (-1: -inf),
    over the vectors as ``stored`` (an index's decoded 8-bit rows) when given."""
    def scores_of(rows: np.ndarray) -> np.ndarray:
        safe = np.where(rows >= 0, rows, 0)
        vectors = np.asarray(matrix[safe.ravel()], dtype=np.float32)
        if stored is not None:
            vectors = stored(vectors)
        scores = np.einsum("qkd,qd->qk", vectors.reshape(*rows.shape, -1),
                           np.asarray(queries, dtype=np.float32))
        scores[rows < 0] = -np.inf
        return scores
    return scores_of


def exact_top_masked(vectors: VectorStore, query: np.ndarray, k: int, mask: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``exact_top`` over the rows ``mask`` allows. A wide mask scores every row in place and
    drops the others (gathering a copy of most of the matrix costs more than scoring it)."""
    mask = np.asarray(mask, dtype=bool)
    allowed = int(np.count_nonzero(mask))
    if allowed * SCORE_ALL_FROM_SHARE < mask.size or allowed <= k:
        return exact_top(vectors, query, k, np.flatnonzero(mask))
    scores = vectors.scores_all(query)
    scores[~mask] = -np.inf  # more than k rows are allowed: none of these is kept
    keep = best_first(np.arange(scores.size), scores, k)
    return keep.astype(np.int64), scores[keep].astype(np.float32)


class ExactDense:
    """Exact dense search over the stored vectors (builds without an ANN index, tiny corpora)."""

    kind = "exact"

    def __init__(self, vectors: VectorStore) -> None:
        self.vectors = vectors

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def search(self, query: np.ndarray, k: int, mask: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` rows allowed by ``mask`` (None = all), best first: (rows, scores)."""
        if mask is None:
            return exact_top(self.vectors, query, k)
        return exact_top_masked(self.vectors, query, k, mask)


class WideningDense(ExactDense):
    """A faiss index searched with one search-breadth knob (IVF's nprobe, HNSW's ef).

    Filters stay exact: the mask goes to faiss as an ``IDSelectorBitmap``, so only allowed
    rows come back; when fewer than wanted do, the knob widens x4 up to ``last_breadth``, then
    the allowed rows are searched exactly. Small allowed sets are searched exactly at once.
    """

    index: Any

    def first_breadth(self, k: int) -> int:
        raise NotImplementedError

    def last_breadth(self) -> int:
        raise NotImplementedError

    def search_params(self, breadth: int) -> Any:
        raise NotImplementedError

    def search_once(self, query: np.ndarray, k: int, breadth: int, params: Any
                    ) -> tuple[np.ndarray, np.ndarray]:
        """One faiss search at ``breadth`` (``params`` made for it): (scores, rows) (1, k)."""
        return self.index.search(query.reshape(1, -1), k, params=params)  # type: ignore[no-any-return]

    def search(self, query: np.ndarray, k: int, mask: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        query = self.vectors.check_query(query)
        k = min(k, self.vectors.n_docs)  # faiss allocates its result arrays for k
        if mask is None:
            return self._probe(query, k, None, k)
        allowed = int(np.count_nonzero(mask))
        if allowed <= max(EXACT_ALLOWED_BELOW, 4 * k):
            return exact_top(self.vectors, query, k, np.flatnonzero(mask))
        return self._probe(query, k, mask, min(k, allowed))

    def _probe(self, query: np.ndarray, k: int, mask: np.ndarray | None, wanted: int
               ) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        breadth, last = self.first_breadth(k), self.last_breadth()
        bitmap = None if mask is None else np.packbits(mask, bitorder="little")
        while True:
            params = self.search_params(min(breadth, last))
            if bitmap is not None:  # kept alive by ``bitmap`` while faiss reads it
                params.sel = faiss.IDSelectorBitmap(self.vectors.n_docs, faiss.swig_ptr(bitmap))
            scores, rows = self.search_once(query, k, min(breadth, last), params)
            found = rows[0] >= 0
            if int(found.sum()) >= wanted:
                return rows[0][found].astype(np.int64), scores[0][found]
            if breadth >= last:
                return exact_top(self.vectors, query, k,
                                 None if mask is None else np.flatnonzero(mask))
            breadth *= 4
