"""Observability: OpenTelemetry spans per search and stage, rolling percentiles, slow-query log.

Spans are emitted after a search finishes, from the stage intervals the timer already keeps,
so with tracing off the request path does no extra work. A degraded search's span lists what
it went without (``retrieval.degraded``); a search that raised has a span too, with error
status, the exception recorded and its type in ``retrieval.error``. OpenTelemetry is an
optional extra (``pip install 'retrieval[otel]'``); asking for tracing without it is a
configuration error.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from retrieval.latency import RollingLatency
from retrieval.models import SearchResult
from retrieval.request_path.timing import StageTimer

log = logging.getLogger("retrieval.slow_queries")


class TracingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="emit OpenTelemetry spans (needs the otel extra)")
    slow_query_ms: float | None = Field(None, gt=0, description="log searches slower than this")
    stats_window: int = Field(4096, ge=16, description="samples kept per stage for stats()")


class Observer:
    """Receives every finished search: rolling stats always, spans and slow log when asked;
    and every failed one (a span, when tracing is on)."""

    def __init__(self, config: TracingConfig, tracer: Any = None) -> None:
        self.config = config
        self.latency = RollingLatency(config.stats_window)
        self._tracer: Any = tracer if tracer is not None else (_otel_tracer() if config.enabled
                                                          else None)

    def observe(self, result: SearchResult, timer: StageTimer) -> None:
        self.latency.add(result.timings)
        if self._tracer is not None:
            self._emit(result, timer)
        slow = self.config.slow_query_ms
        if slow is not None and result.timings.get("total", 0.0) > slow:
            digest = hashlib.sha256(result.query.encode("utf-8", "replace")).hexdigest()[:12]
            log.warning("slow search %.2f ms (query sha %s, %d chars, cache %s/%s): %s",
                        result.timings["total"], digest, len(result.query), result.cache.result,
                        result.cache.embedding,
                        {k: round(v, 3) for k, v in result.timings.items()})

    @property
    def tracing(self) -> bool:
        """Whether spans are emitted (``tracing.enabled``)."""
        return self._tracer is not None

    def failed(self, error: BaseException, started_ns: int) -> None:
        """A search that raised: its span, marked as an error with the exception recorded
        (a trace missing its failed searches shows a service healthier than it is)."""
        if self._tracer is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span = self._tracer.start_span("retrieval.search", start_time=started_ns,
                                       attributes={"retrieval.error": type(error).__name__})
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
        span.end()

    def _emit(self, result: SearchResult, timer: StageTimer) -> None:
        start = timer.wall_start_ns
        end = start + int(result.timings.get("total", 0.0) * 1e6)
        attributes = {
            "retrieval.build_id": result.build_id,
            "retrieval.candidates": result.candidates,
            "retrieval.allowed": result.allowed,
            "retrieval.hits": len(result.hits),
            "retrieval.cache.result": result.cache.result,
            "retrieval.cache.embedding": result.cache.embedding,
            # what a degraded answer went without ("embed", "partial:<shard>", ...); an
            # answer all the same, so not an error status
            "retrieval.degraded": list(result.degraded),
        }
        span = self._tracer.start_span("retrieval.search", start_time=start, attributes=attributes)
        from opentelemetry import trace

        context = trace.set_span_in_context(span)
        for stage, offset_ms, duration_ms in timer.intervals:
            stage_start = start + int(offset_ms * 1e6)
            child = self._tracer.start_span(f"retrieval.{stage}", context=context,
                                            start_time=stage_start)
            child.end(end_time=stage_start + int(duration_ms * 1e6))
        span.end(end_time=end)


def _otel_tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(
            "tracing.enabled needs OpenTelemetry: pip install 'retrieval[otel]'"
        ) from exc
    return trace.get_tracer("retrieval")
