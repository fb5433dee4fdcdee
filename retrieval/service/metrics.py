"""Prometheus metrics, aggregated over worker processes (prometheus-client multiprocess mode).

Every worker writes its samples to files under ``PROMETHEUS_MULTIPROC_DIR`` (``retrieval
serve`` sets and empties it before the workers start); ``/metrics`` on any worker merges all of
them. Names share the ``retrieval_`` prefix; durations are in seconds with sub-millisecond
buckets (a cache hit takes tens of microseconds inside the retriever).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

from retrieval.models import SearchResult

PREFIX = "retrieval"
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
                   0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MAX_CACHED_CHILDREN = 1024
BREAKER_STATES = ("closed", "open", "half_open")


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def observe_refused(status: int, seconds: float, route: str = "other",
                    method: str = "other") -> None:
    """A request the protocol answered itself: 431 (its head too large) and 408 (too slow)
    under route and method "other", for it never had a whole head to name them; 503 past
    ``server.max_connections`` under its own."""
    if ServiceMetrics.latest is not None:
        ServiceMetrics.latest.observe_request(route, method, status, seconds)


# The request counter's method label: the standard methods, anything else "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


class WorkerFiles:
    """prometheus-client's multiprocess collector over the workers' files, less those still at
    0 bytes. A worker creates its file before sizing it; a scrape in between failed on it
    (``struct.error``), and a worker killed in between left it empty for good, so every later
    scrape failed (prometheus/client_python#1199, open). An empty file holds no sample yet."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Any:
        files = []
        for name in sorted(glob.glob(os.path.join(self._path, "*.db"))):
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except FileNotFoundError:  # a dead worker's live gauges, removed meanwhile
                continue
        return prometheus_multiprocess.MultiProcessCollector.merge(  # type: ignore[no-untyped-call]
            files, accumulate=True)


class ServiceMetrics:
    """The service's metrics. Outside multiprocess mode they live in a private registry."""

    # The app's, for requests the protocol refuses before the app sees them: a second
    # counter of the same name would overwrite this one's samples in the worker's file.
    latest: ClassVar[ServiceMetrics | None] = None

    def __init__(self) -> None:
        shared = multiprocess_dir() is not None
        self._own = None if shared else CollectorRegistry()
        reg: Any = self._own  # None in multiprocess mode: samples go to the shared files
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests by route, method and "
                                "status", ["route", "method", "status"], registry=reg)
        self.request_seconds = Histogram(
            f"{PREFIX}_http_request_duration_seconds", "Time from request start to the last "
            "response byte, by route", ["route"], buckets=LATENCY_BUCKETS, registry=reg)
        self.stage_seconds = Histogram(
            f"{PREFIX}_search_stage_duration_seconds", "Retriever time per pipeline stage "
            "(total = the whole search)", ["stage"], buckets=LATENCY_BUCKETS, registry=reg)
        self.cache_lookups = Counter(f"{PREFIX}_cache_lookups", "Result and embedding cache "
                                     "lookups by outcome", ["cache", "outcome"], registry=reg)
        self.degraded = Counter(f"{PREFIX}_search_degraded", "Searches answered without a "
                                "stage, by what they lacked (embed: ranked by BM25 alone, "
                                "features, partial: a shard left out)", ["reason"],
                                registry=reg)
        self.cache_errors = Counter(f"{PREFIX}_cache_errors", "Cache backend errors (served "
                                    "as misses)", registry=reg)
        self.breaker = Gauge(f"{PREFIX}_cache_breaker_state", "1 for the circuit breaker's "
                             "current state", ["state"], multiprocess_mode="livemax",
                             registry=reg)
        self.reloads = Counter(f"{PREFIX}_reloads", "Build reloads by outcome (loaded, refused)",
                               ["outcome"], registry=reg)
        self.build_info = Gauge(f"{PREFIX}_build_info", "1 for the build a worker serves",
                                ["build_id"], multiprocess_mode="livemax", registry=reg)
        self.ready_workers = Gauge(f"{PREFIX}_ready_workers", "Workers that are ready",
                                   multiprocess_mode="livesum", registry=reg)
        # Labelled children by label values: ``labels()`` takes a lock and builds a key each
        # call, a third of the cost of recording a cache hit's metrics.
        self._children: dict[tuple[object, ...], Any] = {}
        self._seen_errors = 0
        self._seen_reloads = 0
        self._build_id: str | None = None
        ServiceMetrics.latest = self

    # -- per request ----------------------------------------------------------------------

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        # Any client picks the method: one it made up is "other", or each would be a series.
        method = method if method in HTTP_METHODS else "other"
        self._child(self.requests, route, method, status).inc()
        self._child(self.request_seconds, route).observe(seconds)

    def observe_result(self, result: SearchResult) -> None:
        for stage, ms in result.timings.items():
            self._child(self.stage_seconds, stage).observe(ms / 1000.0)
        for cache, status in (("result", result.cache.result),
                              ("embedding", result.cache.embedding)):
            if status in ("hit", "miss"):
                self._child(self.cache_lookups, cache, status).inc()
        for reason in result.degraded:  # "partial:<shard>" counts as "partial": few series
            self._child(self.degraded, reason.split(":")[0]).inc()

    def _child(self, metric: Any, *values: object) -> Any:
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*(str(v) for v in values))
            if len(self._children) < MAX_CACHED_CHILDREN:  # label values a client chose
                self._children[key] = child
        return child

    # -- from Retriever.stats() -----------------------------------------------------------

    def sync(self, stats: Mapping[str, Any], reload_events: list[dict[str, Any]]) -> None:
        """Bring the counters that only the retriever knows up to date (deltas since last)."""
        backend = (stats.get("cache") or {}).get("backend") or {}
        errors = int(backend.get("errors", 0))
        if errors > self._seen_errors:
            self.cache_errors.inc(errors - self._seen_errors)
        self._seen_errors = max(errors, self._seen_errors)
        state = backend.get("breaker_state")
        for name in BREAKER_STATES:
            self.breaker.labels(name).set(1.0 if state == name else 0.0)
        # The first event is the initial load, not a reload.
        for event in reload_events[1 + self._seen_reloads:]:
            self.reloads.labels(event["event"]).inc()
        self._seen_reloads = max(len(reload_events) - 1, 0)
        self.set_build(str(stats["build_id"]))

    def set_build(self, build_id: str) -> None:
        if build_id == self._build_id:
            return
        if self._build_id is not None:
            self.build_info.labels(self._build_id).set(0.0)
        self.build_info.labels(build_id).set(1.0)
        self._build_id = build_id

    # -- exposition -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The text format, merged over all workers in multiprocess mode."""
        if self._own is not None:
            return generate_latest(self._own)
        registry = CollectorRegistry()
        registry.register(WorkerFiles(multiprocess_dir() or ""))
        return generate_latest(registry)

    @staticmethod
    def process_exited() -> None:
        """Drop this worker's live gauges (ready, build, breaker) from the merged view."""
        if multiprocess_dir() is not None:
            prometheus_multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
