"""What observability costs per search: ``python -m benchmarks.tracing``.

On SciFact, with query vectors given so that the search path (filter, BM25, re-rank, fuse,
hydrate) is what is timed, side by side in one run:

- tracing off (the default): the request path only appends its stage timings to the rolling
  percentiles behind ``stats()``;
- tracing on: the OpenTelemetry SDK with a ``BatchSpanProcessor`` (spans exported from a
  background thread, as in production) into an in-memory exporter; one span per search and
  one per stage.

It also times the observer call alone with tracing off, which is everything observability adds
to a search when spans are off.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from benchmarks.throughput import FILTER, index_root
from indexes.corpus import read_queries
from indexes.encoders import SentenceTransformerEncoder
from indexes.onnx_encoder import make_encoder
from retrieval import Retriever
from retrieval.latency import summarize
from retrieval.request_path.timing import StageTimer
from retrieval.tracing import Observer, TracingConfig


def install_sdk() -> Any:
    """A global TracerProvider exporting through a batch processor; returns the exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def observer_cost_us(retriever: Retriever, query: str, vector: Any, n: int) -> dict[str, float]:
    """Microseconds per ``Observer.observe`` call with tracing off, on a real result."""
    observer = Observer(TracingConfig())
    result = retriever.search(query, filters=FILTER, k=10, query_vector=vector)
    timer = StageTimer()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        observer.observe(result, timer)
        samples.append((time.perf_counter() - started) * 1e6)
    return summarize(samples)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = index_root(args.data, args.work, "float32", SentenceTransformerEncoder())
    queries = list(read_queries(args.data / "queries.jsonl").values())
    vectors = make_encoder("onnx-int8").encode(queries)
    exporter = install_sdk()
    retrievers = {name: Retriever.load(root, {"cache": {"backend": "none"},
                                              "tracing": {"enabled": enabled}})
                  for name, enabled in (("tracing off", False), ("tracing on", True))}
    runners = {name: (lambda i, r=r: r.search(queries[i], filters=FILTER, k=10,
                                              query_vector=vectors[i]))
               for name, r in retrievers.items()}
    items = list(range(len(queries)))
    samples = measure_side_by_side(runners, items[args.warmup:], items[:args.warmup], chunk=50)
    from opentelemetry import trace

    trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
    search = {name: s.summary() for name, s in samples.items()}
    cost = observer_cost_us(retrievers["tracing off"], queries[0], vectors[0], 10_000)
    spans = len(exporter.get_finished_spans())
    results = {"search": search, "observer_off_us": cost, "spans_exported": spans}
    rows = [[name, percentile_cells(summary)] for name, summary in search.items()]
    markdown = "\n".join([
        "# Tracing cost on the search path (SciFact, query vectors given)", "",
        markdown_table(["configuration", "p50 / p95 / p99 ms"], rows), "",
        f"With tracing off, observability adds one call per search (rolling percentiles for "
        f"`stats()`): {cost['p50']:.1f} / {cost['p95']:.1f} µs p50 / p95. Spans exported with "
        f"tracing on: {spans:,}.",
    ])
    publish_report("tracing", args, results, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
