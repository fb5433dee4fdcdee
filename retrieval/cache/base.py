"""The ``Cache`` contract shared by the in-process and Redis backends.

A cache is an optimisation, never a dependency: ``get_many`` and ``set_many`` never raise.
Any failure is a miss (reads) or a dropped write, and is counted in ``stats()`` instead.
Values are opaque bytes (see ``codec``); keys come from ``keys`` and never hold user text.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple

from indexes.errors import RetrievalError
from retrieval.errors import ConfigError

logger = logging.getLogger(__name__)

COUNTER_NAMES = ("hits", "misses", "errors", "dropped_writes", "bytes_read", "bytes_written")


class CacheError(RetrievalError):
    """Root of cache errors; only construction/configuration raises, cache calls never do."""


class CacheConfigError(CacheError, ConfigError):
    """A cache setting is invalid; the message names the setting and how to fix it."""


class CacheCounters:
    """Thread-safe monotonic counters (``+=`` on attributes can lose updates across threads)."""

    def __init__(self, names: Sequence[str] = COUNTER_NAMES) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


# The longest TTL Redis accepts, with room to spare: ``SET ... PX`` and ``PEXPIRE`` add the
# current time in ms to the TTL, and refuse a sum past a signed 64-bit integer (~9.22e18 ms,
# so ~9.22e15 s less today's ~1.7e9 s). A longer TTL had every write refused, and dropped.
MAX_TTL_SECONDS = 9e15  # ~285 million years


def ttl_to_ms(ttl_seconds: float) -> int | None:
    """TTL in whole milliseconds (at least 1), or None when it is not a positive number of
    seconds up to ``MAX_TTL_SECONDS`` (a write Redis would refuse is dropped unsent)."""
    try:
        ttl = float(ttl_seconds)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(ttl) or ttl <= 0 or ttl > MAX_TTL_SECONDS:
        return None
    return max(1, round(ttl * 1000))


def check_ttl(ttl_seconds: float, key: str, error: type[ConfigError] = CacheConfigError
              ) -> float:
    """``ttl_seconds``, or ``error`` naming the setting ``key`` when Redis would refuse it."""
    if ttl_seconds > MAX_TTL_SECONDS:
        raise error(
            f"{key} must be at most {MAX_TTL_SECONDS:.0e} seconds (~285 million years), got "
            f"{ttl_seconds:g}: Redis refuses a longer expiry, so every write would be dropped",
            key)
    return ttl_seconds


def clean_items(items: Mapping[str, bytes]) -> dict[str, bytes]:
    """Keep only ``str -> bytes`` pairs; anything else is a caller bug we refuse to store."""
    return {
        key: bytes(value)
        for key, value in items.items()
        if isinstance(key, str) and isinstance(value, bytes | bytearray | memoryview)
    }


class WriteBatch(NamedTuple):
    """Items of one ``set_many`` call and their TTL in milliseconds."""

    items: dict[str, bytes]
    ttl_ms: int

    @property
    def size(self) -> int:
        """Bytes this batch holds while it waits (keys and values)."""
        return sum(len(key) + len(value) for key, value in self.items.items())


class BackgroundWriter:
    """One daemon thread draining a bounded queue of write batches into ``write_fn``.

    Remote backends use it so ``set_many`` never waits on the network; ``write_fn`` receives
    the batches queued so far (up to ``max_coalesce`` items) and must count its own errors.
    The queue holds at most ``maxsize`` batches and ``max_bytes`` bytes (``WriteBatch.size``,
    counted until written): by count alone, a server too slow to drain it let 1,024 results
    of k=1000 wait in memory, gigabytes.
    """

    def __init__(
        self,
        write_fn: Callable[[list[WriteBatch]], None],
        maxsize: int,
        max_coalesce: int = 512,
        name: str = "cache-writer",
        max_bytes: int | None = None,
    ) -> None:
        self._write_fn = write_fn
        self._max_coalesce = max_coalesce
        self._max_bytes = max_bytes
        self._bytes = 0  # held by batches submitted and not yet written, under _bytes_lock
        self._bytes_lock = threading.Lock()
        self._queue: queue.Queue[WriteBatch | None] = queue.Queue(maxsize=maxsize)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, batch: WriteBatch) -> bool:
        """Enqueue without blocking; False when the queue is full (batches or bytes)."""
        size = batch.size
        with self._bytes_lock:
            if self._max_bytes is not None and self._bytes + size > self._max_bytes:
                return False
            self._bytes += size
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._release(size)
            return False
        return True

    def _release(self, size: int) -> None:
        with self._bytes_lock:
            self._bytes -= size

    def pending(self) -> int:
        return self._queue.qsize()

    def pending_bytes(self) -> int:
        with self._bytes_lock:
            return self._bytes

    def flush(self, timeout: float) -> bool:
        """Wait until every submitted batch has been written (or dropped)."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._queue.all_tasks_done.wait(remaining)
        return True

    def close(self, timeout: float) -> None:
        """Write what is queued (bounded by ``timeout``), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return  # the daemon thread dies with the process
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                self._queue.task_done()
                return
            batches, stop = self._drain(first)
            try:
                self._write_fn(batches)
            except Exception:  # write_fn counts its own errors; the thread must survive
                logger.exception("cache writer failed unexpectedly")
            finally:
                self._release(sum(batch.size for batch in batches))
                for _ in batches:
                    self._queue.task_done()
            if stop:
                self._queue.task_done()
                return

    def _drain(self, first: WriteBatch) -> tuple[list[WriteBatch], bool]:
        """Coalesce already-queued batches into one pipeline; True when a stop was seen."""
        batches, commands = [first], len(first.items)
        while commands < self._max_coalesce:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return batches, True
            batches.append(nxt)
            commands += len(nxt.items)
        return batches, False


class Cache(ABC):
    """Bytes cache with absolute TTLs (set on write, never refreshed by reads)."""

    # True when reads never wait on I/O (an in-process cache): an event loop may call them.
    in_process = False

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values for ``keys`` in input order, None for misses; one round trip; never raises."""

    def get_many_within(self, keys: Sequence[str], timeout: float | None
                        ) -> list[bytes | None]:
        """``get_many``, waiting for it at most ``timeout`` seconds (None: no bound); past
        it, misses. An in-process cache never waits on I/O, so it reads whatever is left."""
        return self.get_many(keys)

    @abstractmethod
    def set_many(self, items: Mapping[str, bytes], ttl_seconds: float) -> None:
        """Store ``items`` for ``ttl_seconds``; never raises and never blocks on the network."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters (hits, misses, errors, dropped_writes, bytes_read, bytes_written, ...)."""

    @abstractmethod
    def close(self) -> None:
        """Release threads, connections and memory; later calls stay safe and never raise."""

    def flush_writes(self, timeout: float = 5.0) -> bool:
        """Wait until queued writes are applied (tests); True when nothing is pending."""
        return True

    def probe(self) -> bool:
        """At load: can the backend be reached? Raises ``ConfigError`` for bad credentials."""
        return True

    def __enter__(self) -> Cache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
