"""Each vector's nearest IVF list, found from 8-bit products and confirmed in float32.

Filling the IVF lists means scoring every vector against every list centre: at 1M passages
(4,000 lists, 384 dimensions) 1.5e12 multiply-adds, which faiss' flat quantizer does in
float32 at about a core's peak (27.6 s of a 1M build's dense leg). An 8-bit product of the
same matrices (``torch._int_mm``, which oneDNN runs on the core's int8 dot-product
instructions) plus the second look below filled the lists of 1M clustered vectors in
10.7-12.4 s on one core, against 33.5-33.7 s for faiss' ``add`` (AMD EPYC with AVX-512 VNNI,
the two alternated in one process).

The 8-bit scores are exact integers, and how far they can be from the float32 ones is known
for each row. A row is kept in 8 bits with its own scale ``s`` (``x ~= s * codes``, off by
at most ``s / 2`` a dimension) and the centres with one shared scale ``t`` (off by at most
``err`` a dimension, measured). Then for every centre ``c``

    |x.c - s t (codes_x . codes_c)| <= |x|_1 err + (s / 2) max_c |t codes_c|_1 = E

and the centre with the best float32 score is never more than ``2E`` below the best 8-bit one.
Only the centres within ``2E`` of the row's best 8-bit score are scored again in float32 (of
4,000 lists, on 131,072 clustered vectors: 7 at the median, 11 at p95, 19 at most), and the
best of them is the list faiss' own quantizer chooses (up to float32 rounding between
centres whose scores all but tie).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from numba import njit

from indexes.ann_built import Rebalance, stay
from indexes.cpu import cpu_flags

# Rows scored at once: 512-2,048 rows (at 4,000 lists a 32 MB block of int32 scores, this
# host's last-level cache) ran the product twice as fast as 4,096 rows or more.
BLOCK = 2048
# Rows filled at once (faiss' own add goes by 65,536 too); the thread count may change between.
FILL_CHUNK = 65_536
# Below this many multiply-adds (rows x lists x dimensions) faiss' float32 assignment takes
# under about 2 s, about what importing torch costs a process that has not loaded it.
MIN_WORK = 10**11
# Slack added to the bound for float32 rounding in the scales and the float32 scores.
_SLACK = 1e-6


@njit(nogil=True, cache=True, fastmath=True)
def _quantize_rows(rows, codes, scales, l1):  # pragma: no cover - compiled
    """codes[r] = round(rows[r] / scales[r]) with scales[r] = max |rows[r]| / 127 (1 for a
    zero row); l1[r] = sum |rows[r]|."""
    for r in range(rows.shape[0]):
        row = rows[r]
        peak = np.float32(0.0)
        total = np.float32(0.0)
        for j in range(row.shape[0]):
            value = abs(row[j])
            total += value
            peak = max(peak, value)
        scale = peak / np.float32(127.0) if peak > 0 else np.float32(1.0)
        inverse = np.float32(1.0) / scale
        for j in range(row.shape[0]):
            codes[r, j] = np.int8(np.rint(row[j] * inverse))
        scales[r] = scale
        l1[r] = total


@njit(nogil=True, cache=True, fastmath=True)
def _dot(a, b):  # pragma: no cover - compiled
    total = np.float32(0.0)
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@njit(nogil=True, cache=True)
def _confirm(scores, margins, rows, centres, out):  # pragma: no cover - compiled
    """out[r]: of the centres whose 8-bit score is within margins[r] of row r's best, the one
    with the highest float32 inner product with rows[r] (the lowest id among equals).
    Chunks of 128 scores are counted against the line first (a vectorized count): only a
    chunk holding a candidate is read one by one."""
    for r in range(scores.shape[0]):
        row = scores[r]
        best = row[0]
        for j in range(row.shape[0]):
            best = max(best, row[j])
        line = best - margins[r]
        chosen, chosen_score = -1, np.float32(-np.inf)
        for start in range(0, row.shape[0], 128):
            chunk = row[start:start + 128]
            hits = 0
            for j in range(chunk.shape[0]):
                hits += np.int32(chunk[j] >= line)
            if hits == 0:
                continue
            for j in range(chunk.shape[0]):
                if chunk[j] >= line:
                    score = _dot(rows[r], centres[start + j])
                    if score > chosen_score or chosen < 0:
                        chosen, chosen_score = start + j, score
        out[r] = chosen


class CentreCodes:
    """``centres`` float32 (nlist, d) in 8 bits with one shared scale, and the bound's
    centre-side terms."""

    def __init__(self, centres: np.ndarray) -> None:
        import torch

        self.centres = np.ascontiguousarray(centres, dtype=np.float32)
        peak = float(np.abs(self.centres).max())
        self.scale = peak / 127.0 if peak > 0 else 1.0
        codes = np.rint(self.centres / self.scale).astype(np.int8)
        self.err = float(np.abs(self.centres - codes * np.float32(self.scale)).max())
        self.l1 = float((np.abs(codes.astype(np.float32)) * self.scale).sum(axis=1).max())
        self.codes_t = torch.from_numpy(np.ascontiguousarray(codes.T))

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """Each row's nearest centre (int64), ``BLOCK`` rows at a time."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        out = np.empty(len(vectors), dtype=np.int64)
        for start in range(0, len(vectors), BLOCK):
            self.nearest(vectors[start:start + BLOCK], out[start:start + BLOCK])
        return out

    def nearest(self, vectors: np.ndarray, out: np.ndarray) -> None:
        """``out[i]``: the nearest centre of ``vectors[i]`` (float32 (m, d), m <= BLOCK)."""
        import torch

        codes = np.empty(vectors.shape, dtype=np.int8)
        scales = np.empty(len(vectors), dtype=np.float32)
        l1 = np.empty(len(vectors), dtype=np.float32)
        _quantize_rows(vectors, codes, scales, l1)
        scores = torch._int_mm(torch.from_numpy(codes), self.codes_t).numpy()
        bound = (l1.astype(np.float64) * self.err + scales * 0.5 * self.l1) * (1 + 1e-3)
        margins = np.ceil((2 * bound + _SLACK) / (scales * self.scale)).astype(np.int64) + 1
        _confirm(scores, margins, vectors, self.centres, out)


