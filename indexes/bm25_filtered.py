"""Filter-aware BM25: when few documents are allowed, the work follows the allowed rows.

The exhaustive kernel (``bm25_kernels.top_rows``) walks every posting of the query's terms and
drops disallowed rows at the end: its cost is the postings' length whatever the filter. Here the
sorted allowed rows are intersected with each term's sorted postings by galloping search from
the shorter side, so a term costs ~min(A, L) x log(max / min) steps instead of L.

Scores are the same bits as the exhaustive kernel's: a row's score is the float64 sum, from
0.0 and in query-term order, of weight x impact over the terms it holds. The selection is
``indexes.topk``'s (score desc, row asc), so the top C is the same, ties included. Like
``top_rows`` it needs every impact of the query's terms to be positive (0.0 marks an untouched
scratch slot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from indexes.topk import best_touched


@njit(nogil=True, cache=True, inline="always")
def _gallop(values, lo, hi, target):  # pragma: no cover - compiled
    """First index i in [lo, hi) with values[i] >= target (hi if none); values ascending.

    Exponential steps from ``lo``, then binary search: O(log distance), so a walk over one
    list that gallops through the other costs O(m log(n / m)) in all.
    """
    step = 1
    bound = lo
    while bound < hi and values[bound] < target:
        lo = bound + 1
        bound += step
        step <<= 1
    if bound > hi:
        bound = hi
    while lo < bound:
        mid = (lo + bound) >> 1
        if values[mid] < target:
            lo = mid + 1
        else:
            bound = mid
    return lo


@njit(nogil=True, cache=True)
def _intersect_add(rows, impacts, start, end, allowed, w, scratch, touched, n_touched
                   ):  # pragma: no cover - compiled
    """scratch[r] += w * impact for postings rows[start:end] whose row is in ``allowed``;
    newly touched rows are appended to ``touched``. Returns the new touched count."""
    a, n_allowed = 0, allowed.shape[0]
    p = start
    if end - start <= n_allowed:  # walk the postings, gallop through the allowed rows
        while p < end and a < n_allowed:
            r = rows[p]
            a = _gallop(allowed, a, n_allowed, r)
            if a < n_allowed and allowed[a] == r:
                if scratch[r] == 0.0:
                    touched[n_touched] = r
                    n_touched += 1
                scratch[r] += w * impacts[p]
                a += 1
            p += 1
    else:  # walk the allowed rows, gallop through the postings
        while a < n_allowed and p < end:
            r = allowed[a]
            p = _gallop(rows, p, end, r)
            if p < end and rows[p] == r:
                if scratch[r] == 0.0:
                    touched[n_touched] = r
                    n_touched += 1
                scratch[r] += w * impacts[p]
                p += 1
            a += 1
    return n_touched


@njit(nogil=True, cache=True)
def filtered_top_rows(indptr, rows, impacts, term_ids, weights, allowed, k, scratch
                      ):  # pragma: no cover - compiled
    """The ``k`` best rows of ``allowed`` holding a query term, best first (score desc, row asc).

    indptr int64 (n_terms + 1,), rows int32 and impacts float32 (nnz,): the CSC postings, rows
    ascending within a term; term_ids int64 / weights float64 (q,); allowed int32 (A,) sorted
    ascending, distinct; scratch float64 (n_docs,), zeros, left zeros.
    Returns (rows int32 (m,), scores float64 (m,)), m <= k.
    """
    capacity = allowed.shape[0]
    total = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        total += indptr[t + 1] - indptr[t]
    capacity = min(capacity, total)
    touched = np.empty(capacity, dtype=np.int32)
    n = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        n = _intersect_add(rows, impacts, indptr[t], indptr[t + 1], allowed, weights[i],
                           scratch, touched, n)
    return best_touched(touched, n, scratch, k)


@njit(nogil=True, cache=True)
def allowed_rows_upto(mask, limit):  # pragma: no cover - compiled
    """Sorted int32 rows where ``mask`` is True, or an empty array with ok=False as soon as
    more than ``limit`` are found (the filter is too wide to pay off). Returns (rows, ok)."""
    out = np.empty(min(limit, mask.shape[0]), dtype=np.int32)
    n = 0
    for r in range(mask.shape[0]):
        if mask[r]:
            if n == limit:
                return out[:0], False
            out[n] = r
            n += 1
    return out[:n].copy(), True
