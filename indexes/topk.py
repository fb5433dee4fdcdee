"""Exact top-k selection for numba kernels: a candidate buffer with a rising cut-off.

The order is total: score descending, then row ascending (rows are unique, so no two entries
tie). A kernel streams (score, row) pairs: a pair ranking below the cut-off costs one
well-predicted comparison; the others are appended to a buffer of ``4k`` slots, and a full
buffer is cut back to its ``k`` best by quickselect (``compact``), which raises the cut-off to
the worst of them. Against a size-k binary heap (one sift per accepted pair) this measured
1.2-1.7x faster for k=300 at 5k-1M documents, with the same result. The append is written
out in each kernel's loop: a helper called per appended pair, even one numba inlines, made
the whole kernel 2x slower.

``best_first`` is the same order over numpy arrays (the exact dense leg, the shards' merge).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def best_first(rows: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """Positions of the ``n`` best ``scores``, best first, ties to the lower of ``rows``;
    a NaN score ranks below every other.

    ``np.argpartition`` alone would keep an arbitrary few of the rows tied at the n-th best
    score (duplicate documents), so one layout of a build could keep others than another.
    A partition finds the n-th best score; every row above it is kept, and the lowest rows
    tied at it fill the rest: only the kept ones are sorted.
    """
    scores = np.asarray(scores)
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    picked = np.arange(scores.size)
    if scores.size > n:
        worst = -scores  # a copy, partitioned in place; NaN sorts last
        worst.partition(n - 1)
        cut = -worst[n - 1]
        if np.isnan(cut):  # fewer than n numbers: all of them, then NaN rows
            above, tied = np.flatnonzero(~np.isnan(scores)), np.flatnonzero(np.isnan(scores))
        else:
            above, tied = np.flatnonzero(scores > cut), np.flatnonzero(scores == cut)
        tied = tied[np.argsort(rows[tied], kind="stable")][:n - above.size]
        picked = np.concatenate([above, tied])
    return picked[np.lexsort((rows[picked], -scores[picked]))]


@njit(nogil=True, cache=True, inline="always")
def _worse(s_a, r_a, s_b, r_b):  # pragma: no cover - compiled
    """Whether (score a, row a) ranks below (score b, row b): lower score, then higher row."""
    return s_a < s_b or (s_a == s_b and r_a > r_b)


@njit(nogil=True, cache=True)
def new_buffer(k, n_candidates):  # pragma: no cover - compiled
    """(scores float64 (cap,), rows int32 (cap,), k clipped to n_candidates)."""
    k = min(k, n_candidates)
    cap = min(max(4 * k, 64), n_candidates)
    return np.empty(cap, dtype=np.float64), np.empty(cap, dtype=np.int32), k


@njit(nogil=True, cache=True)
def compact(buf_s, buf_r, k):  # pragma: no cover - compiled
    """Cut a full buffer back to its ``k`` best; returns (size, cut_s, cut_r), the cut-off
    being the worst entry kept: later pairs must rank above it to be appended."""
    size = buf_s.shape[0]
    if size <= k:  # cannot hold more than k: nothing to cut
        return size, -np.inf, np.int32(-1)
    _select_best(buf_s, buf_r, size, k)
    cut_s, cut_r = buf_s[0], buf_r[0]
    for i in range(1, k):
        if _worse(buf_s[i], buf_r[i], cut_s, cut_r):
            cut_s, cut_r = buf_s[i], buf_r[i]
    return k, cut_s, cut_r


@njit(nogil=True, cache=True)
def _select_best(buf_s, buf_r, n, k):  # pragma: no cover - compiled
    """Reorder buf[:n] so that its ``k`` best come first (0 < k < n); Hoare quickselect."""
    lo, hi, target = 0, n - 1, k - 1
    while lo < hi:
        # Median of three: sorted or reversed input (rows arrive ascending) stays O(n).
        a, b, c = lo, (lo + hi) >> 1, hi
        if _worse(buf_s[a], buf_r[a], buf_s[b], buf_r[b]):
            a, b = b, a
        if _worse(buf_s[b], buf_r[b], buf_s[c], buf_r[c]):
            b, c = c, b
            if _worse(buf_s[a], buf_r[a], buf_s[b], buf_r[b]):
                a, b = b, a
        pivot_s, pivot_r = buf_s[b], buf_r[b]
        i, j = lo, hi
        while i <= j:
            while _worse(pivot_s, pivot_r, buf_s[i], buf_r[i]):
                i += 1
            while _worse(buf_s[j], buf_r[j], pivot_s, pivot_r):
                j -= 1
            if i <= j:
                buf_s[i], buf_s[j] = buf_s[j], buf_s[i]
                buf_r[i], buf_r[j] = buf_r[j], buf_r[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break


@njit(nogil=True, cache=True, inline="always")
def _sift_down(heap_s, heap_r, i, size):  # pragma: no cover - compiled
    """Restore the min-heap (worst entry on top) below slot ``i``."""
    s, r = heap_s[i], heap_r[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _worse(heap_s[right], heap_r[right], heap_s[child], heap_r[child]):
            child = right
        if not _worse(heap_s[child], heap_r[child], s, r):
            break
        heap_s[i], heap_r[i] = heap_s[child], heap_r[child]
        i = child
    heap_s[i], heap_r[i] = s, r


@njit(nogil=True, cache=True)
def sorted_best(buf_s, buf_r, size, k):  # pragma: no cover - compiled
    """The ``k`` best of buf[:size], best first: (rows int32 (m,), scores float64 (m,)).

    Quickselect, then heapsort of the kept ones (heapify, then pop the worst to the back).
    """
    if size > k:
        _select_best(buf_s, buf_r, size, k)
        size = k
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(buf_s, buf_r, i, size)
    out_s = np.empty(size, dtype=np.float64)
    out_r = np.empty(size, dtype=np.int32)
    for last in range(size - 1, -1, -1):
        out_s[last], out_r[last] = buf_s[0], buf_r[0]
        buf_s[0], buf_r[0] = buf_s[last], buf_r[last]
        _sift_down(buf_s, buf_r, 0, last)
    return out_r, out_s


@njit(nogil=True, cache=True)
def best_touched(touched, n, scratch, k):  # pragma: no cover - compiled
    """Top ``k`` of the first ``n`` rows of ``touched`` (int32) by their ``scratch`` score
    (float64 (n_docs,), reset to 0 on the way), ties by lower row; sorted as ``sorted_best``."""
    buf_s, buf_r, k = new_buffer(k, n)
    size, cut_s, cut_r = 0, -np.inf if k > 0 else np.inf, np.int32(-1)
    for j in range(n):
        r = touched[j]
        s = scratch[r]
        scratch[r] = 0.0
        if s < cut_s or (s == cut_s and r > cut_r):
            continue
        buf_s[size], buf_r[size] = s, r
        size += 1
        if size == buf_s.shape[0]:
            size, cut_s, cut_r = compact(buf_s, buf_r, k)
    return sorted_best(buf_s, buf_r, size, k)
