"""Postings restricted to a repeated filter's rows: BM25 work that follows the allowed rows.

A filter repeats (a user's access list, a tenant): its mask is the same read-only object from
the per-build mask cache for every search that uses it. The first search that meets a term
under such a mask keeps that term's postings restricted to the allowed rows (rows and impacts,
in posting order); later searches with the same filter read only those. A query's restricted
terms are joined into a small CSC and scored by the exhaustive kernel without a mask: the same
sums, in the same order, as the exhaustive kernel with the mask, so the same scores and ties.

Memory: a mask's restricted postings are at most its share of the query terms' postings (1% of
a term's postings for a 1% filter), held per mask under one byte budget for the index, least
recently used masks dropped first. Only masks allowing a small share are restricted
(``bm25_strategy.RESTRICT_MAX_SHARE``): above it a term's allowed postings cost nearly what
walking it does. Measured at 1M passages (``benchmarks.filters``): a repeated 1% filter's BM25
top C 0.209 ms p50 from restricted postings, 0.382 through the mask walk, 1.48 exhaustive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from indexes.bm25_kernels import top_rows
from indexes.mask_memo import MaskMemo

DEFAULT_BUDGET_BYTES = 64 << 20
_NO_MASK = np.zeros(1, dtype=np.bool_)


@njit(nogil=True, cache=True)
def restrict_term(indptr, rows, impacts, term, mask, n_allowed):  # pragma: no cover
    """(rows int32, impacts float32) of ``term``'s postings whose row ``mask`` allows, in one
    pass: no more than ``n_allowed`` (the mask's True count) of them can be allowed."""
    start, end = indptr[term], indptr[term + 1]
    # One slot more: after the last allowed posting the next ones still write at slot n.
    cap = min(end - start, n_allowed) + 1
    kept_rows = np.empty(cap, dtype=np.int32)
    kept_impacts = np.empty(cap, dtype=np.float32)
    n = 0
    for p in range(start, end):
        r = rows[p]
        if n == cap:  # n_allowed was short: a wrong count must not write past the end
            break
        kept_rows[n] = r
        kept_impacts[n] = impacts[p]
        n += mask[r]  # written always, kept when allowed: no branch on the mask
    if n == cap:
        raise ValueError("n_allowed is less than the mask's allowed rows")
    return kept_rows[:n].copy(), kept_impacts[:n].copy()


@dataclass
class _MaskTerms:
    """One mask's restricted postings by term."""

    terms: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    nbytes: int = 0


class RestrictedPostings:
    """Each read-only mask's restricted postings by term, under ``budget_bytes`` in all."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, max_masks: int = 64) -> None:
        self.budget_bytes = budget_bytes
        self._masks: MaskMemo[_MaskTerms] = MaskMemo(max_masks, budget_bytes,
                                                     lambda entry: entry.nbytes)

    def top_rows(self, indptr: np.ndarray, rows: np.ndarray, impacts: np.ndarray,
                 term_ids: np.ndarray, weights: np.ndarray, mask: np.ndarray, n_allowed: int,
                 k: int, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exhaustive kernel's top ``k`` under ``mask`` (read-only; ``n_allowed``: its
        True count), from restricted postings. Every impact of the query's terms must be
        positive, as for ``top_rows``."""
        if term_ids.shape[0] == 0:
            return top_rows(indptr, rows, impacts, term_ids, weights, _NO_MASK, False, k,
                            scratch)
        parts = [self._term(indptr, rows, impacts, int(t), mask, n_allowed) for t in term_ids]
        q_indptr = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([part[0].shape[0] for part in parts], out=q_indptr[1:])
        q_rows = np.concatenate([part[0] for part in parts])
        q_impacts = np.concatenate([part[1] for part in parts])
        local = np.arange(len(parts), dtype=np.int64)
        return top_rows(q_indptr, q_rows, q_impacts, local, weights, _NO_MASK, False, k, scratch)

    def _term(self, indptr: np.ndarray, rows: np.ndarray, impacts: np.ndarray, term: int,
              mask: np.ndarray, n_allowed: int) -> tuple[np.ndarray, np.ndarray]:
        entry = self._masks.get(mask)
        found = entry.terms.get(term) if entry is not None else None
        if found is None:
            found = restrict_term(indptr, rows, impacts, term, mask, n_allowed)
            self._masks.update(mask, lambda current: self._with(current, term, found))
        return found

    def _with(self, current: _MaskTerms | None, term: int,
              found: tuple[np.ndarray, np.ndarray]) -> _MaskTerms:
        """``current`` plus ``term`` while the budget allows (a term another thread kept first
        is equal; past the budget the mask's other terms are restricted per search)."""
        current = current or _MaskTerms()
        size = found[0].nbytes + found[1].nbytes
        if term not in current.terms and current.nbytes + size <= self.budget_bytes:
            current.terms[term] = found
            current.nbytes += size
        return current

    def stats(self) -> dict[str, int]:
        return {"masks": len(self._masks), "bytes": self._masks.weight}
