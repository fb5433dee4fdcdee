"""Exact dynamic pruning for BM25 top C: MaxScore, term at a time.

The exhaustive kernel (``bm25_kernels.top_rows``) adds every posting of every query term. Here
the terms are taken by decreasing upper bound (weight x the term's largest impact: rare words
first) and added until the remaining terms hold ``SKIP_RATIO`` times the postings added so
far: the long lists of frequent words, whose bounds are low. Then the C-th best partial score
among allowed touched rows (``theta``, a lower bound of the final C-th best score, since scores
only grow) is compared with ``rest``, the summed bounds of the remaining terms. If ``rest <
theta``, no untouched row can reach the top C, nor can a touched row whose partial score plus
``rest`` stays below ``theta``: the long lists are never walked, the surviving candidates are
looked up in them by galloping search instead. The kernel takes that path per query only when
it pays (candidates x lists x ``CANDIDATE_COST`` below the skipped postings); otherwise it runs
the exhaustive kernel, having spent at most a third of its work on the attempt.

Exact, ties included: partial sums follow the bound order, so every candidate's score is then
summed again from 0.0 in query-term order over the terms it holds, as ``top_rows`` sums it (the
same bits), and the top C is selected by (score desc, row asc) as in ``indexes.topk``. A row is
dropped only when its bound is below ``theta`` by more than float rounding (``_SLACK``), so a
row that could tie the C-th score is always kept. Needs every impact of the query's terms to
be positive, like ``top_rows`` (0.0 marks an untouched scratch slot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from indexes.bm25_filtered import _gallop
from indexes.topk import sorted_best

# Bounds are sums of at most a few dozen positive doubles, in another order than a score's:
# their rounding differs by far less than this relative margin.
_SLACK = 1.0 + 1e-9
_BINS = 1024

# The long lists are those holding SKIP_RATIO times the postings of the terms before them.
SKIP_RATIO = 2
# A candidate's lookup by galloping in one list, in exhaustive posting visits (measured ~10x).
CANDIDATE_COST = 10


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


@njit(nogil=True, cache=True)
def _kth_best_bound(touched, n, scratch, mask, use_mask, k):  # pragma: no cover - compiled
    """A value that at least ``k`` allowed touched rows reach (-inf if fewer than k): the
    lower edge of the histogram bin holding the k-th largest scratch value. Two passes, no
    sort (a selection of the exact k-th cost ~5x more, and any lower bound is exact enough)."""
    if k == 0:
        return -np.inf
    highest = 0.0
    allowed = 0
    for j in range(n):
        r = touched[j]
        if use_mask and not mask[r]:
            continue
        allowed += 1
        if scratch[r] > highest:
            highest = scratch[r]
    if allowed < k or highest <= 0.0:
        return -np.inf
    scale = (_BINS - 1) / highest
    counts = np.zeros(_BINS, dtype=np.int64)
    for j in range(n):
        r = touched[j]
        if use_mask and not mask[r]:
            continue
        counts[int(scratch[r] * scale)] += 1
    above = 0
    for b in range(_BINS - 1, -1, -1):
        above += counts[b]
        if above >= k:
            return b / scale * (1.0 - 1e-12)  # rows in bin b are >= b / scale, up to rounding
    return -np.inf


@njit(nogil=True, cache=True)
def _exact_scores(indptr, rows, impacts, term_ids, weights, candidates):  # pragma: no cover
    """Scores of ``candidates`` (int32, ascending), summed from 0.0 in query-term order: per
    term, the candidates and the term's postings are intersected by galloping."""
    scores = np.zeros(candidates.shape[0], dtype=np.float64)
    n = candidates.shape[0]
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        p, end = indptr[t], indptr[t + 1]
        for c in range(n):
            if p >= end:
                break
            p = _gallop(rows, p, end, candidates[c])
            if p < end and rows[p] == candidates[c]:
                scores[c] += w * impacts[p]
                p += 1
    return scores


@njit(nogil=True, cache=True)
def candidates_top_rows(indptr, rows, impacts, term_ids, weights, candidates, k
                        ):  # pragma: no cover - compiled
    """The ``k`` best of ``prune_candidates``' rows (non-empty), scored exactly, best first
    (score desc, row asc): the same as ``bm25_kernels.top_rows`` over the whole postings.
    Returns (rows int32 (m,), scores float64 (m,)), m <= k."""
    scores = _exact_scores(indptr, rows, impacts, term_ids, weights, candidates)
    return sorted_best(scores, candidates, candidates.shape[0], min(k, candidates.shape[0]))


@njit(nogil=True, cache=True)
def prune_candidates(indptr, rows, impacts, term_max, term_ids, weights, mask, use_mask, k,
                     scratch):  # pragma: no cover - compiled
    """Sorted int32 rows that may be in the top ``k`` (a superset of it), or an empty array
    when pruning would not pay (then ``bm25_kernels.top_rows`` answers).

    indptr int64 (n_terms + 1,), rows int32 ascending within a term, impacts float32 (nnz,);
    term_max float32 (n_terms,): each term's largest impact; term_ids int64 / weights float64
    (q,): distinct query terms and their counts; mask bool (n_docs,) read when ``use_mask``;
    scratch float64 (n_docs,), zeros, left zeros."""
    empty = np.empty(0, dtype=np.int32)
    q = term_ids.shape[0]
    bound = np.empty(q, dtype=np.float64)
    for i in range(q):
        bound[i] = weights[i] * term_max[term_ids[i]]
    order = np.argsort(-bound)  # highest bound first
    rest = np.zeros(q + 1, dtype=np.float64)  # rest[j]: summed bounds of order[j:]
    left = np.zeros(q + 1, dtype=np.int64)  # left[j]: postings of order[j:]
    for j in range(q - 1, -1, -1):
        t = term_ids[order[j]]
        rest[j] = rest[j + 1] + bound[order[j]]
        left[j] = left[j + 1] + indptr[t + 1] - indptr[t]
    # One decision point: before the first term whose remaining postings outweigh, by
    # SKIP_RATIO, those added so far (the long lists of frequent words start there).
    split = 1
    while split < q and left[0] - left[split] > left[split] // SKIP_RATIO:
        split += 1
    # theta cannot exceed the added terms' summed bounds: if the rest reaches that, no row
    # can be dropped, so the attempt is not made (most queries at C=300 on realistic text).
    if split >= q or rest[split] * _SLACK >= rest[0] - rest[split]:
        return empty
    touched = np.empty(min(left[0] - left[split], scratch.shape[0]), dtype=np.int32)
    n = 0
    for j in range(split):
        t = term_ids[order[j]]
        w = weights[order[j]]
        for p in range(indptr[t], indptr[t + 1]):
            r = rows[p]
            if scratch[r] == 0.0:
                touched[n] = r
                n += 1
            scratch[r] += w * impacts[p]
    theta = _kth_best_bound(touched, n, scratch, mask, use_mask, k)
    keep = np.empty(n, dtype=np.int32)
    m = 0
    if rest[split] * _SLACK < theta:
        for j in range(n):
            r = touched[j]
            if (scratch[r] + rest[split]) * _SLACK >= theta and (not use_mask or mask[r]):
                keep[m] = r
                m += 1
    for j in range(n):
        scratch[touched[j]] = 0.0
    # Pays when looking the candidates up costs less than walking the skipped postings.
    if m == 0 or m * (q - split) * CANDIDATE_COST >= left[split]:
        return empty
    return np.sort(keep[:m])
