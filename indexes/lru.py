"""``LRU``: the one least-recently-used map of the project, bounded by entries and weight.

Not locked: every user already holds its own lock around several calls that must be atomic
together (read, check a TTL, drop), so a lock in here would be taken twice for nothing. Callers
that share an ``LRU`` between threads serialize their calls.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_entries`` entries whose ``weigh(key, value)`` sum is at most
    ``max_weight`` (no weight bound when it is None); the least recently used go first."""

    def __init__(self, max_entries: int, max_weight: int | None = None,
                 weigh: Callable[[K, V], int] | None = None) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        if (max_weight is None) != (weigh is None):
            raise ValueError("max_weight and weigh go together")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> int:
        """Insert or replace ``key`` as the most recently used; returns how many entries were
        evicted to stay within the bounds (the new entry itself, if it alone is too heavy)."""
        self.pop(key)
        self._entries[key] = value
        if self._weigh is not None:
            self.weight += self._weigh(key, value)
        evicted = 0
        while self._entries and self._over():
            self.pop(next(iter(self._entries)))
            evicted += 1
        return evicted

    def pop(self, key: K) -> V | None:
        value = self._entries.pop(key, None)
        if value is not None and self._weigh is not None:
            self.weight -= self._weigh(key, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
        self.weight = 0

    def _over(self) -> bool:
        if len(self._entries) > self.max_entries:
            return True
        return self.max_weight is not None and self.weight > self.max_weight
