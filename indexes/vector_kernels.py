"""Re-rank products without a gathered copy: each candidate row is dotted with the query where
it lies in the store.

``VectorStore.scores`` gathered the rows first (``np.take``: 600 KB for 400 float32 rows of
384 dimensions), then multiplied the copy. Reading each row once where it lies instead took 400
cold rows of 1M from 0.208 to 0.109 ms at the median for float32 (int8, whose copy is a
quarter of the size: 0.106 to 0.097), and the union search path at 1M from 3.65 / 5.67 to
3.49 / 5.49 ms p50 / p95 (benchmarks/README.md, "Re-rank products read in place").

A row's sum may be reassociated (vector lanes) but every row takes the same instructions:
the last rows of a call reuse its final row to fill four, so a row's score has the same bits
wherever it stands in ``rows`` and whichever rows share its call, and a shard, a whole build
and an explanation agree on it (tests/test_vector_kernels.py). Only reassociation and fused
multiply-adds are allowed: NaN and infinity keep their IEEE meaning.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Rows summed side by side: four independent sums keep the vector units busy where one sum's
# adds wait on each other, and their loads overlap.
ROWS_AT_ONCE = 4


@njit(nogil=True, cache=True, inline="always")
def _row(rows, i, n_rows):  # pragma: no cover - compiled
    """``rows[i]`` as ``np.take`` reads it: a negative row counts from the end."""
    r = rows[i]
    return r + n_rows if r < 0 else r


@njit(nogil=True, cache=True)
def rows_in_range(rows, n_rows):  # pragma: no cover - compiled
    """Whether every row lies in ``-n_rows .. n_rows - 1`` (``np.take``'s range): ``dot_rows``
    reads unchecked."""
    for i in range(rows.shape[0]):
        if rows[i] >= n_rows or rows[i] < -n_rows:
            return False
    return True


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def dot_rows(matrix, rows, query, bias):  # pragma: no cover - compiled
    """float32 (m,): ``bias + sum_j matrix[rows[i], j] * query[j]`` per row. ``matrix``
    float32 or int8 (n, d), ``rows`` int (m,) within range (``rows_in_range``), ``query``
    float32 (d,). A call's last rows reuse its final row to fill the four (computed, not
    stored), so every row takes the same instructions."""
    m, d = rows.shape[0], query.shape[0]
    n_rows = matrix.shape[0]
    out = np.empty(m, dtype=np.float32)
    for i in range(0, m, ROWS_AT_ONCE):
        a = matrix[_row(rows, i, n_rows)]
        b = matrix[_row(rows, min(i + 1, m - 1), n_rows)]
        c = matrix[_row(rows, min(i + 2, m - 1), n_rows)]
        e = matrix[_row(rows, min(i + 3, m - 1), n_rows)]
        sa = sb = sc = se = np.float32(0.0)
        for j in range(d):
            w = query[j]
            sa += np.float32(a[j]) * w
            sb += np.float32(b[j]) * w
            sc += np.float32(c[j]) * w
            se += np.float32(e[j]) * w
        out[i] = sa + bias
        if i + 1 < m:
            out[i + 1] = sb + bias
        if i + 2 < m:
            out[i + 2] = sc + bias
        if i + 3 < m:
            out[i + 3] = se + bias
    return out

