"""Score fusion of BM25 and vector scores over one candidate set (pure numpy functions).

Raw BM25 scores and cosines live on different scales, so they are never added directly: either
min-max normalize both over the candidates and mix linearly, or fuse ranks (RRF).
"""

from __future__ import annotations

import math

import numpy as np


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] over the given candidates; all-equal scores map to 1."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    low, high = scores.min(), scores.max()
    if high - low <= 0:
        return np.ones_like(scores)
    return (scores - low) / (high - low)


def zscore(scores: np.ndarray) -> np.ndarray:
    """Standardize over the given candidates; all-equal scores map to 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    # A sum and a dot instead of mean() and std(): numpy's general reductions cost more than
    # the arithmetic on a few hundred candidates (zscore fusion of 400 took 28 µs, now 12).
    centred = scores - scores.sum() / scores.size
    spread = math.sqrt(float(centred @ centred) / scores.size)
    if spread <= 0:
        return np.zeros_like(scores)
    return centred / spread


def zscore_fusion(bm25: np.ndarray, cosine: np.ndarray, vector_weight: float) -> np.ndarray:
    """``minmax(w * z(cosine) + (1 - w) * z(bm25))``: less sensitive than min-max to one
    outlying top BM25 score. The mix is rescaled to [0, 1] (order unchanged) so fused scores
    keep min-max fusion's scale, which feature weights are added on."""
    return minmax(vector_weight * zscore(cosine) + (1.0 - vector_weight) * zscore(bm25))


def linear_fusion(bm25: np.ndarray, cosine: np.ndarray, vector_weight: float) -> np.ndarray:
    """``w * minmax(cosine) + (1 - w) * minmax(bm25)``; arrays aligned per candidate."""
    return vector_weight * minmax(cosine) + (1.0 - vector_weight) * minmax(bm25)


def ranks_desc(scores: np.ndarray) -> np.ndarray:
    """1-based rank of each score, highest first (ties broken by position)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    ranks = np.empty(order.size, dtype=np.float64)
    ranks[order] = np.arange(1, order.size + 1)
    return ranks


def rrf_fusion(bm25: np.ndarray, cosine: np.ndarray, k: int = 60) -> np.ndarray:
    """Reciprocal rank fusion: ``1/(k + rank_bm25) + 1/(k + rank_cosine)``."""
    return 1.0 / (k + ranks_desc(bm25)) + 1.0 / (k + ranks_desc(cosine))


def top_k_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first, ties by lower index."""
    if scores.size > k:
        keep = np.argpartition(-scores, k - 1)[:k]
    else:
        keep = np.arange(scores.size)
    return keep[np.lexsort((keep, -scores[keep]))]
