"""BM25 under a filter through a bitset: the postings are walked, but only allowed rows are
scored.

The exhaustive kernel adds every posting into a float64 scratch of one slot per document (8 MB
at 1M): its cost is those scattered writes. With a mask, most of them are wasted. Here each
posting's row is first tested in the mask packed as bits (125 KB at 1M, which stays in cache),
and only allowed rows are added, so the work under a filter follows the allowed rows' postings,
plus one cached bit test per posting. The galloping intersection (``bm25_filtered``) stays the
choice when the allowed rows are few enough to be cheaper than walking the postings at all.

Scores are the same bits as the exhaustive kernel's (float64 sums from 0.0 in query-term order
of weight x impact); the selection is ``indexes.topk``'s (score desc, row asc). Needs every
impact of the query's terms to be positive (0.0 marks an untouched scratch slot).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
from numba import njit

from indexes.lru import LRU
from indexes.topk import best_touched

# Measured at 1M realistic passages, queries interleaved: with 1% allowed the bitset walk took
# 0.38-0.42 ms p50 against 0.72-0.81 for the exhaustive kernel without a mask and 0.73-0.78 for
# galloping; galloping must beat 0.2 of the exhaustive cost to be chosen (at 0.5 it was chosen
# for a quarter of those queries and lost: 135 against 118 ms in all). At 12% allowed the
# bitset lost to the exhaustive kernel.
BITSET_COST = 0.2
BITSET_MAX_SHARE = 0.1


@njit(nogil=True, cache=True)
def bitset_top_rows(indptr, rows, impacts, term_ids, weights, bits, k, scratch
                    ):  # pragma: no cover - compiled
    """The ``k`` best allowed rows holding a query term, best first (score desc, row asc).

    bits uint8 (ceil(n_docs / 8),): the mask packed little-endian (row r is bit r & 7 of byte
    r >> 3); the other arguments as ``bm25_kernels.top_rows``. Scratch is left zeros.
    Returns (rows int32 (m,), scores float64 (m,)), m <= k.
    """
    total = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        total += indptr[t + 1] - indptr[t]
    touched = np.empty(min(total, scratch.shape[0]), dtype=np.int32)
    n = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        for p in range(indptr[t], indptr[t + 1]):
            r = rows[p]
            if (bits[r >> 3] >> (r & 7)) & 1:
                if scratch[r] == 0.0:
                    touched[n] = r
                    n += 1
                scratch[r] += w * impacts[p]
    return best_touched(touched, n, scratch, k)


class BitsetMemo:
    """(packed bits, allowed count) of recently seen read-only masks, by identity (a weak
    reference proves the mask is still the same object), as ``AllowedRowsMemo`` does for rows:
    a filter's mask is shared through the per-build mask cache, so it is packed once. Writable
    masks are packed on every call (their owner may change them)."""

    def __init__(self, size: int = 32) -> None:
        self._entries: LRU[int, tuple[weakref.ref, np.ndarray, int]] = LRU(size)
        self._lock = threading.Lock()

    def bits(self, mask: np.ndarray) -> tuple[np.ndarray, int]:
        key = id(mask)
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and entry[0]() is mask:
            return entry[1], entry[2]
        packed = np.packbits(mask, bitorder="little")
        allowed = int(np.count_nonzero(mask))
        if not mask.flags.writeable:
            with self._lock:
                self._entries.put(key, (weakref.ref(mask), packed, allowed))
        return packed, allowed
