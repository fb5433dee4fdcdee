"""Feature-store latency and throughput: LocalStore vs RedisStore over 1M documents.

    python -m benchmarks.features                    # 1M entities, 1,000 reads per size
    python -m benchmarks.features --quick            # 100k entities, 300 reads per size

Measured, single thread, warm-up discarded:

- materialization throughput (rows/s) of a Parquet source of N entities x 5 features plus an
  event time, into a LocalStore directory and into a private ``redis-server`` on loopback
  (started on a free port here and stopped after; never the shared :6379);
- ``read`` latency for 10, 100 and 1,000 entities per call (90% present, 10% missing ids),
  both stores side by side on the same id lists, with the stores' default read timeouts.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from benchmarks.common import (
    environment,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    private_redis,
    write_results,
)
from retrieval.features import (
    Feature,
    FeatureView,
    LocalStore,
    OnlineStore,
    RedisStore,
    materialize,
)

SIZES = (10, 100, 1000)
VIEW = FeatureView(
    name="doc_signals",
    features=(
        Feature(name="popularity", dtype="float32", default=0.0),
        Feature(name="quality", dtype="float64", default=0.5),
        Feature(name="clicks", dtype="int64", default=0),
        Feature(name="authority", dtype="float32", default=0.0),
        Feature(name="is_spam", dtype="bool", default=False),
    ),
    max_age_seconds=2 * 86400.0,
)


def write_source(path: Path, n: int, seed: int = 0) -> Path:
    """A Parquet file of ``n`` documents (ids ``doc-0000000``...) with every feature."""
    rng = np.random.default_rng(seed)
    table = pa.table({
        "doc_id": [f"doc-{i:07d}" for i in range(n)],
        "popularity": rng.pareto(1.5, n).astype(np.float32),
        "quality": rng.random(n),
        "clicks": rng.integers(0, 100_000, n),
        "authority": rng.random(n).astype(np.float32),
        "is_spam": rng.random(n) < 0.01,
        "event_time": time.time() - rng.random(n) * 86400.0,
    })
    pq.write_table(table, path)
    return path


def id_lists(n_entities: int, size: int, count: int, seed: int) -> list[list[str]]:
    """``count`` lists of ``size`` ids: 90% existing documents, 10% unknown ones."""
    rng = np.random.default_rng(seed)
    lists = []
    for _ in range(count):
        rows = rng.integers(0, int(n_entities / 0.9), size)  # ids past n_entities are missing
        lists.append([f"doc-{row:07d}" for row in rows])
    return lists


def run(n_entities: int, reads: int, warmup: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-features-"))
    try:
        source = write_source(workdir / "signals.parquet", n_entities)
        with private_redis() as url:
            stores: dict[str, OnlineStore] = {
                "local": LocalStore(workdir / "store"),
                "redis": RedisStore(url, namespace="bench"),
            }
            materialized = {
                name: materialize(VIEW, source, store, progress=True).model_dump()
                for name, store in stores.items()
            }
            lookups = measure_lookups(stores, n_entities, reads, warmup)
            memory = redis.Redis.from_url(url).info("memory")["used_memory"]
            stats = {name: store.stats() for name, store in stores.items()}
            for store in stores.values():
                store.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"materialize": materialized, "lookups": lookups, "redis_used_memory": memory,
            "store_stats": stats}


def measure_lookups(stores: dict[str, OnlineStore], n_entities: int, reads: int, warmup: int
                    ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for size in SIZES:
        items = id_lists(n_entities, size, reads, seed=size)
        warm = id_lists(n_entities, size, warmup, seed=size + 1)
        runners = {name: (lambda ids, s=store: s.read(VIEW.name, ids))
                   for name, store in stores.items()}
        samples = measure_side_by_side(runners, items, warm)
        for name, sample in samples.items():
            unavailable = sum(not batch.available for batch in sample.outputs)
            found = float(np.mean([batch.found.mean() for batch in sample.outputs]))
            out[f"{name}/{size}"] = {"store": name, "entities": size, **sample.summary(),
                                     "unavailable_reads": unavailable, "found_fraction": found}
    return out


def report(results: dict[str, Any], n_entities: int) -> str:
    rows = [[r["store"], r["entities"], percentile_cells(r), r["unavailable_reads"],
             f"{r['found_fraction']:.2f}"] for r in results["lookups"].values()]
    lookup = markdown_table(
        ["store", "entities per read", "p50 / p95 / p99 ms", "unavailable reads", "found"], rows)
    mat = markdown_table(
        ["store", "rows", "seconds", "rows/s"],
        [[name, m["rows"], f"{m['seconds']:.1f}", f"{m['rows_per_s']:,.0f}"]
         for name, m in results["materialize"].items()])
    mib = results["redis_used_memory"] / 2**20
    return (f"## Feature store, {n_entities:,} entities x {len(VIEW.features)} features\n\n"
            f"### Lookup latency\n\n{lookup}\n\n### Materialization (Parquet source)\n\n{mat}\n\n"
            f"Redis used_memory after both runs: {mib:,.0f} MiB\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=1000, help="measured reads per size")
    parser.add_argument("--warmup", type=int, default=100, help="discarded reads per size")
    parser.add_argument("--quick", action="store_true", help="100k entities, 300 reads")
    args = parser.parse_args(argv)
    if args.quick:
        args.entities, args.reads, args.warmup = 100_000, 300, 50
    results = run(args.entities, args.reads, args.warmup)
    markdown = report(results, args.entities)
    print(markdown)
    config = {"entities": args.entities, "reads": args.reads, "warmup": args.warmup,
              "sizes": list(SIZES), "view": VIEW.model_dump()}
    paths = write_results("features", {"config": config, "environment": environment(),
                                       **results}, markdown)
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
