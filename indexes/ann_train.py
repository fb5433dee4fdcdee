"""Training the IVF dense leg's lists in two levels, and the exact neighbours its
calibration measures recall against.

Flat k-means over ``nlist`` centroids costs ``points x nlist x d`` a round: at 1M vectors
(4,000 lists, 160,000 sampled points, faiss' 25 rounds) it was the largest stage of a build.
Here ``sqrt(nlist)`` coarse centroids are trained first and each coarse cell's points are
clustered into its share of the lists, ``points x 2 sqrt(nlist) x d`` a round.

Every vector is then added to its nearest list exactly (``indexes.ann_assign``).
Assigning through the coarse cells instead was measured and dropped: on clustered vectors only
87% of the vectors' nearest lists lay under their nearest coarse cell, 98% under the nearest
9, and the misplaced neighbours capped recall@100 at 0.974 whatever ``nprobe``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

# k-means rounds per level: at 111k clustered vectors 10 rounds (flat or in two levels)
# calibrated to the same nprobe as faiss' default 25; at 1M the two-level lists calibrated to
# nprobe 4, faiss' flat 25-round ones to 8 (benchmarks/README.md).
KMEANS_ROUNDS = 10
BLOCK = 65_536  # vectors scored at once (bounds the score matrix's memory)


def train_two_level(sample: np.ndarray, nlist: int, seed: int) -> np.ndarray:
    """``nlist`` centroids (float32, fewer when ``sample`` has fewer points) of ``sample``
    float32 (m, d): sqrt(nlist) coarse cells, each cell's points clustered into a share of
    the lists proportional to its size."""
    import faiss

    dim = sample.shape[1]
    n_coarse = max(1, int(np.sqrt(nlist)))
    coarse = faiss.Kmeans(dim, n_coarse, niter=KMEANS_ROUNDS, seed=seed,
                          max_points_per_centroid=len(sample))
    coarse.train(sample)
    cell = nearest(sample, np.asarray(coarse.centroids))
    counts = np.bincount(cell, minlength=n_coarse)
    shares = np.diff(np.concatenate([[0], np.cumsum(counts) * nlist // len(sample)]))
    order = np.argsort(cell, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return np.vstack([cluster(sample[order[starts[c]:starts[c + 1]]], int(shares[c]), seed)
                      for c in np.flatnonzero(shares)])


def cluster(points: np.ndarray, k: int, seed: int) -> np.ndarray:
    """``k`` k-means centroids of ``points`` (the points themselves when there are no more)."""
    import faiss

    if k >= len(points):
        return points[:k].copy()
    km = faiss.Kmeans(points.shape[1], k, niter=KMEANS_ROUNDS, seed=seed,
                      min_points_per_centroid=1, max_points_per_centroid=len(points))
    km.train(points)
    return np.asarray(km.centroids)


def nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each vector's highest inner-product centroid (int64)."""
    out = np.empty(len(vectors), dtype=np.int64)
    for start in range(0, len(vectors), BLOCK):
        block = vectors[start:start + BLOCK]
        out[start:start + len(block)] = np.argmax(block @ centroids.T, axis=1)
    return out


def exact_neighbours(matrix: np.ndarray, queries: np.ndarray, k: int, block: int = BLOCK,
                     stored: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """The ``k`` highest inner-product rows of ``matrix`` per query (unordered), scored
    ``block`` rows at a time: for calibration's 200 queries over 1M vectors faiss' exact
    search took 18 s on 2 cores, its reservoir of k per query being the cost at k=100.
    Each query keeps its best k in a heap, in a compiled pass that holds no GIL: the numpy
    merge it replaced ran per query in Python, which beside the build's keyword side waited
    for the GIL. ``stored`` maps a block of rows to the vectors as an index stores them
    (8-bit, decoded)."""
    k = min(k, len(matrix))
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_rows = np.full((len(queries), k), -1, dtype=np.int64)
    if k <= 0:
        return best_rows
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    for start in range(0, len(matrix), block):
        vectors = matrix[start:start + block]
        scores = queries @ (vectors if stored is None else stored(vectors)).T
        _merge_top_k(np.ascontiguousarray(scores, dtype=np.float32), start, best_scores,
                     best_rows)
    return best_rows


@njit(nogil=True, cache=True)
def _merge_top_k(scores, start, best_scores, best_rows):  # pragma: no cover - compiled
    """Row ``start + j`` of each query ``q`` whose score ``scores[q, j]`` beats the least of
    its best k so far takes that one's place (each query's best k a min-heap on the score)."""
    k = best_scores.shape[1]
    for q in range(scores.shape[0]):
        heap, rows = best_scores[q], best_rows[q]
        for j in range(scores.shape[1]):
            score = scores[q, j]
            if not score > heap[0]:  # NaN never enters
                continue
            i = 0  # sift the new score down from the root
            while True:
                child = 2 * i + 1
                if child >= k:
                    break
                if child + 1 < k and heap[child + 1] < heap[child]:
                    child += 1
                if heap[child] >= score:
                    break
                heap[i], rows[i] = heap[child], rows[child]
                i = child
            heap[i], rows[i] = score, start + j
