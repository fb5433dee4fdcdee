"""Cache latency and hit rate: ``python -m benchmarks.cache``.

On SciFact with the real encoder, side by side in one run:

- result-cache hit, in-process and through Redis on loopback: the first hit on a result this
  process computed (remembered decoded), on one another process computed (JSON parsed), and
  repeat hits;
- embedding-cache hit with a result miss (same question, new k);
- full miss (new question: encode + search), in-process cache;
- hit rate and latency when a query log with repeats is replayed: SciFact queries drawn
  Zipf-distributed (a heavy head of popular questions, a long tail of one-offs).

Each scenario runs over every query after a warm-up that is thrown away; the replay's first
``--warmup`` requests are its warm-up (run, then left out of its counts and latencies).
"""

from __future__ import annotations

import argparse
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
    markdown_table,
    measure,
    percentile_cells,
    private_redis,
    publish_report,
    verdict,
)
from indexes.build import build_index
from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder
from retrieval import Retriever, SearchResult
from retrieval.latency import summarize

OTHER_PROCESS = "result hit, Redis loopback (first hit, computed by another process: JSON parsed)"
FILTER = {"doc_type": {"in": ["review", "trial", "cohort"]}, "year": {"gte": 2000}}


def scenario(retriever: Retriever, queries: Sequence[str], k: int, expect: tuple[str, str],
             warmup: int) -> dict[str, Any]:
    """Search every query once; check each result's cache status is the expected one."""
    def run(query: str) -> SearchResult:
        return retriever.search(query, filters=FILTER, k=k)

    samples = measure(run, queries[warmup:], warmup=queries[:warmup])
    statuses = [(r.cache.result, r.cache.embedding) for r in samples.outputs]
    share = sum(s == expect for s in statuses) / len(statuses)
    return {"summary": samples.summary(), "expected_status": expect, "share_as_expected": share}


def prime(retriever: Retriever, queries: Sequence[str], k: int) -> None:
    for query in queries:
        retriever.search(query, filters=FILTER, k=k)
    retriever.flush_cache_writes(timeout=30)


def primed_scenario(retriever: Retriever, queries: Sequence[str], warmup: int) -> dict[str, Any]:
    """Result hits on entries this retriever has just computed and written."""
    prime(retriever, queries, 10)
    return scenario(retriever, queries, 10, ("hit", "skipped"), warmup)


def zipf_replay(retriever: Retriever, queries: Sequence[str], n: int, a: float, seed: int,
                warmup: int = 50) -> dict[str, Any]:
    """A log of ``warmup + n`` requests drawn Zipf-distributed from ``queries``, replayed in
    order: the first ``warmup`` are the warm-up (a fresh retriever's first searches pay its
    one-time costs), left out of the figures, which cover the ``n`` after them. The cache
    keeps what the warm-up's requests wrote, as it would in a log that began earlier."""
    rng = np.random.default_rng(seed)
    ranks = (rng.zipf(a, size=warmup + n) - 1) % len(queries)
    log = [queries[int(r)] for r in ranks]
    for query in log[:warmup]:
        retriever.search(query, filters=FILTER, k=10)
    retriever.flush_cache_writes(timeout=30)  # as the scenarios: the warm-up's writes landed
    measured = log[warmup:]
    hits = 0
    wall: list[float] = []
    for query in measured:
        started = time.perf_counter()
        result = retriever.search(query, filters=FILTER, k=10)
        wall.append((time.perf_counter() - started) * 1e3)
        hits += result.cache.result == "hit"
    return {"requests": n, "warmup": warmup, "zipf_a": a, "distinct": len(set(measured)),
            "hit_rate": hits / n, "summary": summarize(wall)}


def load(data: Path, work: Path, encoder: Any, config: dict[str, Any]) -> Retriever:
    """Documents encoded by the torch reference; queries by the default (ONNX INT8) encoder."""
    root = work / data.name
    if not (root / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data)), root, encoder=encoder)
    return Retriever.load(root, config)


