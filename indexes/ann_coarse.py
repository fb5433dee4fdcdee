"""The IVF lists a query probes, chosen as faiss' flat quantizer chooses them, for half its cost.

faiss scores a single query against every list centre in float32 (nlist x d x 4 bytes: 6 MB
at 1M passages, 4,000 lists) and keeps the best ``nprobe``. Here the centres are also kept in
8 bits a dimension (a range per dimension, as the re-rank store keeps vectors), a quarter of
the bytes, and scored from those first. Each 8-bit centre is within half a step of its
float32 one in every dimension, so an approximate score is within ``E = sum |q_j| step_j / 2``
of the exact one (plus the float32 rounding of the sum, bounded too). The ``nprobe``-th best
approximate score ``A`` then bounds the ``nprobe``-th best exact score from below by ``A - E``,
and a centre scored below ``A - 2E`` cannot reach it: only the centres at or above that line
(5 at the median at 1M passages, 16 at p95, 35 at most) are scored again in float32, and
the best ``nprobe`` of them are the lists faiss' own quantizer would choose (up to float32
rounding between lists whose scores all but tie). faiss then searches those lists as it would
have. At 1M passages the choice took about 0.11 ms instead of 0.22, and the search path's
dense stage 0.48 ms instead of 0.59 at the median (benchmarks/README.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from indexes.vectors import quantize_int8

# Relative float32 rounding of a sum of d non-negative terms is at most d * 2^-24; this is
# that bound for d up to 2048 with room to spare (the bound is added as a score margin).
_ROUNDING = 2048 * 2.0 ** -23


@njit(nogil=True, cache=True, fastmath=True)
def _approximate(codes_t, folded, bias):  # pragma: no cover - compiled
    """bias + sum_j codes_t[j, i] * folded[j] for every list i, float32 (nlist,); the codes are
    stored dimension-major so the inner loop runs over lists, in vector registers."""
    n_dims, n_lists = codes_t.shape
    out = np.full(n_lists, bias, dtype=np.float32)
    for j in range(n_dims):
        weight = folded[j]
        codes = codes_t[j]
        for i in range(n_lists):
            out[i] += np.float32(codes[i]) * weight
    return out


class CoarseLists:
    """Chooses the lists to probe from ``centres`` float32 (nlist, d), the IVF index's own
    quantizer vectors (kept as given, not copied: the float32 rows are read only for the few
    centres scored again)."""

    def __init__(self, centres: np.ndarray) -> None:
        self.centres = centres
        # The re-rank store's 8-bit quantization: centre ~= (code + 128) * step + low.
        codes, self.step, low = quantize_int8(centres)
        self.codes_t = np.ascontiguousarray(codes.T)
        self.offset = 128.0 * self.step + low
        # The half step is exact only if the codes were rounded to nearest: measured, not
        # assumed (a range of float32 rounding makes it a hair more).
        self.reach = np.abs(codes * self.step + self.offset - centres).max(axis=0)

    @property
    def n_lists(self) -> int:
        return int(self.centres.shape[0])

    def nearest(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` lists whose centres have the highest inner product with ``query``
        float32 (d,), best first: (list ids int64 (n,), exact float32 scores (n,))."""
        n = min(n, self.n_lists)
        folded = query * self.step
        bias = np.float32(query @ self.offset)
        approx = _approximate(self.codes_t, folded, bias)
        margin = float(np.abs(query) @ self.reach)
        margin += _ROUNDING * float(np.abs(folded).sum() * 128.0 + abs(bias))
        nth = np.partition(approx, approx.size - n)[approx.size - n]
        shortlist = np.flatnonzero(approx >= nth - 2.0 * margin)
        exact = self.centres[shortlist] @ query
        best = np.lexsort((shortlist, -exact))[:n]
        return shortlist[best], exact[best]  # fresh int64 and float32 arrays


def coarse_lists(index: Any) -> CoarseLists | None:
    """The ``CoarseLists`` of an IVF index whose quantizer is flat inner product (every IVF
    index this project builds); None for any other quantizer (faiss chooses, as before)."""
    import faiss

    quantizer = faiss.downcast_index(index.quantizer)
    if not isinstance(quantizer, faiss.IndexFlat) or (
            quantizer.metric_type != faiss.METRIC_INNER_PRODUCT) or quantizer.ntotal == 0:
        return None
    flat = faiss.rev_swig_ptr(quantizer.get_xb(), quantizer.ntotal * quantizer.d)
    # A view of faiss' own memory, alive as long as ``index`` (IvfDense holds both).
    coarse = CoarseLists(np.asarray(flat).reshape(quantizer.ntotal, quantizer.d))
    # The kernel's code loaded with the index, not by the first search (0.25 s in a fresh
    # process, mostly numba's own start).
    coarse.nearest(np.array(coarse.centres[0]), 1)
    return coarse


def search_lists(index: Any, query: np.ndarray, k: int, lists: np.ndarray,
                 scores: np.ndarray, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """faiss' search of ``index`` over the given ``lists`` (``nearest``'s answer) with
    ``params`` (its ``nprobe`` must be ``lists.size``; its selector filters rows):
    (scores float32 (1, k), rows int64 (1, k)), as ``index.search`` returns them. The C++
    method is called directly: faiss' Python wrapper of it refuses search parameters."""
    import faiss

    query = np.ascontiguousarray(query, dtype=np.float32)
    distances = np.empty((1, k), dtype=np.float32)
    labels = np.empty((1, k), dtype=np.int64)
    index.search_preassigned_c(1, faiss.swig_ptr(query), k, faiss.swig_ptr(lists),
                               faiss.swig_ptr(scores), faiss.swig_ptr(distances),
                               faiss.swig_ptr(labels), False, params)
    return distances, labels
