"""Load-and-fault harness: ``python -m benchmarks.soak --duration 600``.

N client threads search a mix of repeated (cached) and new queries with filters through one
Retriever (Redis result/embedding cache, Redis feature store, hot reload, a per-search deadline
and a bound on searches in flight), on loopback only, while the harness cycles the environment
through phases:

    healthy -> redis down (stopped, then restarted) -> healthy -> redis paused (SIGSTOP, then
    SIGCONT) -> overload (4x as many callers as max_in_flight) -> ...

and, all along, publishes a new index build every few seconds and materializes a new feature
snapshot every few seconds (into the same Redis). It reports searches, errors (anything but
``OverloadedError``), shed searches (``OverloadedError``), degraded searches, p50/p95/p99 and
max of the searches served per phase ("during publish" = requests overlapping a build's
publication or the swap after it), how far past its deadline the slowest search returned, and
counts results that mixed two builds or two feature snapshots (both goals: 0).
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
    fmt_ms,
    markdown_table,
    percentile_cells,
    publish_report,
)
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.encoders import SentenceTransformerEncoder
from indexes.errors import RetrievalError
from retrieval import OverloadedError, Retriever
from retrieval.features import CallableSource, Feature, FeatureView, RedisStore, materialize
from retrieval.latency import summarize

VIEW = FeatureView(name="soak", features=(Feature(name="version", dtype="int64", default=-1),
                                          Feature(name="boost", dtype="float32", default=0.0)))
FILTERS = [None, {"year": {"gte": 2005}}, {"doc_type": {"in": ["review", "trial"]}},
           'department = "oncology" OR department = "genetics"']
BACK_OFF_SECONDS = 0.005
PHASES = (("healthy", 20.0), ("redis down", 15.0), ("healthy", 10.0), ("redis paused", 15.0),
          ("overload", 15.0))


@dataclass
class Record:
    started: float
    ended: float
    phase: str
    error: str | None = None
    shed: bool = False
    degraded: bool = False
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
        self.materialize_failures = 0

    # -- environment ------------------------------------------------------------------------

    def setup(self) -> None:
        args = self.args
        encoder = SentenceTransformerEncoder()
        self.docs = list(itertools.islice(with_demo_metadata(read_corpus(args.data)), args.docs))
        self.root = args.work / "soak-index"
        self.redis.start()
        self.store = RedisStore(self.redis.url, grace_seconds=5, namespace="soakfeatures",
                                write_timeout_seconds=5)
        self.build_config = BuildConfig(reuse_from=str(args.work / args.data.name)
                                        if (args.work / args.data.name / "CURRENT").exists()
                                        else None)
        build_index(self.docs, self.root, encoder=encoder, config=self.build_config)
        self.encoder = encoder
        self.snapshot_no = 0
        self._materialize()
        config = {
            "cache": {"backend": "redis", "url": self.redis.url, "namespace": f"soak{os.getpid()}"},
            "feature_store": {"location": self.redis.url, "namespace": "soakfeatures"},
            "features": [{"view": "soak", "weights": {"boost": 0.2}}],
            "reload_interval_seconds": 0.5,
            "feature_snapshot_refresh_seconds": 0.5,
            "deadline_ms": args.deadline_ms,
            "max_in_flight": args.max_in_flight,
        }
        # Queries go through the default query encoder (ONNX INT8), as in production.
        self.retriever = Retriever.load(self.root, config)
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

        try:
            materialize(VIEW, CallableSource(rows), self.store, progress=False)
        except RetrievalError:  # Redis down or paused: the nightly job fails, serving goes on
            self.materialize_failures += 1

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

    def client(self, seed: int, until: threading.Event | None = None) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set() and not (until is not None and until.is_set()):
            query = rng.choice(self.hot) if rng.random() < 0.5 else rng.choice(self.cold)
            record = Record(time.monotonic(), 0.0, self.phase)
            try:
                result = self.retriever.search(query, filters=rng.choice(FILTERS), k=10)
                record.build_id = result.build_id
                record.degraded = bool(result.degraded)
                record.versions = {int(h.features["version"]) for h in result.hits
                                   if h.features.get("version", -1) >= 0}
            except OverloadedError:
                record.shed = True
                self.stop.wait(BACK_OFF_SECONDS)  # what a well-behaved caller does when shed
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
        if name == "overload":  # callers beyond the bound, on top of the steady ones
            self.overload_done = threading.Event()
            extra = self.args.max_in_flight * 4 - self.args.threads
            self.overload_callers = [
                threading.Thread(target=self.client, args=(1000 + i, self.overload_done),
                                 daemon=True) for i in range(max(0, extra))]
            for caller in self.overload_callers:
                caller.start()
        elif name == "redis down":
            self.redis.stop()
        elif name == "redis paused":
            self.redis.pause()

    def _leave(self, name: str) -> None:
        if name == "overload":
            self.overload_done.set()
            for caller in self.overload_callers:
                caller.join(timeout=60)
        elif name == "redis down":
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
        table = {name: _phase_row(rs, self.args.deadline_ms) for name, rs in phases.items()}
        errors = [r.error for r in self.records if r.error][:10]
        return {"phases": table, "mixed_build_results": mixed_builds,
                "mixed_snapshot_results": mixed_snapshots, "builds_published":
                len(self.publish_windows), "feature_snapshots": self.snapshot_no,
                "sample_errors": errors, "cache": stats["cache"], "reloads": stats["reloads"],
                "materialize_failures": self.materialize_failures,
                "degraded_stages": stats["degraded"], "shed": stats["shed"]}


def _phase_row(records: list[Record], deadline_ms: float | None) -> dict[str, Any]:
    served = [(r.ended - r.started) * 1e3 for r in records if not r.shed]
    shed = [(r.ended - r.started) * 1e3 for r in records if r.shed]
    worst = max(served, default=0.0)
    return {"requests": len(records), "errors": sum(r.error is not None for r in records),
            "shed": len(shed), "degraded": sum(r.degraded for r in records),
            "latency": summarize(served), "max_ms": worst,
            "shed_max_ms": max(shed, default=0.0),
            "past_deadline_ms": (worst - deadline_ms) if deadline_ms else None}


def _was_live(record: Record, live: dict[str, tuple[float, float]]) -> bool:
    window = live.get(record.build_id or "")
    return window is not None and window[0] <= record.ended and record.started <= window[1]


def _overlaps(record: Record, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= record.ended and record.started <= end for start, end in windows)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    order = ["healthy", "redis down", "redis paused", "overload", "during publish", "all"]
    rows = [[name, row["requests"], row["errors"], row["shed"], row["degraded"],
             percentile_cells(row["latency"]), fmt_ms(row["max_ms"]), fmt_ms(row["shed_max_ms"])]
            for name in order if (row := result["phases"].get(name))]
    return "\n".join([
        f"# Soak: {args.duration:.0f} s, {args.threads} client threads ({args.max_in_flight * 4} "
        f"in the overload phase), max_in_flight={args.max_in_flight}, deadline_ms="
        f"{args.deadline_ms}, {args.docs} documents",
        "", markdown_table(["phase", "searches", "errors", "shed", "degraded",
                            "served p50 / p95 / p99 ms", "served max ms", "shed max ms"], rows),
        "",
        f"- materializations that failed (Redis down or paused): "
        f"{result['materialize_failures']}; degraded stages: {result['degraded_stages']}",
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
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--deadline-ms", type=float, default=100.0)
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
