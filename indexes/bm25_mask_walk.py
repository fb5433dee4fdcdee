"""BM25 under a filter through a mask walk: the postings are walked, but only allowed rows are
scored.

The exhaustive kernel adds every posting into a float64 scratch of one slot per document (8 MB
at 1M): its cost is those scattered writes, and under a filter most are wasted. Here each term's
postings are walked in chunks of ``CHUNK``: a first pass over a chunk reads each posting's row
in the mask (one byte a document, read in posting order) and keeps the positions of allowed ones
without a branch (the position is always written, the count grows by the mask byte); a second
pass adds only those into the scratch. So the work under a filter is one streaming pass over
the postings plus the allowed rows' postings. The galloping intersection (``bm25_filtered``)
stays the choice when the allowed rows are few enough to be cheaper than walking the postings.

Scores are the same bits as the exhaustive kernel's (float64 sums from 0.0 in query-term order
of weight x impact, postings in their order); the selection is ``indexes.topk``'s (score desc,
row asc). Needs every impact of the query's terms to be positive (0.0 marks an untouched
scratch slot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from indexes.topk import best_touched

# Positions kept per pass: 16 KB of int32, which stays in the first-level cache.
CHUNK = 4096


@njit(nogil=True, cache=True)
def mask_walk_top_rows(indptr, rows, impacts, term_ids, weights, mask, n_allowed, k, scratch,
                       chunk):  # pragma: no cover - compiled
    """The ``k`` best allowed rows holding a query term, best first (score desc, row asc).

    mask bool (n_docs,); n_allowed: its number of True (sizes the list of touched rows, grown
    if short); chunk: postings per pass (``CHUNK``); the other arguments as
    ``bm25_kernels.top_rows``. Scratch is left zeros.
    Returns (rows int32 (m,), scores float64 (m,)), m <= k.
    """
    total = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        total += indptr[t + 1] - indptr[t]
    touched = np.empty(max(min(total, n_allowed), 16), dtype=np.int32)
    picked = np.empty(chunk, dtype=np.int32)
    n = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        end = indptr[t + 1]
        for start in range(indptr[t], end, chunk):
            segment = rows[start:min(start + chunk, end)]
            m = 0
            for j in range(segment.shape[0]):
                picked[m] = j
                m += mask[segment[j]]
            if n + m > touched.shape[0]:  # per chunk: the loop below never reallocates
                touched = _grown(touched, n, n + m)
            for q in range(m):
                p = start + picked[q]
                r = rows[p]
                if scratch[r] == 0.0:
                    touched[n] = r
                    n += 1
                scratch[r] += w * impacts[p]
    return best_touched(touched, n, scratch, k)


@njit(nogil=True, cache=True)
def _grown(touched, n, needed):  # pragma: no cover - compiled
    grown = np.empty(max(needed, 2 * touched.shape[0]), dtype=np.int32)
    grown[:n] = touched[:n]
    return grown
