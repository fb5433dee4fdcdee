"""Collapse concurrent identical cache misses in one process into a single computation.

When a popular query misses, every concurrent request for it would otherwise encode and search
at the same time (a stampede). ``SingleFlight.do`` lets the first caller (the leader) compute
while the others wait for its outcome. Nothing is remembered after the call finishes: caching
the result is the cache's job, this only de-duplicates work that is in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class _Call:
    """One in-flight computation and its outcome."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class SingleFlight:
    """Per-key de-duplication of concurrent calls; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call] = {}
        self._leaders = 0
        self._followers = 0

    def do(self, key: Hashable, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` once for all concurrent callers with ``key``; all get its result or error.

        Followers re-raise the leader's exception object itself, so every caller sees the same
        error type and message. A follower waits at most ``timeout`` seconds (None: until the
        leader ends), then runs ``fn`` itself: a caller's own deadline bounds its wait, however
        long the leader takes.
        """
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if call is None:
                call = self._calls[key] = _Call()
                self._leaders += 1
            else:
                self._followers += 1
        if leader:
            self._lead(key, call, fn)
        elif not call.done.wait(timeout):
            return fn()
        if call.error is not None:
            raise call.error
        result: T = call.result
        return result

    def _lead(self, key: Hashable, call: _Call, fn: Callable[[], T]) -> None:
        try:
            call.result = fn()
        except BaseException as exc:  # followers must be released even on KeyboardInterrupt
            call.error = exc
        finally:
            # Forget the key before waking followers: a caller arriving after this point
            # starts a fresh computation instead of receiving a finished, stale one.
            with self._lock:
                del self._calls[key]
            call.done.set()

    def stats(self) -> dict[str, int]:
        """``in_flight`` keys now; ``computed`` calls that ran fn; ``shared`` calls that waited."""
        with self._lock:
            return {
                "in_flight": len(self._calls),
                "computed": self._leaders,
                "shared": self._followers,
            }
