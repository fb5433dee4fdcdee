"""Numba kernels behind ``BM25Index``: sum impacts over a query's postings, select the top C.

Scratch protocol: ``scratch`` (float64, one slot per document, per thread) is all zeros between
calls. A call adds every posting's ``weight * impact`` into its row's slot, then walks the same
postings again: the first visit of a row reads its final score and zeroes the slot, so later
visits see 0.0 and skip it. That second walk both resets the scratch and feeds the selection,
so a call costs O(postings), never O(n_docs), and needs no list of touched rows. Where a
block's postings outnumber a quarter of its rows, its slots are scanned in order instead of
its postings walked again (``_offer_slots``): still O(postings).

Telling "visited" from "untouched" by 0.0 needs every contribution to be positive (a sum of
positive doubles is never 0.0). BM25 impacts share the sign of their term's idf, which is
positive except in corner cases (okapi idf exactly 0 when a term is in half the documents, or a
negative floor on tiny corpora); queries with a term holding a non-positive impact take
``general_rows``, which tracks touched rows in a ``seen`` array instead.

Sums are float64 and follow the query's term order, starting from 0.0 as rank-bm25 does, so
scores are the same bit for bit whichever path produced them. Selection: ``indexes.topk``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from indexes.atomics import atomic_add
from indexes.bm25_filtered import _gallop
from indexes.topk import compact, new_buffer, sorted_best

# Rows per block of the exhaustive kernel: 512 KiB of float64 scratch, within a core's
# second-level cache. At 1M realistic passages (~250,000 postings a query) blocks of 32k-128k
# rows ran the kernel 1.2x faster than one block at p50 and p95; 256k rows less so.
BLOCK_ROWS = 1 << 16

# A block's slots are scanned (``_offer_slots``) instead of its postings walked a second time
# when those postings number more than its rows / SCAN_FROM. A scan costs about 0.1 ns a row
# (compares on 8 slots at once, then a memset), the walk 1.4-1.65 ns a posting (a random read
# and write each). At 1M passages, BM25 top 300 on one thread, the kernels before and after
# alternated query by query in one process: p95 1.43 -> 1.15 ms (queries of 400,000 postings
# or more 1.03 -> 0.87 at the median, of 100,000-400,000 0.49 -> 0.50). Scans from 4 or 8
# beat 2 and 16; from 1 they are too rare to matter (p95 1.43).
SCAN_FROM = 4
# Slots compared at once by the scan before any is looked at one by one.
SCAN_CHUNK = 256
# The smallest positive double: a scan's cut-off while the buffer is not yet full, so that
# slots never touched (0.0) are not offered.
_TINY = 5e-324


@njit(nogil=True, cache=True, inline="always")
def _length(indptr, t):  # pragma: no cover - compiled
    return indptr[t + 1] - indptr[t]


@njit(nogil=True, cache=True)
def _add_postings(rows, impacts, starts, ends, weights, scratch):  # pragma: no cover
    """scratch[row] += weight * impact over postings ``starts[i]:ends[i]`` of each term i, in
    query order. Plain adds, no branch: the cheapest loop over postings."""
    for i in range(starts.shape[0]):
        w = weights[i]
        if i == 0:  # the slots are 0.0 and 0.0 + x == x: store without loading
            for p in range(starts[i], ends[i]):
                scratch[rows[p]] = w * impacts[p]
        else:
            for p in range(starts[i], ends[i]):
                scratch[rows[p]] += w * impacts[p]


@njit(nogil=True, cache=True, inline="always")
def _offer(s, r, mask, use_mask, k, buf_s, buf_r, size, cut_s, cut_r
           ):  # pragma: no cover - compiled
    """Append row ``r``'s final score ``s`` (already found not below ``cut_s``) to the
    ``indexes.topk`` buffer unless ``mask`` excludes it or it ties the cut-off from a higher
    row; returns the buffer's (size, cut_s, cut_r), cut back to ``k`` when full. The walks
    of ``claimed_top_rows`` keep this inline: through this function BM25 top 300 at 1M
    looked slower (0.49-0.60 ms p50 against 0.41-0.59 in three noisy alternations)."""
    if use_mask and not mask[r]:
        return size, cut_s, cut_r
    if s == cut_s and r > cut_r:
        return size, cut_s, cut_r
    buf_s[size], buf_r[size] = s, r
    size += 1
    if size == buf_s.shape[0]:
        return compact(buf_s, buf_r, k)
    return size, cut_s, cut_r


@njit(nogil=True, cache=True, inline="always")
def _at_least(slots, cut):  # pragma: no cover - compiled
    """How many of ``slots`` are >= ``cut``: a branch-free count the compiler vectorizes."""
    hits = 0
    for j in range(slots.shape[0]):
        hits += slots[j] >= cut
    return hits


@njit(nogil=True, cache=True)
def _offer_slots(scratch, first, end, mask, use_mask, k, buf_s, buf_r, size, cut_s, cut_r
                 ):  # pragma: no cover - compiled
    """Offer every final score in ``scratch[first:end]`` to the ``indexes.topk`` buffer and
    zero those slots, in row order; returns the buffer's (size, cut_s, cut_r).

    Chunks of ``SCAN_CHUNK`` slots are counted against the cut-off first (slices, so indices
    start at 0 and the count vectorizes); only chunks holding a slot at or above it are read
    one by one. Slots holding 0.0 (never touched, or zeroed by the last term's walk) are
    never offered: every score is positive."""
    cut = cut_s if cut_s > 0.0 else _TINY
    for c in range(first, end, SCAN_CHUNK):
        slots = scratch[c:min(c + SCAN_CHUNK, end)]
        if _at_least(slots, cut):
            for j in range(slots.shape[0]):
                s = slots[j]
                if s < cut:
                    continue
                size, cut_s, cut_r = _offer(s, np.int32(c + j), mask, use_mask, k, buf_s,
                                            buf_r, size, cut_s, cut_r)
                cut = cut_s if cut_s > 0.0 else _TINY
        for j in range(slots.shape[0]):
            slots[j] = 0.0
    return size, cut_s, cut_r


@njit(nogil=True, cache=True)
def top_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, k, scratch
             ):  # pragma: no cover - compiled
    """The ``k`` best allowed rows holding a query term, best first (score desc, row asc).

    indptr int64 (n_terms + 1,), rows int32 (ascending within a term) and impacts float32
    (nnz,): the CSC postings; term_ids int64 / weights float64 (q,): distinct query terms and
    their counts; mask bool (n_docs,) read only when ``use_mask``; scratch float64 (n_docs,),
    zeros, left zeros. Every impact of the query's terms must be positive (else use
    ``general_rows``). Returns (rows int32 (m,), scores float64 (m,)), m <= k.
    """
    claims, found_r, found_s, sizes = new_found(1, k)
    claimed_top_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, k, scratch,
                     BLOCK_ROWS, claims, found_r, found_s, sizes, 0)
    return sorted_best(found_s[0], found_r[0], sizes[0], sizes[0])


@njit(nogil=True, cache=True)
def new_found(threads, k):  # pragma: no cover - compiled
    """What the threads of one ``claimed_top_rows`` search share: ``claims`` int64 (2,) (the
    next block to take, the blocks finished) and each thread's best: ``sizes[slot]`` rows
    and scores in row ``slot`` of ``found_r`` / ``found_s``, unsorted (sizes 0 until then)."""
    k = max(k, 0)
    return (np.zeros(2, dtype=np.int64), np.empty((threads, k), dtype=np.int32),
            np.empty((threads, k), dtype=np.float64), np.zeros(threads, dtype=np.int64))


@njit(nogil=True, cache=True)
def best_found(found_s, found_r, sizes, k):  # pragma: no cover - compiled
    """The ``k`` best of every thread's found rows (``new_found``), as ``sorted_best``."""
    total = 0
    for slot in range(sizes.shape[0]):
        total += sizes[slot]
    buf_s = np.empty(total, dtype=np.float64)
    buf_r = np.empty(total, dtype=np.int32)
    at = 0
    for slot in range(sizes.shape[0]):
        n = sizes[slot]
        buf_s[at:at + n] = found_s[slot, :n]
        buf_r[at:at + n] = found_r[slot, :n]
        at += n
    return sorted_best(buf_s, buf_r, total, min(k, total))


