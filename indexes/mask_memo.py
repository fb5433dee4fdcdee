"""``MaskMemo``: values derived from read-only masks, remembered by the mask's identity.

A filter's mask is shared through the per-build mask cache, so a BM25 index sees the same
read-only array for every search under that filter: what it derives from the mask (allowed
rows, their count, restricted postings) is computed once. A weak reference proves an entry's
mask is still the same object (an id can be reused once the mask is freed). Writable masks
are never remembered: their owner may change them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from indexes.lru import LRU

V = TypeVar("V")


class MaskMemo(Generic[V]):
    """At most ``size`` masks' values (and ``max_weight`` of ``weigh(value)`` when given),
    least recently used dropped first."""

    def __init__(self, size: int = 32, max_weight: int | None = None,
                 weigh: Callable[[V], int] | None = None) -> None:
        weigh_entry = None if weigh is None else (
            lambda _key, entry: weigh(entry[1]))  # type: ignore[misc]
        self._entries: LRU[int, tuple[weakref.ref, V]] = LRU(size, max_weight, weigh_entry)
        self._lock = threading.Lock()

    def get(self, mask: np.ndarray) -> V | None:
        with self._lock:
            return self._get(mask)

    def put(self, mask: np.ndarray, value: V) -> None:
        if not mask.flags.writeable:
            with self._lock:
                self._entries.put(id(mask), (weakref.ref(mask), value))

    def update(self, mask: np.ndarray, change: Callable[[V | None], V]) -> None:
        """Replace the mask's value by ``change(current or None)``, atomically and re-weighed
        (``change`` may modify the current value in place and return it)."""
        if mask.flags.writeable:
            return
        with self._lock:
            entry = self._entries.pop(id(mask))  # out at its old weight, back in at the new
            current = entry[1] if entry is not None and entry[0]() is mask else None
            self._entries.put(id(mask), (weakref.ref(mask), change(current)))

    def _get(self, mask: np.ndarray) -> V | None:
        entry = self._entries.get(id(mask))
        return entry[1] if entry is not None and entry[0]() is mask else None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def weight(self) -> int:
        return self._entries.weight
