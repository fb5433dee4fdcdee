"""Which BM25 kernel answers a query, and every cost threshold that choice uses.

The kernels compute the same scores (the same bits) and the same top C, ties included; they
differ only in cost, so the choice is a cost model over what is known before scoring: the
query terms' posting lengths and, under a filter, how many rows the mask allows. In order:

1. ``GENERAL`` when a query term holds a non-positive impact (a correctness case: the other
   kernels read 0.0 as "untouched"), ``TOUCHED`` for "every touched row" (k < 0).
2. Under a filter allowing at most ``MASK_WALK_MAX_SHARE`` of the rows, the cheapest of:
   ``GALLOP`` (intersect the sorted allowed rows with each term's postings,
   ``bm25_filtered``) when its estimate beats ``MASK_WALK_COST`` x the postings;
   ``RESTRICTED`` (a repeated filter's postings restricted to its rows, ``bm25_restricted``)
   for a read-only mask allowing at most ``RESTRICT_MAX_SHARE``; else ``MASK_WALK``
   (``bm25_mask_walk``). A wider filter may still gallop if that beats the whole postings.
3. ``PRUNED`` (MaxScore, ``bm25_pruned``) for queries of two or more terms with at least
   ``PRUNE_MIN_POSTINGS`` postings whose exhaustive kernel would run on one thread; else
   ``EXHAUSTIVE`` (``bm25_kernels.top_rows``, its blocks shared by one thread per core for
   a large query searched alone). MaxScore runs on one thread: its attempt (a third of the
   postings at most, walked before it knows whether pruning pays) and its lookups were
   weighed against one thread's exhaustive walk, and against one per core they lose. At 1M
   realistic passages on two cores (1,000 queries four times, both choices in one process,
   their order alternated), the BM25 top 300 took 0.645 / 1.317 / 1.616 ms p50 / p95 / p99
   with MaxScore for large queries, 0.628 / 1.284 / 1.559 without.

Callers may force a kernel (``BM25Index.top_candidates(kernel=...)``: benchmarks comparing
kernels, tests checking they agree); ``GENERAL`` still wins when the impacts require it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from indexes.bm25_filtered import allowed_rows_upto
from indexes.mask_memo import MaskMemo

# Relative cost of one galloping comparison against one exhaustive posting visit, measured on
# the realistic synthetic corpus at 400k passages (``python -m benchmarks.filters`` shows the
# effect): ~15-20 ns a comparison for randomly spread allowed rows, ~9 ns for clustered ones,
# against ~10-15 ns a posting for the exhaustive kernel (its scratch writes miss the cache).
GALLOP_COST = 1.5
# Measured at 1M realistic passages (Zipfian, ~285,000 postings a query at the median), kernels
# rotated per query: with 1% allowed the mask walk ran 0.25 ms p50 against 1.1-1.8 for the
# exhaustive kernel without a mask; with 18% allowed 0.67 against 0.98 for the exhaustive kernel
# with the mask, with 29% even (hence the 20% share). Galloping must beat 0.2 of the exhaustive
# cost to be chosen instead (at 0.5 it was chosen for a quarter of the 1% queries and lost).
MASK_WALK_COST = 0.2
MASK_WALK_MAX_SHARE = 0.2
# Above this share a term's allowed postings cost nearly what walking it does.
RESTRICT_MAX_SHARE = 0.05
# Queries with fewer postings than this stay exhaustive: the bound checks and the candidates'
# second scoring cost more than they save there (measured on the realistic corpus at 1M).
PRUNE_MIN_POSTINGS = 10_000


class Kernel(StrEnum):
    GENERAL = "general"
    TOUCHED = "touched"
    GALLOP = "gallop"
    RESTRICTED = "restricted"
    MASK_WALK = "mask_walk"
    PRUNED = "pruned"
    EXHAUSTIVE = "exhaustive"


MASKED_KERNELS = frozenset({Kernel.GALLOP, Kernel.RESTRICTED, Kernel.MASK_WALK})


@dataclass(frozen=True)
class Plan:
    """The chosen kernel and what the choice already computed for it: the mask's allowed row
    count (under a filter) and its sorted allowed rows (``GALLOP`` only)."""

    kernel: Kernel
    n_allowed: int = 0
    allowed: np.ndarray | None = None


def gallop_cost(lengths: np.ndarray, n_allowed: int) -> float:
    """Estimated cost of galloping in exhaustive posting visits: per term, min(A, L) galloping
    steps of ~log2(max / min) + 1 comparisons each."""
    if n_allowed == 0:
        return 0.0
    lengths = lengths[lengths > 0].astype(np.float64)
    short = np.minimum(lengths, n_allowed)
    ratio = np.maximum(lengths, n_allowed) / np.maximum(short, 1.0)
    return float(GALLOP_COST * np.sum(short * (np.log2(ratio) + 1.0)))


class MaskFacts:
    """Per read-only mask (``MaskMemo``): its allowed row count and, once asked for under a
    limit it fits, its sorted allowed rows. A filter's mask is shared through the per-build
    mask cache, so a repeated filter is counted (a pass over 1 MB at 1M documents) and listed
    once, not per query; writable masks are counted on every call."""

    def __init__(self, size: int = 32) -> None:
        # value: (allowed count, sorted allowed rows or None until first listed)
        self._memo: MaskMemo[tuple[int, np.ndarray | None]] = MaskMemo(size)

    def count(self, mask: np.ndarray) -> int:
        entry = self._memo.get(mask)
        if entry is not None:
            return entry[0]
        allowed = int(np.count_nonzero(mask))
        self._memo.put(mask, (allowed, None))
        return allowed

    def rows(self, mask: np.ndarray, limit: int) -> np.ndarray | None:
        """Sorted int32 allowed rows, or None when more than ``limit`` are allowed."""
        count = self.count(mask)
        if count > limit:
            return None
        entry = self._memo.get(mask)
        if entry is not None and entry[1] is not None:
            return entry[1]
        found, _ = allowed_rows_upto(mask, count)
        self._memo.put(mask, (count, found))
        return found


def choose(lengths: np.ndarray, n_docs: int, mask: np.ndarray | None, facts: MaskFacts,
           restricted_on: bool, shared: bool = False) -> Plan:
    """The cheapest kernel for a query with posting ``lengths`` int64 (q,) under ``mask``
    (bool (n_docs,) or None); ``restricted_on``: the index keeps restricted postings;
    ``shared``: the exhaustive kernel would share its blocks among threads."""
    postings = int(lengths.sum())
    if mask is not None:
        n_allowed = facts.count(mask)
        walk = n_allowed <= MASK_WALK_MAX_SHARE * n_docs
        # What galloping must beat: the mask walk, else the exhaustive kernel.
        budget = postings * MASK_WALK_COST if walk else float(postings)
        allowed = _gallop_rows(lengths, budget, mask, n_allowed, facts)
        if allowed is not None:
            return Plan(Kernel.GALLOP, n_allowed, allowed)
        if walk and restricted_on and not mask.flags.writeable and (
                n_allowed <= RESTRICT_MAX_SHARE * n_docs):
            return Plan(Kernel.RESTRICTED, n_allowed)
        if walk:
            return Plan(Kernel.MASK_WALK, n_allowed)
    if postings >= PRUNE_MIN_POSTINGS and lengths.shape[0] > 1 and not shared:
        return Plan(Kernel.PRUNED)
    return Plan(Kernel.EXHAUSTIVE)


def forced(kernel: Kernel, mask: np.ndarray | None, facts: MaskFacts) -> Plan:
    """The plan for a kernel the caller chose (its mask facts computed as ``choose`` would)."""
    if kernel in (Kernel.GENERAL, Kernel.TOUCHED):
        raise ValueError(f"the {kernel.value} kernel is chosen by the query, not forced")
    if kernel in MASKED_KERNELS:
        if mask is None:
            raise ValueError(f"the {kernel.value} kernel needs a mask")
        n_allowed = facts.count(mask)
        allowed = facts.rows(mask, n_allowed) if kernel is Kernel.GALLOP else None
        return Plan(kernel, n_allowed, allowed)
    return Plan(kernel)


def _gallop_rows(lengths: np.ndarray, budget: float, mask: np.ndarray, n_allowed: int,
                 facts: MaskFacts) -> np.ndarray | None:
    """The mask's sorted allowed rows when galloping is estimated cheaper than ``budget``
    exhaustive posting visits, else None (without listing rows that could not pay off)."""
    if n_allowed * GALLOP_COST >= budget:  # the cost is at least GALLOP_COST per allowed row
        return None
    if gallop_cost(lengths, n_allowed) >= budget:
        return None
    return facts.rows(mask, n_allowed)