def run(args: argparse.Namespace) -> dict[str, Any]:
    encoder = SentenceTransformerEncoder()
    queries = list(read_queries(args.data / "queries.jsonl").values())[: args.queries]
    w = args.warmup
    results: dict[str, Any] = {}
    with private_redis() as url:
        redis_cache = {"backend": "redis", "url": url, "namespace": f"bench{os.getpid()}"}
        memory = load(args.data, args.work, encoder, {"cache": {"backend": "memory"}})
        remote = load(args.data, args.work, encoder, {"cache": redis_cache})
        # Another process reading what ``remote`` wrote: its own, empty, memory of decoded results.
        other = load(args.data, args.work, encoder, {"cache": redis_cache})
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("full miss (in-process cache)",
             lambda: scenario(memory, queries, 10, ("miss", "miss"), w)),
            ("result hit, in-process (first hit)",
             lambda: scenario(memory, queries, 10, ("hit", "skipped"), w)),
            ("result hit, in-process (repeat hit)",
             lambda: scenario(memory, queries, 10, ("hit", "skipped"), w)),
            ("embedding hit + result miss, in-process",
             lambda: scenario(memory, queries, 9, ("miss", "hit"), w)),
            ("result hit, Redis loopback (first hit, computed by this process)",
             lambda: primed_scenario(remote, queries, w)),
            (OTHER_PROCESS, lambda: scenario(other, queries, 10, ("hit", "skipped"), w)),
            ("result hit, Redis loopback (repeat hit)",
             lambda: scenario(remote, queries, 10, ("hit", "skipped"), w)),
            ("embedding hit + result miss, Redis loopback",
             lambda: scenario(remote, queries, 8, ("miss", "hit"), w)),
        ]
        for name, step in steps:
            results[name] = step()
            memory.flush_cache_writes(timeout=30)
        replay = load(args.data, args.work, encoder, {"cache": {"backend": "memory"}})
        results["zipf replay"] = zipf_replay(replay, queries, args.replay, args.zipf_a, seed=7,
                                             warmup=w)
        results["redis stats"] = remote.stats()["cache"]
    return results


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for name, result in results.items():
        if "summary" not in result or name == "zipf replay":
            continue
        s = result["summary"]
        rows.append([name, s["n"], percentile_cells(s), f"{s['max']:.3f}",
                     f"{result['share_as_expected']:.3f}"])
    replay = results["zipf replay"]
    hit_memory = results["result hit, in-process (first hit)"]["summary"]["p95"]
    hit_redis = results["result hit, Redis loopback (first hit, computed by this process)"][
        "summary"]["p95"]
    lines = [
        f"# Cache benchmark ({args.data.name}, filter {FILTER}, k=10)", "",
        markdown_table(["scenario", "n", "p50 / p95 / p99 ms", "max ms",
                        "share with expected cache status"], rows), "",
        f"Zipf replay (a={replay['zipf_a']}): {replay['requests']} requests after "
        f"{replay['warmup']} of warm-up (not counted), {replay['distinct']} distinct queries, "
        "result-cache hit rate "
        f"{replay['hit_rate']:.3f}, latency p50/p95/p99 {percentile_cells(replay['summary'])} ms",
        "",
        f"- result-cache hit p95 <= 0.1 ms in-process: {hit_memory:.3f} ms "
        f"{verdict(hit_memory <= 0.1)}",
        f"- result-cache hit p95 <= 0.3 ms through Redis: {hit_redis:.3f} ms "
        f"{verdict(hit_redis <= 0.3)}",
        "- first hit through Redis on a result another process computed (JSON parsed): "
        f"{results[OTHER_PROCESS]['summary']['p95']:.3f} ms p95",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--queries", type=int, default=None, help="default: all")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--replay", type=int, default=5000)
    parser.add_argument("--zipf-a", type=float, default=1.2)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not (args.data / "corpus.jsonl").is_file():
        raise SystemExit(f"no BEIR dataset at {args.data}; pass --data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = run(args)
    markdown = render(results, args)
    publish_report("cache", args, results, markdown, key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
