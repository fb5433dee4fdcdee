"""Per-stage timing of one request, in milliseconds, with offsets for trace spans."""

from __future__ import annotations

import time


class StageTimer:
    """Records named stages; ``timings`` is what a SearchResult reports.

    ``intervals`` keeps (stage, start offset ms, duration ms) so spans can be emitted after the
    fact: tracing costs nothing while the request runs.
    """

    __slots__ = ("_start", "_last", "timings", "intervals", "wall_start_ns")

    def __init__(self, before_ms: float = 0.0) -> None:
        """``before_ms``: work done for the request before this timer started (a batch's
        shared encode), counted in its ``total``."""
        self.wall_start_ns = time.time_ns() - int(before_ms * 1e6)
        self._last = time.perf_counter()
        self._start = self._last - before_ms / 1e3
        self.timings: dict[str, float] = {}
        self.intervals: list[tuple[str, float, float]] = []

    def lap(self, stage: str) -> None:
        """Close ``stage`` at now; it took the time since the previous lap."""
        now = time.perf_counter()
        duration = (now - self._last) * 1e3
        self.timings[stage] = duration
        self.intervals.append((stage, (self._last - self._start) * 1e3, duration))
        self._last = now

    def record(self, stage: str, milliseconds: float, start_offset_ms: float | None = None) -> None:
        """Record a stage timed elsewhere (e.g. in a worker thread)."""
        self.timings[stage] = milliseconds
        if start_offset_ms is None:
            start_offset_ms = max(0.0, (self._last - self._start) * 1e3 - milliseconds)
        self.intervals.append((stage, start_offset_ms, milliseconds))

    def finish(self) -> dict[str, float]:
        self.timings["total"] = (time.perf_counter() - self._start) * 1e3
        return self.timings