@njit(nogil=True, cache=True)
def claimed_top_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, k, scratch,
                     block, claims, found_r, found_s, found_n, slot
                     ):  # pragma: no cover - compiled
    """``top_rows`` over the blocks of ``block`` rows this thread claims; the same call runs
    on several threads at once, each with its own ``slot`` (``new_found``).

    A thread takes the next unclaimed block (an atomic add on ``claims[0]``) until none is
    left, so a thread that starts late, or runs on a busier core, takes fewer blocks; blocks
    hold disjoint rows, so their slots of ``scratch`` are disjoint. Its ``k`` best go to
    ``found_*[slot]`` (in no order), then its count of blocks is added to ``claims[1]``:
    once that reaches the number of blocks every slot is written and ``scratch`` is zeros.

    Each block's postings of every term are added into the scratch, then walked again, so
    the scattered writes of a block stay within a core's second-level cache instead of
    spreading over the whole scratch (8 MB at 1M). A thread finds its blocks' postings
    itself, galloping on from its last block's (blocks are claimed in ascending order).
    Rows are appended to an ``indexes.topk`` buffer unless they rank below its cut-off: once
    that has risen most rows cost one well-predicted comparison. The last term's postings
    complete their rows' sums, so they are offered as they are added: that term is walked
    once, not twice. Where the other terms' postings in a block outnumber its rows /
    ``SCAN_FROM``, the block's slots are scanned (``_offer_slots``) instead of those postings
    walked again.
    """
    n_terms = term_ids.shape[0]
    if n_terms == 2 and _length(indptr, term_ids[0]) > _length(indptr, term_ids[1]):
        # Make the longer list the single-walk last term. Exact: 0.0 + a + b == 0.0 + b + a
        # (addition commutes; only three or more terms depend on the order).
        term_ids, weights = term_ids[::-1], weights[::-1]
    n_rows = scratch.shape[0]
    n_blocks = max(1, (n_rows + block - 1) // block)
    starts, ends = indptr[term_ids], indptr[term_ids + 1]
    buf_s, buf_r, k = new_buffer(k, np.sum(ends - starts))
    cap = buf_s.shape[0]
    size, cut_s, cut_r = 0, -np.inf if k > 0 else np.inf, np.int32(-1)
    last = n_terms - 1
    w = weights[last] if n_terms else 0.0
    lo, hi = starts.copy(), starts.copy()  # this thread's block: postings lo[i]:hi[i]
    taken = 0
    while True:
        b = atomic_add(claims, 0, 1)
        if b >= n_blocks:
            break
        taken += 1
        if n_terms == 0:
            continue
        first, end = b * block, min((b + 1) * block, n_rows)
        others = 0  # postings of every term but the last in this block
        for i in range(n_terms):
            lo[i] = _gallop(rows, hi[i], ends[i], first)
            hi[i] = _gallop(rows, lo[i], ends[i], end)
            others += hi[i] - lo[i] if i < last else 0
        _add_postings(rows, impacts, lo[:last], hi[:last], weights[:last], scratch)
        for p in range(lo[last], hi[last]):
            r = rows[p]
            s = scratch[r] + w * impacts[p]  # the row's final score (0.0 + x == x if new)
            scratch[r] = 0.0
            if s < cut_s:
                continue  # the common case once the cut-off has risen: one comparison
            # Masking after the cut-off test, not before: at 5-50% allowed the mask test is
            # an unpredictable branch, and only rows above the cut-off reach it (2x at 1M,
            # 50%). Masking here, not while adding, keeps the add loop branch-free.
            if use_mask and not mask[r]:
                continue
            if s == cut_s and r > cut_r:
                continue
            buf_s[size], buf_r[size] = s, r
            size += 1
            if size == cap:
                size, cut_s, cut_r = compact(buf_s, buf_r, k)
        if others * SCAN_FROM > end - first:
            size, cut_s, cut_r = _offer_slots(scratch, first, end, mask, use_mask, k, buf_s,
                                              buf_r, size, cut_s, cut_r)
            continue
        # Rows without the last term: the first visit reads the final score, zeroes the slot.
        for i in range(last):
            for p in range(lo[i], hi[i]):
                r = rows[p]
                s = scratch[r]
                scratch[r] = 0.0
                # Once the cut-off is positive this also skips rows already visited (s ==
                # 0.0) with a well-predicted branch, not an unpredictable test per posting.
                if s < cut_s:
                    continue
                if s == 0.0:
                    continue  # already visited, before the cut-off rose
                if use_mask and not mask[r]:
                    continue
                if s == cut_s and r > cut_r:
                    continue
                buf_s[size], buf_r[size] = s, r
                size += 1
                if size == cap:
                    size, cut_s, cut_r = compact(buf_s, buf_r, k)
    if size > k:
        size = compact(buf_s[:size], buf_r[:size], k)[0]
    found_s[slot, :size] = buf_s[:size]
    found_r[slot, :size] = buf_r[:size]
    found_n[slot] = size
    atomic_add(claims, 1, taken)


@njit(nogil=True, cache=True)
def touched_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, scratch
                 ):  # pragma: no cover - compiled
    """Every allowed row holding a query term and its score, in no particular order.

    Same arguments as ``top_rows``. Returns (rows int32 (m,), scores float64 (m,)).
    """
    starts, ends = indptr[term_ids], indptr[term_ids + 1]
    _add_postings(rows, impacts, starts, ends, weights, scratch)
    total = np.sum(ends - starts)
    out_r = np.empty(total, dtype=np.int32)
    out_s = np.empty(total, dtype=np.float64)
    m = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        for p in range(indptr[t], indptr[t + 1]):
            r = rows[p]
            s = scratch[r]
            if s == 0.0:
                continue
            scratch[r] = 0.0
            if use_mask and not mask[r]:
                continue
            out_r[m] = r
            out_s[m] = s
            m += 1
    return out_r[:m].copy(), out_s[:m].copy()


