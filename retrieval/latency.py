"""Latency summaries: p50/p95/p99/max per stage over many results."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

PERCENTILES = (50, 95, 99)


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max/mean of a list of milliseconds (empty -> zeros)."""
    if len(samples_ms) == 0:
        return {"n": 0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    values = np.asarray(samples_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(values, PERCENTILES)
    return {"n": int(values.size), "p50": float(p50), "p95": float(p95), "p99": float(p99),
            "max": float(values.max()), "mean": float(values.mean())}


def by_stage(timings: Iterable[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Summaries per stage name over many per-request timing dicts."""
    samples: dict[str, list[float]] = {}
    for timing in timings:
        for stage, ms in timing.items():
            samples.setdefault(stage, []).append(ms)
    return {stage: summarize(values) for stage, values in samples.items()}


def format_table(summary: Mapping[str, Mapping[str, float]], title: str = "stage") -> str:
    """A markdown table of p50/p95/p99/max in milliseconds."""
    lines = [f"| {title} | p50 ms | p95 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['p50']:.3f} | {s['p95']:.3f} | {s['p99']:.3f} | "
                     f"{s['max']:.3f} |")
    return "\n".join(lines)


class RollingLatency:
    """The last ``window`` samples per stage; thread-safe; percentiles on demand."""

    def __init__(self, window: int = 4096) -> None:
        self._lock = threading.Lock()
        self._window = window
        self._samples: dict[str, deque[float]] = {}

    def add(self, timings: Mapping[str, float]) -> None:
        with self._lock:
            for stage, ms in timings.items():
                samples = self._samples.get(stage)
                if samples is None:
                    samples = self._samples[stage] = deque(maxlen=self._window)
                samples.append(ms)

    def summary(self) -> dict[str, dict[str, float]]:
        with self._lock:
            copies = {stage: list(samples) for stage, samples in self._samples.items()}
        return {stage: summarize(values) for stage, values in copies.items()}
