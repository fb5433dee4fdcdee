"""Numba kernel of the typo dictionary (``indexes.typos``): the 64-bit keys of a word and of
every string made by deleting up to ``edits`` of its letters, in one compiled pass over all
the corpus's words (the Python loop took ~5.5 us a deletion: 7 s at 111k passages)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from indexes.analysis_kernels import FNV_OFFSET, FNV_PRIME


@njit(nogil=True, cache=True, inline="always")
def _key(code_points, start, end, skip_a, skip_b):  # pragma: no cover - compiled
    """FNV-1a over the code points of ``start..end`` but ``skip_a`` and ``skip_b``."""
    h = FNV_OFFSET
    for i in range(start, end):
        if i != skip_a and i != skip_b:
            h = (h ^ np.uint64(code_points[i])) * FNV_PRIME
    return h


@njit(nogil=True, cache=True)
def deletion_keys(code_points, offsets, edits):  # pragma: no cover - compiled
    """(keys uint64, word ids int32): word w (``code_points[offsets[w]:offsets[w + 1]]``) and
    its deletions of up to ``edits[w]`` (0-2) letters, each distinct key once per word."""
    n_words = offsets.shape[0] - 1
    total = 0
    for w in range(n_words):
        n = offsets[w + 1] - offsets[w]
        total += 1 + (n if edits[w] >= 1 else 0) + (n * (n - 1) // 2 if edits[w] >= 2 else 0)
    keys = np.empty(total, dtype=np.uint64)
    ids = np.empty(total, dtype=np.int32)
    m = 0
    for w in range(n_words):
        start, end = offsets[w], offsets[w + 1]
        first = m
        keys[m] = _key(code_points, start, end, -1, -1)
        m += 1
        for i in range(start, end if edits[w] >= 1 else start):
            keys[m] = _key(code_points, start, end, i, -1)
            m += 1
            for j in range(i + 1, end if edits[w] >= 2 else i + 1):
                keys[m] = _key(code_points, start, end, i, j)
                m += 1
        distinct = np.unique(keys[first:m])
        m = first + distinct.shape[0]
        keys[first:m] = distinct
        ids[first:m] = w
    return keys[:m].copy(), ids[:m].copy()


def word_keys(words: Sequence[str], edits: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``deletion_keys`` of Python strings (a word's letters are its code points)."""
    code_points = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32)
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=offsets[1:])
    return deletion_keys(code_points, offsets, np.asarray(edits, dtype=np.int8))
