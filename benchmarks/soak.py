"""Load-and-fault harness: ``python -m benchmarks.soak --duration 600``.

N client threads search a mix of repeated (cached) and new queries with filters through one
Retriever (Redis result/embedding cache, local feature store, hot reload), on loopback only,
while the harness cycles the environment through phases:

    healthy -> redis down (stopped, then restarted) -> healthy -> redis paused (SIGSTOP, then
    SIGCONT) -> ...

and, all along, publishes a new index build every few seconds and materializes a new feature
snapshot every few seconds. It reports requests, errors and p50/p95/p99 per phase ("during
publish" = requests overlapping a build's publication or the swap after it), and counts results
that mixed two builds or two feature snapshots (both goals: 0).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    RedisServer,
    markdown_table,
    percentile_cells,
    publish_report,
)
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_queries
from indexes.docstore import Document
from indexes.encoders import SentenceTransformerEncoder
from indexes.synthetic import with_demo_metadata
from retrieval import Retriever
from retrieval.features import CallableSource, Feature, FeatureView, LocalStore, materialize
from retrieval.latency import summarize

VIEW = FeatureView(name="soak", features=(Feature(name="version", dtype="int64", default=-1),
                                          Feature(name="boost", dtype="float32", default=0.0)))
FILTERS = [None, {"year": {"gte": 2005}}, {"doc_type": {"in": ["review", "trial"]}},
           'department = "oncology" OR department = "genetics"']
PHASES = (("healthy", 20.0), ("redis down", 15.0), ("healthy", 10.0), ("redis paused", 15.0))


@dataclass
class Record:
    started: float
    ended: float
    phase: str
    error: str | None = None
    build_id: str | None = None
    versions: set[int] = field(default_factory=set)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = threading.Event()
        self.phase = "healthy"
        self.records: list[Record] = []
        self.publish_windows: list[tuple[float, float]] = []
        self.redis = RedisServer()
        self.rng = random.Random(3)

    # -- environment ------------------------------------------------------------------------

    def setup(self) -> None:
        args = self.args
        encoder = SentenceTransformerEncoder()
        self.docs = list(itertools.islice(with_demo_metadata(read_corpus(args.data)), args.docs))
        self.root = args.work / "soak-index"
        self.store = LocalStore(args.work / "soak-features", grace_seconds=5)
        self.build_config = BuildConfig(reuse_from=str(args.work / args.data.name)
                                        if (args.work / args.data.name / "CURRENT").exists()
                                        else None)
        build_index(self.docs, self.root, encoder=encoder, config=self.build_config)
        self.encoder = encoder
        self.snapshot_no = 0
        self._materialize()
        self.redis.start()
        config = {
            "cache": {"backend": "redis", "url": self.redis.url, "namespace": f"soak{os.getpid()}"},
            "features": [{"view": "soak", "weights": {"boost": 0.2}}],
            "reload_interval_seconds": 0.5,
            "feature_snapshot_refresh_seconds": 0.5,
        }
        self.retriever = Retriever.load(self.root, config, encoder=encoder,
                                        feature_store=self.store)
        queries = list(read_queries(args.data / "queries.jsonl").values())
        self.hot = queries[:50]
        self.cold = queries[50:]

    def _materialize(self) -> None:
        self.snapshot_no += 1
        number = self.snapshot_no
        ids = [d.id for d in self.docs]

        def rows() -> list[dict[str, Any]]:
            return [{"doc_id": d, "version": number, "boost": (hash((d, number)) % 100) / 100}
                    for d in ids]

        materialize(VIEW, CallableSource(rows), self.store, progress=False)

    def _publish(self) -> None:
        n = len(self.publish_windows)
        first = self.docs[0]
        docs = [Document(first.id, f"{first.text} revision {n}", first.title, first.metadata),
                *self.docs[1:]]
        started = time.monotonic()
        build_index(docs, self.root, encoder=self.encoder, config=self.build_config,
                    progress=False)
        # The swap follows within the reload interval: count that time as "during publish".
        self.publish_windows.append((started, time.monotonic() + 1.0))

    # -- load -------------------------------------------------------------------------------

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            query = rng.choice(self.hot) if rng.random() < 0.5 else rng.choice(self.cold)
            record = Record(time.monotonic(), 0.0, self.phase)
            try:
                result = self.retriever.search(query, filters=rng.choice(FILTERS), k=10)
                record.build_id = result.build_id
                record.versions = {int(h.features["version"]) for h in result.hits
                                   if h.features.get("version", -1) >= 0}
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                record.error = f"{type(exc).__name__}: {exc}"
            record.ended = time.monotonic()
            self.records.append(record)

    def background(self, every: float, action: Any) -> None:
        while not self.stop.wait(every):
            action()

    def run(self) -> dict[str, Any]:
        self.setup()
        workers = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(self.args.threads)]
        workers.append(threading.Thread(target=self.background,
                                        args=(self.args.publish_every, self._publish)))
        workers.append(threading.Thread(target=self.background,
                                        args=(self.args.materialize_every, self._materialize)))
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + self.args.duration
        try:
            for name, seconds in itertools.cycle(PHASES):
                if time.monotonic() >= deadline:
                    break
                self._enter(name)
                self.stop.wait(min(seconds, max(0.0, deadline - time.monotonic())))
                self._leave(name)
        finally:
            self.stop.set()
            for worker in workers:
                worker.join(timeout=60)
            stats = self.retriever.stats()
            self.retriever.close()
            self.redis.cleanup()
        return self.report(stats)

    def _enter(self, name: str) -> None:
        self.phase = name
        if name == "redis down":
            self.redis.stop()
        elif name == "redis paused":
            self.redis.pause()

    def _leave(self, name: str) -> None:
        if name == "redis down":
            self.redis.start()
        elif name == "redis paused":
            self.redis.resume()

    # -- report -----------------------------------------------------------------------------

    def report(self, stats: dict[str, Any]) -> dict[str, Any]:
        live = self.retriever.live_windows()
        mixed_builds = sum(1 for r in self.records if r.build_id and not _was_live(r, live))
        mixed_snapshots = sum(1 for r in self.records if len(r.versions) > 1)
        phases: dict[str, list[Record]] = {}
        for record in self.records:
            key = "during publish" if _overlaps(record, self.publish_windows) else record.phase
            phases.setdefault(key, []).append(record)
            phases.setdefault("all", []).append(record)
        table = {name: {"requests": len(rs), "errors": sum(r.error is not None for r in rs),
                        "latency": summarize([(r.ended - r.started) * 1e3 for r in rs])}
                 for name, rs in phases.items()}
        errors = [r.error for r in self.records if r.error][:10]
        return {"phases": table, "mixed_build_results": mixed_builds,
                "mixed_snapshot_results": mixed_snapshots, "builds_published":
                len(self.publish_windows), "feature_snapshots": self.snapshot_no,
                "sample_errors": errors, "cache": stats["cache"], "reloads": stats["reloads"]}


def _was_live(record: Record, live: dict[str, tuple[float, float]]) -> bool:
    window = live.get(record.build_id or "")
    return window is not None and window[0] <= record.ended and record.started <= window[1]


def _overlaps(record: Record, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= record.ended and record.started <= end for start, end in windows)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    order = ["healthy", "redis down", "redis paused", "during publish", "all"]
    rows = [[name, row["requests"], row["errors"], percentile_cells(row["latency"])]
            for name in order if (row := result["phases"].get(name))]
    return "\n".join([
        f"# Soak: {args.duration:.0f} s, {args.threads} client threads, {args.docs} documents",
        "", markdown_table(["phase", "searches", "errors", "p50 / p95 / p99 ms"], rows), "",
        f"- builds published: {result['builds_published']}; feature snapshots materialized: "
        f"{result['feature_snapshots']}",
        f"- results that mixed two builds: {result['mixed_build_results']}; "
        f"that mixed two feature snapshots: {result['mixed_snapshot_results']}",
        f"- sample errors: {result['sample_errors'] or 'none'}",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--publish-every", type=float, default=5.0)
    parser.add_argument("--materialize-every", type=float, default=7.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not (args.data / "corpus.jsonl").is_file():
        raise SystemExit(f"no BEIR dataset at {args.data}; pass --data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = Soak(args).run()
    markdown = render(result, args)
    publish_report("soak", args, result, markdown, key="result")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
