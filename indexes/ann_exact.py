"""Exact dense search: the dense leg of tiny corpora and of builds made before the ANN index,
and the oracle the ANN indexes (``indexes.ann`` IVF, ``indexes.ann_hnsw``) are measured against.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from indexes.vectors import VectorStore

TARGET_RECALL = 0.98  # recall@100 against exact search every ANN setting must reach
# Allowed sets this small are searched exactly over the allowed rows (cheaper than probing).
EXACT_ALLOWED_BELOW = 4096


def exact_top(vectors: VectorStore, query: np.ndarray, k: int,
              rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` by inner product over ``rows`` (all rows when None); best first,
    ties by lower row. Returns (rows int64, scores float32)."""
    if rows is None:
        rows = np.arange(vectors.n_docs, dtype=np.int64)
    if rows.size == 0 or k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    scores = vectors.scores(query, rows)
    if scores.size > k:
        keep = np.argpartition(-scores, k - 1)[:k]
    else:
        keep = np.arange(scores.size)
    keep = keep[np.lexsort((rows[keep], -scores[keep]))]
    return rows[keep].astype(np.int64), scores[keep].astype(np.float32)


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / |truth| (rows; -1 padding ignored)."""
    hits = [len(set(f[f >= 0].tolist()) & set(t[t >= 0].tolist())) / max(1, int((t >= 0).sum()))
            for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits))


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
        rows = None if mask is None else np.flatnonzero(mask)
        return exact_top(self.vectors, query, k, rows)
