"""Per-stage timing of one request, in milliseconds."""

from __future__ import annotations

import time


class StageTimer:
    """Records named stages; ``timings`` is what a SearchResult reports."""

    __slots__ = ("_start", "_last", "timings")

    def __init__(self) -> None:
        self._start = self._last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        """Close ``stage`` at now; it took the time since the previous lap."""
        now = time.perf_counter()
        self.timings[stage] = (now - self._last) * 1e3
        self._last = now

    def record(self, stage: str, milliseconds: float) -> None:
        """Record a stage timed elsewhere (e.g. in a worker thread)."""
        self.timings[stage] = milliseconds

    def skip_to_now(self) -> None:
        self._last = time.perf_counter()

    def finish(self) -> dict[str, float]:
        self.timings["total"] = (time.perf_counter() - self._start) * 1e3
        return self.timings
