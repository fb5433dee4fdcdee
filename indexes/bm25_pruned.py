"""Exact dynamic pruning for BM25 top C: MaxScore, document at a time.

The exhaustive kernel (``bm25_kernels.top_rows``) adds every posting of every query term. Here
the query's terms are ordered by their upper bound (weight x the term's largest impact) and
walked together, row by row. Once the C-th best score so far (``theta``) exceeds the summed
bounds of the lowest terms, those terms become *non-essential*: a row holding only them cannot
enter the top C, so their postings are no longer walked, only probed (galloping search) for
rows that an essential term brought up, and only while the row's partial score plus the bounds
of the terms not yet probed can still reach ``theta``. The long postings of frequent words have
the lowest bounds, so they are the ones skipped.

Exact, ties included: a row's score is summed from 0.0 in query-term order over the terms it
holds, as ``top_rows`` sums it (the same bits), and rows are kept in a size-C heap ordered by
(score desc, row asc), the order of ``indexes.topk``. A row is skipped only when its bound is
below ``theta`` by more than float rounding (``_SLACK``), so a row that would tie ``theta`` is
always scored. Needs every impact of the query's terms to be positive, like ``top_rows``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from indexes.bm25_filtered import _gallop
from indexes.topk import _sift_down, _worse, sorted_best

# Bounds are sums of at most a few dozen positive doubles, in another order than a score's:
# their rounding differs by far less than this relative margin.
_SLACK = 1.0 + 1e-9
_NO_ROW = np.iinfo(np.int32).max

# When pruning pays (``python -m benchmarks.filters`` measures both kernels on the realistic
# corpus): document-at-a-time costs more per posting than the exhaustive kernel's branch-free
# adds, so short queries whose postings are few stay exhaustive.
PRUNE_MIN_POSTINGS = 50_000


@njit(nogil=True, cache=True)
def term_maxima(indptr, impacts):  # pragma: no cover - compiled
    """(largest impact float32 (n_terms,), smallest impact float32 (n_terms,)) per term;
    0.0 for empty terms. One pass over the impacts."""
    n_terms = indptr.shape[0] - 1
    highest = np.zeros(n_terms, dtype=np.float32)
    lowest = np.zeros(n_terms, dtype=np.float32)
    for t in range(n_terms):
        start, end = indptr[t], indptr[t + 1]
        if start == end:
            continue
        hi = impacts[start]
        lo = impacts[start]
        for p in range(start + 1, end):
            v = impacts[p]
            if v > hi:
                hi = v
            if v < lo or v != v:  # NaN counts as lowest: such a term is never pruned
                lo = v
        highest[t] = hi
        lowest[t] = lo
    return highest, lowest


@njit(nogil=True, cache=True, inline="always")
def _heap_offer(heap_s, heap_r, size, k, s, r):  # pragma: no cover - compiled
    """Offer (s, r) to the size-k heap (worst on top); returns the new size."""
    if size < k:
        i = size
        size += 1
        while i > 0:  # sift up
            parent = (i - 1) >> 1
            if not _worse(s, r, heap_s[parent], heap_r[parent]):
                break
            heap_s[i], heap_r[i] = heap_s[parent], heap_r[parent]
            i = parent
        heap_s[i], heap_r[i] = s, r
    elif _worse(heap_s[0], heap_r[0], s, r):
        heap_s[0], heap_r[0] = s, r
        _sift_down(heap_s, heap_r, 0, size)
    return size


@njit(nogil=True, cache=True)
def maxscore_top_rows(indptr, rows, impacts, term_max, term_ids, weights, mask, use_mask, k
                      ):  # pragma: no cover - compiled
    """The ``k`` best allowed rows holding a query term, best first (score desc, row asc):
    the same as ``bm25_kernels.top_rows`` with the same arguments.

    indptr int64 (n_terms + 1,), rows int32 ascending within a term, impacts float32 (nnz,);
    term_max float32 (n_terms,): each term's largest impact; term_ids int64 / weights float64
    (q,): distinct query terms and their counts; mask bool (n_docs,) read when ``use_mask``.
    Returns (rows int32 (m,), scores float64 (m,)), m <= k.
    """
    q = term_ids.shape[0]
    bound = np.empty(q, dtype=np.float64)
    for i in range(q):
        bound[i] = weights[i] * term_max[term_ids[i]]
    order = np.argsort(bound)  # lowest bound first: those terms become non-essential first
    prefix = np.empty(q, dtype=np.float64)  # prefix[j]: summed bounds of order[0..j]
    pos = np.empty(q, dtype=np.int64)
    end = np.empty(q, dtype=np.int64)
    running = 0.0
    for j in range(q):
        running += bound[order[j]]
        prefix[j] = running
        pos[j] = indptr[term_ids[order[j]]]
        end[j] = indptr[term_ids[order[j]] + 1]
    contrib = np.zeros(q, dtype=np.float64)  # by query position: summed in query order
    heap_s = np.empty(max(k, 1), dtype=np.float64)
    heap_r = np.empty(max(k, 1), dtype=np.int32)
    size = 0
    theta = -np.inf
    first = 0  # order[first:] are the essential terms
    while first < q and k > 0:
        d = _NO_ROW
        for j in range(first, q):
            if pos[j] < end[j] and rows[pos[j]] < d:
                d = rows[pos[j]]
        if d == _NO_ROW:
            break
        partial = 0.0
        for j in range(first, q):
            p = pos[j]
            if p < end[j] and rows[p] == d:
                c = weights[order[j]] * impacts[p]
                contrib[order[j]] = c
                partial += c
                pos[j] = p + 1
        alive = not use_mask or mask[d]
        j = first - 1
        while alive and j >= 0:  # probe the non-essential terms, highest bound first
            if (partial + prefix[j]) * _SLACK < theta:
                alive = False
                break
            p = _gallop(rows, pos[j], end[j], d)
            pos[j] = p
            if p < end[j] and rows[p] == d:
                c = weights[order[j]] * impacts[p]
                contrib[order[j]] = c
                partial += c
            j -= 1
        if alive:
            s = 0.0
            for i in range(q):  # query order from 0.0, as top_rows sums (x + 0.0 == x)
                s += contrib[i]
            size = _heap_offer(heap_s, heap_r, size, k, s, np.int32(d))
            if size == k and heap_s[0] > theta:
                theta = heap_s[0]
                while first < q and prefix[first] * _SLACK < theta:
                    first += 1
        for i in range(q):
            contrib[i] = 0.0
    return sorted_best(heap_s, heap_r, size, k)