def add_to_lists(index: Any, matrix: np.ndarray, min_work: int = MIN_WORK,
                 rebalance: Rebalance = stay) -> None:
    """``index.add(matrix)`` for an IVF index, with the lists chosen from 8-bit products
    (``CentreCodes``) where ``fills_from_8bit`` says so; faiss encodes and appends the vectors
    as its own ``add`` does. Rows go
    in by ``FILL_CHUNK``, ``rebalance`` called before each (it may change the calling
    thread's faiss thread count, which the 8-bit products keep to as well)."""
    codes = centre_codes(index) if fills_from_8bit(index, len(matrix), min_work) else None
    for start in range(0, len(matrix), FILL_CHUNK):
        rebalance()
        chunk = matrix[start:start + FILL_CHUNK]
        if codes is None:
            index.add(chunk)
        else:
            fill_chunk(index, codes, chunk)


def centre_codes(index: Any) -> CentreCodes:
    """The 8-bit codes of ``index``'s list centres (its quantizer flat inner product)."""
    import faiss

    quantizer = faiss.downcast_index(index.quantizer)
    if not isinstance(quantizer, faiss.IndexFlat):
        raise TypeError(f"the 8-bit fill reads a flat quantizer's centres, not a "
                        f"{type(quantizer).__name__}'s: fill this index with add_to_lists")
    centres = faiss.rev_swig_ptr(quantizer.get_xb(), quantizer.ntotal * quantizer.d)
    return CentreCodes(np.asarray(centres).reshape(quantizer.ntotal, quantizer.d))


def fill_chunk(index: Any, codes: CentreCodes, matrix: np.ndarray) -> None:
    """``matrix``'s rows appended to their nearest lists, found by ``codes``."""
    import faiss

    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    with torch_threads(faiss.omp_get_max_threads()):
        lists = codes.assign(matrix)
    index.add_core(len(matrix), faiss.swig_ptr(matrix), None, faiss.swig_ptr(lists))


def fills_from_8bit(index: Any, n_rows: int, min_work: int = MIN_WORK) -> bool:
    """Whether ``add_to_lists`` finds the lists from 8-bit products: at least ``min_work``
    multiply-adds, a flat inner-product quantizer and a CPU with AVX-512 VNNI
    (``int8_products_fast``)."""
    import faiss

    quantizer = faiss.downcast_index(index.quantizer)
    return (n_rows * index.nlist * index.d >= min_work and isinstance(quantizer, faiss.IndexFlat)
            and quantizer.metric_type == faiss.METRIC_INNER_PRODUCT and int8_products_fast())


def int8_products_fast() -> bool:
    """Whether this CPU has AVX-512 VNNI, where oneDNN runs ``torch._int_mm`` at ~4x faiss'
    float32 rate. Without it (AVX2 alone) the product took 3.3 s a block of 2,048 rows at
    4,000 lists, 40x faiss' assignment (AMD EPYC Zen 3); onnxruntime's 8-bit product
    (u8 x s8) ran there at 1.3x faiss' float32 rate, too little to pay for the second look.
    Read from the kernel's CPU flags (importing torch to ask it took 1-2 s of a build that
    then did not use it); where there are none (not Linux), no."""
    return "avx512_vnni" in cpu_flags()


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's thread count set to ``threads`` for the block, then restored. torch keeps one
    count for the whole process (unlike faiss' OpenMP count, per thread), so torch work
    elsewhere in the process meanwhile runs on that count too."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