@njit(nogil=True, cache=True)
def general_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, k, scratch, seen,
                 touched):  # pragma: no cover - compiled
    """Any impact signs: touched rows are tracked in ``seen`` (bool (n_docs,), all False,
    left so) and listed in ``touched`` (int32 (n_docs,)); the other arguments as ``top_rows``.

    ``k`` < 0 returns every allowed touched row unsorted, else the top ``k`` sorted.
    Returns (rows int32 (m,), scores float64 (m,)).
    """
    n = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        for p in range(indptr[t], indptr[t + 1]):
            r = rows[p]
            if not seen[r]:
                seen[r] = True
                touched[n] = r
                n += 1
            scratch[r] += w * impacts[p]
    if k < 0:
        all_s = np.empty(n, dtype=np.float64)
        all_r = np.empty(n, dtype=np.int32)
    else:
        all_s, all_r, k = new_buffer(k, n)
    size, cut_s, cut_r = 0, -np.inf if k != 0 else np.inf, np.int32(-1)
    for j in range(n):
        r = touched[j]
        s = scratch[r]
        scratch[r] = 0.0
        seen[r] = False
        if use_mask and not mask[r]:
            continue
        if k >= 0 and (s < cut_s or (s == cut_s and r > cut_r)):
            continue
        all_s[size], all_r[size] = s, r
        size += 1
        if k >= 0 and size == all_s.shape[0]:
            size, cut_s, cut_r = compact(all_s, all_r, k)
    if k < 0:
        return all_r[:size].copy(), all_s[:size].copy()
    return sorted_best(all_s, all_r, size, k)


