"""In-process LRU cache bounded by entry count and bytes, with absolute TTLs.

The embedded default: no network, so every operation is synchronous and O(1) per key under
one lock. Expired entries are dropped lazily when read or when LRU eviction reaches them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from indexes.lru import LRU
from retrieval.cache.base import Cache, CacheConfigError, CacheCounters, clean_items, ttl_to_ms

logger = logging.getLogger(__name__)

# Fixed per-entry overhead charged against max_bytes, so millions of tiny values cannot
# exceed the budget by their dict/tuple bookkeeping alone.
ENTRY_OVERHEAD_BYTES = 64


def entry_size(key: str, value: bytes) -> int:
    """Bytes charged against ``max_bytes`` for one entry."""
    return len(key) + len(value) + ENTRY_OVERHEAD_BYTES


class MemoryCache(Cache):
    """Thread-safe LRU with ``max_entries`` and ``max_bytes`` bounds and absolute TTLs."""

    in_process = True

    def __init__(
        self,
        max_entries: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise CacheConfigError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes < 1:
            raise CacheConfigError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (value, expires_at on the monotonic clock), under self._lock.
        self._data: LRU[str, tuple[bytes, float]] = LRU(
            max_entries, max_bytes, lambda key, entry: entry_size(key, entry[0]))
        self._counters = CacheCounters()
        self._evictions = 0
        self._expirations = 0

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        try:
            return self._get_many(keys)
        except Exception as exc:  # the contract: a cache read never raises
            logger.warning("memory cache read failed: %s: %s", type(exc).__name__, exc)
            self._counters.add(errors=1)
            return [None] * _safe_len(keys)

    def _get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        now = self._clock()
        with self._lock:
            for key in keys:
                out.append(self._get_locked(key, now))
        found = [value for value in out if value is not None]
        self._counters.add(
            hits=len(found),
            misses=len(out) - len(found),
            bytes_read=sum(len(value) for value in found),
        )
        return out

    def _get_locked(self, key: str, now: float) -> bytes | None:
        entry = self._data.get(key)  # reads refresh recency, never the TTL
        if entry is None:
            return None
        value, expires_at = entry
        if now >= expires_at:
            self._data.pop(key)
            self._expirations += 1
            return None
        return value

    def set_many(self, items: Mapping[str, bytes], ttl_seconds: float) -> None:
        try:
            self._set_many(items, ttl_seconds)
        except Exception as exc:  # the contract: a cache write never raises
            logger.warning("memory cache write failed: %s: %s", type(exc).__name__, exc)
            self._counters.add(errors=1)

    def _set_many(self, items: Mapping[str, bytes], ttl_seconds: float) -> None:
        ttl_ms = ttl_to_ms(ttl_seconds)
        clean = clean_items(items)
        dropped = len(items) - len(clean)
        if ttl_ms is None:
            self._counters.add(dropped_writes=len(items))
            return
        expires_at = self._clock() + ttl_ms / 1000.0
        written = 0
        with self._lock:
            for key, value in clean.items():
                if entry_size(key, value) > self.max_bytes:
                    # Would evict everything and still not fit; drop any older value too.
                    self._data.pop(key)
                    dropped += 1
                    continue
                self._evictions += self._data.put(key, (value, expires_at))
                written += len(value)
        self._counters.add(dropped_writes=dropped, bytes_written=written)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            extra = {
                "entries": len(self._data),
                "bytes": self._data.weight,
                "evictions": self._evictions,
                "expirations": self._expirations,
            }
        return {"backend": "memory", **self._counters.snapshot(), **extra}

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._data.clear()

    def close(self) -> None:
        self.clear()


def _safe_len(keys: Sequence[str]) -> int:
    try:
        return len(keys)
    except Exception:
        return 0
