"""Request-path guarantees, measured: ``python -m benchmarks.guarantees``.

1. **Deadlines.** The real query encoder (ONNX INT8) made slow on purpose (+50 ms per call) and
   ``deadline_ms=10``: how long each search takes and how far past its deadline it returns
   (p50/p95/p99/max), how many were degraded to BM25 ranking, and whether each returned hits;
   side by side, in one run, with the same encoder and no deadline.
2. **A sick Redis.** Result/embedding cache and feature store on one private redis-server that
   is healthy, stopped, or paused with SIGSTOP: p50/p95/p99/max of every search against the
   configured request-path socket timeouts (cache + feature store), errors, and how many
   results said ``features_available=False``.

No result cache in part 1 (every search runs the pipeline); part 2 uses fresh query texts per
phase so that cache hits do not hide the faults. Searches run one at a time (concurrency 1).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    RedisServer,
    fmt_ms,
    markdown_table,
    percentile_cells,
    publish_report,
)
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import DocStore
from indexes.encoders import SentenceTransformerEncoder
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.onnx_encoder import make_encoder
from retrieval import Retriever
from retrieval.features import CallableSource, Feature, FeatureView, RedisStore, materialize
from retrieval.latency import summarize

SLOW_MS = 50.0
VIEW = FeatureView(name="guard", features=(Feature(name="boost", dtype="float32", default=0.0),))


class SlowEncoder:
    """The real query encoder plus a fixed sleep per call: a model server having a bad day."""

    def __init__(self, inner: Any, delay_ms: float) -> None:
        self.inner = inner
        self.encoder_id = inner.encoder_id
        self.model = inner.model
        self.dim = inner.dim
        self.delay = delay_ms / 1e3

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        time.sleep(self.delay)
        return np.asarray(self.inner.encode(texts, batch_size=batch_size, progress=progress))


def index_root(args: argparse.Namespace) -> Path:
    """The given index, or one built from ``--data`` (reusing vectors of an earlier build)."""
    if args.index is not None:
        return Path(args.index)
    root = args.work / f"guarantees-{args.data.name}"
    if not (root / "CURRENT").exists():
        build_index(with_demo_metadata(read_corpus(args.data)), root,
                    encoder=SentenceTransformerEncoder(), config=BuildConfig())
    return root


def timed(search: Callable[[str], Any], queries: Sequence[str]) -> tuple[list[float], list[Any]]:
    times, results = [], []
    for query in queries:
        started = time.perf_counter()
        results.append(search(query))
        times.append((time.perf_counter() - started) * 1e3)
    return times, results


def search_within(retriever: Retriever, budget: float | None, query: str) -> Any:
    return retriever.search(query, deadline_ms=budget)


def deadline_part(root: Path, queries: Sequence[str], deadline_ms: float) -> dict[str, Any]:
    slow = SlowEncoder(make_encoder("onnx-int8"), SLOW_MS)
    rows: dict[str, Any] = {}
    with Retriever.load(root, {"cache": {"backend": "none"}}, encoder=slow) as retriever:
        retriever.search(queries[0])  # warm-up, thrown away
        for name, budget in (("no deadline", None), (f"deadline_ms={deadline_ms:g}", deadline_ms)):
            times, results = timed(functools.partial(search_within, retriever, budget), queries)
            rows[name] = {
                "latency": summarize(times), "max_ms": max(times),
                "past_deadline": summarize([t - budget for t in times]) if budget else None,
                "degraded": sum(bool(r.degraded) for r in results),
                "empty": sum(not r.hits for r in results), "searches": len(results)}
    return rows


def sick_redis_part(root: Path, queries: Sequence[str], per_phase: int) -> dict[str, Any]:
    redis = RedisServer()
    redis.start()
    try:
        return _sick_redis_phases(root, queries, per_phase, redis)
    finally:
        redis.cleanup()


def _sick_redis_phases(root: Path, queries: Sequence[str], per_phase: int, redis: RedisServer
                       ) -> dict[str, Any]:
    ids = DocStore.load(resolve_build_dir(root) / "docstore", prefault=False).all_ids()
    store = RedisStore(redis.url, namespace="guardfeatures", write_timeout_seconds=5)
    materialize(VIEW, CallableSource(lambda: [{"doc_id": d, "boost": 0.5} for d in ids]), store,
                progress=False)
    config = {"cache": {"backend": "redis", "url": redis.url, "namespace": f"guard{os.getpid()}"},
              "feature_store": {"location": redis.url, "namespace": "guardfeatures"},
              "features": [{"view": "guard", "weights": {"boost": 0.1}}]}
    fresh = iter(queries)
    rows: dict[str, Any] = {}
    with Retriever.load(root, config) as retriever:
        retriever.search("warm up")
        budget = (retriever.config.cache.socket_timeout_ms
                  + (retriever.config.feature_store.socket_timeout_ms
                     if retriever.config.feature_store else 0.0))
        for phase, enter, leave in (("healthy", None, None),
                                    ("redis stopped", redis.stop, redis.start),
                                    ("redis paused (SIGSTOP)", redis.pause, redis.resume)):
            if enter is not None:
                enter()
            try:
                batch = list(itertools.islice(fresh, per_phase))
                times, results = timed(lambda q: retriever.search(q, k=10), batch)
            finally:
                if leave is not None:
                    leave()
            rows[phase] = {"latency": summarize(times), "max_ms": max(times),
                           "timeouts_ms": budget, "searches": len(results),
                           "features_unavailable": sum(not r.features_available
                                                       for r in results)}
        rows["stats"] = {"cache": retriever.stats()["cache"]}
    return rows


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    deadline_rows = [
        [name, row["searches"], percentile_cells(row["latency"]), fmt_ms(row["max_ms"]),
         percentile_cells(row["past_deadline"]) + " / " + fmt_ms(row["past_deadline"]["max"])
         if row["past_deadline"] else "—", row["degraded"], row["empty"]]
        for name, row in result["deadline"].items()]
    redis_rows = [
        [name, row["searches"], percentile_cells(row["latency"]), fmt_ms(row["max_ms"]),
         fmt_ms(row["timeouts_ms"]), row["features_unavailable"]]
        for name, row in result["sick_redis"].items() if name != "stats"]
    return "\n".join([
        f"# Request-path guarantees ({result['documents']} documents, concurrency 1)", "",
        f"## Deadlines: query encoder slowed by {SLOW_MS:g} ms per call, no result cache", "",
        markdown_table(["run", "searches", "p50 / p95 / p99 ms", "max ms",
                        "past deadline p50 / p95 / p99 / max ms", "degraded", "empty"],
                       deadline_rows), "",
        "## A sick Redis (cache and feature store), fresh queries per phase", "",
        markdown_table(["phase", "searches", "p50 / p95 / p99 ms", "max ms",
                        "socket timeouts (cache + features) ms", "features unavailable"],
                       redis_rows), "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.guarantees", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="BEIR folder: its queries (and its corpus when --index is not given)")
    parser.add_argument("--index", type=Path, default=None, help="an index root to search")
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--deadline-ms", type=float, default=10.0)
    parser.add_argument("--per-phase", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not (args.data / "queries.jsonl").is_file():
        raise SystemExit(f"no BEIR dataset at {args.data}; pass --data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = index_root(args)
    texts = list(read_queries(args.data / "queries.jsonl").values())
    queries = [texts[i % len(texts)] + ("" if i < len(texts) else f" {i}")
               for i in range(max(args.queries, 3 * args.per_phase + 1))]
    result = {"documents": read_manifest(resolve_build_dir(root)).n_docs,
              "deadline": deadline_part(root, queries[:args.queries], args.deadline_ms),
              "sick_redis": sick_redis_part(root, queries, args.per_phase)}
    publish_report("guarantees", args, result, render(result, args), key="result")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