@njit(nogil=True, cache=True)
def scores_of_rows(indptr, rows, impacts, term_ids, weights, targets
                   ):  # pragma: no cover - compiled
    """BM25 scores float64 (m,) of ``targets`` int64 (m,): a binary search of each target in
    each query term's postings (rows ascend within a term), terms in query order, so each sum
    is the same float64 sequence of adds as the top-k kernels'.

    The searches of one term run in lockstep, one halving step for every target at a time:
    all of them halve the same length, so the step has no branch but a select, and the
    targets' loads are independent, so their cache misses overlap instead of following one
    another. At 1M passages (100 dense-leg rows, ~8 terms) 2.6x faster than one search after
    another (benchmarks/README.md)."""
    m = targets.shape[0]
    out = np.zeros(m, dtype=np.float64)
    base = np.empty(m, dtype=np.int64)
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        start, end = indptr[t], indptr[t + 1]
        n = end - start
        if n == 0:
            continue
        base[:] = start
        # Invariant: rows[base[j]] <= targets[j], unless every row of the term is greater.
        while n > 1:
            half = n >> 1
            for j in range(m):
                at = base[j]
                base[j] = at + half if rows[at + half] <= targets[j] else at
            n -= half
        for j in range(m):
            if rows[base[j]] == targets[j]:
                out[j] += w * impacts[base[j]]
    return out
