"""Every vector's nearest IVF list, for filling the dense leg's lists at build time.

Filling is one product of ``n x nlist x d`` multiply-adds: 1.5e12 at 1M vectors and 4,000
lists, which float32 BLAS (faiss' own ``add``) took 13 s of a 68 s build on 2 cores. CPUs
with bfloat16 matrix units (AMX, AVX512-BF16) make the same product 4x faster, but bfloat16
keeps 8 significant bits, so its best list is not always the nearest. It serves as a
shortlist: rounding each factor and the result to bfloat16 moves a score by at most
``bf16_error(d) * |x| * |c|``, so every list whose bfloat16 score plus its bound reaches the
highest bfloat16 score less its bound may be the nearest: those few (6 a row on clustered
vectors at 4,000 lists) are scored again in float32. The list chosen is float32's nearest,
as it was.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import numpy as np
from numba import njit

from indexes.ann_train import nearest
from indexes.cpu import usable_cores


def bf16_error(dim: int) -> float:
    """Bound on |bfloat16 score - exact score| / (|x| |c|) for ``dim``-long vectors: each
    factor rounds by 2^-8, so their product by 2^-7 of |x_i c_i|; the float32 accumulation
    adds at most ~dim 2^-24 of the sum (doubled here), and rounding the result to bfloat16 2^-8
    of |score|. Cauchy-Schwarz bounds sum |x_i c_i| and |score| by |x| |c|. (On 16,384 clustered
    vectors against 4,000 lists the largest error seen was a tenth of this bound.)"""
    return 2.0 ** -7 + 2.0 ** -8 + dim * 2.0 ** -23


BLOCK = 16_384  # rows scored at once: a bfloat16 block of scores is 131 MB at 4,000 lists
# Below this many multiply-adds (n x nlist x d) float32 takes under a second: no bfloat16.
BF16_FROM = 10 ** 11
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@cache
def bf16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (Linux reports the flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: assume not, float32 stays exact and fast enough
        return False
    return any(flag in flags for flag in BF16_FLAGS)


def nearest_lists(vectors: np.ndarray, centroids: np.ndarray, *, bf16: bool | None = None
                  ) -> tuple[np.ndarray, str]:
    """Each row's highest inner-product centroid (int64) and how it was found
    (``"bf16 shortlist"`` or ``"float32"``). ``bf16`` None decides by the CPU and the size."""
    if bf16 is None:
        bf16 = bf16_units() and vectors.size * len(centroids) >= BF16_FROM
    if not bf16:
        return nearest(vectors, centroids), "float32"
    return shortlisted_nearest(vectors, centroids), "bf16 shortlist"


def shortlisted_nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """``nearest``'s answer, each block of rows scored in bfloat16, then its shortlist in
    float32 by ``pick_nearest`` over the cores."""
    import torch

    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    half_centroids = torch.from_numpy(centroids).bfloat16().T.contiguous()
    slack = (bf16_error(centroids.shape[1]) * np.linalg.norm(centroids, axis=1)
             ).astype(np.float32)
    out = np.empty(len(vectors), dtype=np.int64)
    parts = usable_cores()
    with ThreadPoolExecutor(parts, thread_name_prefix="assign") as pool:
        for start in range(0, len(vectors), BLOCK):
            block = np.ascontiguousarray(vectors[start:start + BLOCK], dtype=np.float32)
            scores = torch.from_numpy(block).bfloat16() @ half_centroids
            bits = scores.view(torch.int16).numpy().view(np.uint16)
            norms = np.linalg.norm(block, axis=1).astype(np.float32)
            answer = out[start:start + len(block)]
            edges = np.linspace(0, len(block), parts + 1).astype(np.int64)
            for done in [pool.submit(pick_nearest, bits, block, centroids, slack, norms,
                                     answer, first, last)
                         for first, last in zip(edges[:-1], edges[1:], strict=True)]:
                done.result()
    return out


@njit(nogil=True, cache=True, fastmath=True)
def pick_nearest(bits, vectors, centroids, slack, norms, out, first, last):  # pragma: no cover
    """For rows ``first:last``: out[i] = the centroid j of highest float32 inner product among
    those whose bfloat16 score (``bits``, uint16) plus its error bound ``norms[i] * slack[j]``
    reaches the row's highest bfloat16 score less its bound."""
    lists, dim = centroids.shape
    wide = np.empty(lists, dtype=np.uint32)
    scores = wide.view(np.float32)
    shortlist = np.empty(lists, dtype=np.int64)
    for i in range(first, last):
        for j in range(lists):
            wide[j] = np.uint32(bits[i, j]) << np.uint32(16)  # bfloat16 = float32's top half
        norm = norms[i]
        floor = scores[0] - norm * slack[0]
        for j in range(1, lists):
            floor = max(floor, scores[j] - norm * slack[j])
        listed = 0
        for j in range(lists):
            if scores[j] + norm * slack[j] >= floor:
                shortlist[listed] = j
                listed += 1
        best, arg = -np.inf, -1
        for t in range(listed):
            j = shortlist[t]
            score = np.float32(0.0)
            for k in range(dim):
                score += vectors[i, k] * centroids[j, k]
            if score > best:
                best, arg = score, j
        out[i] = arg
