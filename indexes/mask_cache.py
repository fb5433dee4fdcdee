"""Per-build memory for filter masks: a byte-bounded LRU, plus the kernel that fills them.

A ``MetadataIndex`` owns one ``MaskCache``, so masks never outlive or cross builds. Cached masks
are read-only: a caller that wrote into one would silently change later results.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import numpy as np
import numpy.typing as npt
from numba import njit

from indexes.lru import LRU

Mask = npt.NDArray[np.bool_]

DEFAULT_MAX_BYTES = 64 << 20  # 64 masks at 1M documents, 6 at 10M
DEFAULT_MAX_ENTRIES = 1024  # bounds the bookkeeping when masks are tiny


class MaskCache:
    """LRU of (read-only bool mask (n_docs,), its allowed count or None) by key, bounded by the
    masks' bytes and by entry count.

    Thread-safe: one lock around the dict operations (never held while a mask is computed, so
    two threads may compute the same mask once each; both results are equal).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._entries: LRU[Hashable, tuple[Mask, int | None]] = LRU(
            max_entries, max_bytes, lambda key, entry: entry[0].nbytes)
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return int(self._entries.max_weight or 0)

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        """A new bound applies from the next ``put`` on."""
        with self._lock:
            self._entries.max_weight = value

    @property
    def max_entries(self) -> int:
        return self._entries.max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        """A new bound applies from the next ``put`` on."""
        with self._lock:
            self._entries.max_entries = value

    def get(self, key: Hashable) -> tuple[Mask, int | None] | None:
        """(mask, allowed count if known) for ``key``, or None; a hit becomes most recent."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: Hashable, mask: Mask, count: int | None = None) -> Mask:
        """Remember ``mask`` (made read-only) and optionally its count under ``key``."""
        mask.flags.writeable = False
        if mask.nbytes > self.max_bytes:
            return mask
        with self._lock:
            self._entries.put(key, (mask, count))
        return mask

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @property
    def nbytes(self) -> int:
        return self._entries.weight

    def __len__(self) -> int:
        return len(self._entries)


@njit(nogil=True, cache=True)
def scatter_true(mask, rows):  # pragma: no cover - compiled
    """mask[rows] = True for int32 rows: 6x numpy's fancy assignment (no intp copy of rows).

    Bounds are checked (a well-predicted branch): a corrupt posting must raise, not write
    outside the mask.
    """
    n = mask.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0 or r >= n:
            raise IndexError("keyword posting row out of range; rebuild the index")
        mask[r] = True


@njit(nogil=True, cache=True)
def scatter_postings(mask, rows, offsets, value_ids):  # pragma: no cover - compiled
    """mask[rows[offsets[v]:offsets[v + 1]]] = True for every v >= 0 in ``value_ids``.

    mask bool (n_docs,); rows int32 (nnz,) and offsets int64 (n_values + 1,): one field's
    keyword postings; value_ids int64 (m,), -1 for values the field never holds. One call for a
    whole IN list: the OR of m posting lists costs their total length, not m kernel calls.
    """
    n = mask.shape[0]
    for i in range(value_ids.shape[0]):
        v = value_ids[i]
        if v < 0:
            continue
        for p in range(offsets[v], offsets[v + 1]):
            r = rows[p]
            if r < 0 or r >= n:
                raise IndexError("keyword posting row out of range; rebuild the index")
            mask[r] = True
