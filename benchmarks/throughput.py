"""End to end with the query encoder: ``python -m benchmarks.throughput``.

Side by side in one run, per encoder backend (torch, onnx, onnx-int8), caches off so every
search is a full miss (encode + filter + BM25 + re-rank + fuse + hydrate):

- latency p50/p95/p99 at concurrency 1, with and without parallel stages;
- throughput (queries/s) and p95 at concurrency 1, 4, 16 and 64 threads sharing one
  Retriever, with dynamic batching on and off;
- index memory and SciFact nDCG@10 with float32 vs int8 document vectors.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure,
    percentile_cells,
    publish_report,
)
from benchmarks.quality import evaluate_run, retriever_run
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.encoders import SentenceTransformerEncoder
from indexes.onnx_encoder import make_encoder
from indexes.synthetic import with_demo_metadata
from retrieval import Retriever
from retrieval.latency import summarize

DEFAULT_DATA = REPO.parent / "shared" / "data" / "scifact"
BACKENDS = ("torch", "onnx", "onnx-int8")
FILTER = {"year": {"gte": 2000}}


def index_root(data: Path, work: Path, dtype: str, encoder: Any) -> Path:
    """The dataset's index (float32) or an int8 copy that reuses its vectors (no re-encoding)."""
    base = work / data.name
    if not (base / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data)), base, encoder=encoder)
    if dtype == "float32":
        return base
    root = work / f"{data.name}-{dtype}"
    if not (root / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data)), root, encoder=encoder,
                    config=BuildConfig(vector_dtype=dtype, reuse_from=str(base)))  # type: ignore[arg-type]
    return root


def concurrent_run(retriever: Retriever, queries: Sequence[str], threads: int
                   ) -> dict[str, Any]:
    """``threads`` clients split ``queries``; returns queries/s and latency percentiles."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(offset: int) -> None:
        mine = []
        for query in queries[offset::threads]:
            started = time.perf_counter()
            retriever.search(query, filters=FILTER, k=10)
            mine.append((time.perf_counter() - started) * 1e3)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    return {"threads": threads, "qps": len(queries) / elapsed, "latency": summarize(latencies)}


def backend_runs(root: Path, backend: str, queries: Sequence[str], args: argparse.Namespace
                 ) -> dict[str, Any]:
    encoder = SentenceTransformerEncoder() if backend == "torch" else make_encoder(backend)
    out: dict[str, Any] = {}
    for parallel in (True, False):
        r = Retriever.load(root, {"cache": {"backend": "none"}, "parallel_stages": parallel,
                                  "batching": {"enabled": False}}, encoder=encoder)
        samples = measure(lambda q, r=r: r.search(q, filters=FILTER, k=10),
                          queries[args.warmup:], warmup=queries[: args.warmup])
        out[f"c1 parallel={parallel}"] = samples.summary()
    for batching in (True, False):
        r = Retriever.load(root, {"cache": {"backend": "none"},
                                  "batching": {"enabled": batching}}, encoder=encoder)
        r.search_batch(list(queries[:8]))  # warm the encoder for batched shapes
        out[f"batching={batching}"] = [concurrent_run(r, queries, c) for c in args.concurrency]
    return out


def vector_dtype_runs(data: Path, work: Path, encoder: Any) -> dict[str, Any]:
    qrels = read_qrels(data / "qrels" / "test.tsv")
    queries = {q: t for q, t in read_queries(data / "queries.jsonl").items() if q in qrels}
    vectors = encoder.encode(list(queries.values()))
    out = {}
    for dtype in ("float32", "int8"):
        r = Retriever.load(index_root(data, work, dtype, encoder), {"cache": {"backend": "none"}},
                           encoder=encoder)
        ndcg = evaluate_run(qrels, retriever_run(r, queries, query_vectors=vectors))["ndcg@10"]
        out[dtype] = {"vector_bytes": r.snapshot.vectors.nbytes, "ndcg@10": ndcg}
    return out


def render(results: dict[str, Any]) -> str:
    lines = ["# End to end with the query encoder (caches off: every search a full miss)", ""]
    rows = []
    for backend, runs in results["backends"].items():
        for name in ("c1 parallel=True", "c1 parallel=False"):
            rows.append([backend, name, percentile_cells(runs[name])])
    lines += [markdown_table(["backend", "run", "p50 / p95 / p99 ms"], rows), ""]
    rows = []
    for backend, runs in results["backends"].items():
        for batching in (True, False):
            for point in runs[f"batching={batching}"]:
                rows.append([backend, batching, point["threads"], f"{point['qps']:.0f}",
                             f"{point['latency']['p95']:.2f}"])
    lines += [markdown_table(["backend", "batching", "threads", "queries/s", "p95 ms"], rows), ""]
    rows = [[dtype, f"{v['vector_bytes'] / 2**20:.1f} MiB", f"{v['ndcg@10']:.4f}"]
            for dtype, v in results["vectors"].items()]
    lines += [markdown_table(["document vectors", "memory", "SciFact nDCG@10"], rows)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS))
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reference = SentenceTransformerEncoder()
    root = index_root(args.data, args.work, "float32", reference)
    queries = list(read_queries(args.data / "queries.jsonl").values())
    queries = (queries * (1 + args.queries // len(queries)))[: args.queries + args.warmup]
    results = {"backends": {b: backend_runs(root, b, queries, args) for b in args.backends},
               "vectors": vector_dtype_runs(args.data, args.work, reference)}
    markdown = render(results)
    publish_report("throughput", args, results, markdown, key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
