"""End to end with the query encoder: ``python -m benchmarks.throughput``.

Side by side in one run, per encoder backend (torch, onnx, onnx-int8), caches off so every
search is a full miss (encode + filter + BM25 + re-rank + fuse + hydrate), on SciFact grown to
``--docs`` documents (default 100,000) with generated distractors: Zipf-drawn words of a medical
vocabulary that SciFact's queries share, so BM25 touches many of them, and random unit vectors
(re-ranking costs the same whatever the values). The queries are SciFact's real ones, so the
encoder sees real query lengths (median 21 tokens):

- latency p50/p95/p99 at concurrency 1, side by side: parallel stages on and off, and the ONNX
  encoders held to one thread;
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

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from benchmarks.quality import evaluate_run, retriever_run
from benchmarks.synthetic import (
    clustered_unit_vectors,
    random_unit_vectors,
    synthetic_documents,
)
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder, default_model_path
from indexes.onnx_encoder import OnnxEncoder, load_tokenizer, make_encoder
from retrieval import Retriever
from retrieval.latency import summarize

BACKENDS = ("torch", "onnx", "onnx-int8")
FILTER = {"year": {"gte": 2000}}


def grown_index(data: Path, work: Path, n_docs: int, encoder: Any, clustered: bool = False
                ) -> Path:
    """SciFact plus generated distractors up to ``n_docs`` documents (see the module doc);
    ``clustered``: distractor vectors drawn around centres, as real embeddings sit, so the
    dense leg's IVF index calibrates as on real data (on random ones it needs every list)."""
    base = index_root(data, work, "float32", encoder)
    if n_docs <= 0:
        return base
    root = work / f"{data.name}-grown-{n_docs}{'-clustered' * clustered}"
    if (root / "CURRENT").is_file():
        return root
    real = list(with_demo_metadata(read_corpus(data)))
    extra = max(0, n_docs - len(real))
    snapshot = Retriever.load(base, {"cache": {"backend": "none"}}).snapshot
    make = clustered_unit_vectors if clustered else random_unit_vectors
    vectors = make(extra, snapshot.vectors.dim)
    build_index([*real, *synthetic_documents(extra)], root,
                vectors=np.vstack([snapshot.vectors.reconstruct_all(), vectors]),
                encoder_info=snapshot.manifest.encoder)
    return root


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
                   ) -> tuple[list[float], float]:
    """``threads`` closed-loop clients split ``queries``; returns (latencies ms, elapsed s)."""
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
    return latencies, time.perf_counter() - started


def load(root: Path, encoder: Any, **config: Any) -> Retriever:
    return Retriever.load(root, {"cache": {"backend": "none"}, **config}, encoder=encoder)


def c1_runs(root: Path, backend: str, encoder: Any, queries: Sequence[str], warmup: int
            ) -> dict[str, Any]:
    """Concurrency 1, side by side: parallel stages on and off, dynamic batching on (its cost
    to a lone request), and for ONNX the encoder held to one thread (no lone-call use of every
    core)."""
    off, on = {"enabled": False}, {"enabled": True}
    retrievers = {
        "defaults": load(root, encoder),
        "parallel stages": load(root, encoder, parallel_stages=True, batching=off),
        "sequential stages": load(root, encoder, parallel_stages=False, batching=off),
        "parallel stages + batching": load(root, encoder, parallel_stages=True, batching=on),
    }
    if backend != "torch":
        one_thread = OnnxEncoder(quantized=backend == "onnx-int8", threads=1)
        retrievers["parallel stages, encoder on 1 thread"] = load(root, one_thread, batching=off)
    runners = {name: (lambda q, r=r: r.search(q, filters=FILTER, k=10))
               for name, r in retrievers.items()}
    samples = measure_side_by_side(runners, queries[warmup:], queries[:warmup], chunk=50,
                                   rewarm=3)
    defaults = retrievers["defaults"].stats()
    return {"c1": {name: s.summary() for name, s in samples.items()},
            "c1 defaults": {"parallel_stages": defaults["parallel_stages"],
                            "batching": defaults["batching"] is not None},
            "c1 by query length": by_length(queries[warmup:], samples["defaults"].wall_ms)}


LENGTH_BUCKETS = ((1, 12), (13, 20), (21, 30), (31, 512))


def by_length(queries: Sequence[str], latencies: Sequence[float]) -> list[dict[str, Any]]:
    """Latency percentiles per query length in tokens (the encoder's cost grows with it)."""
    tokenizer = load_tokenizer(default_model_path())
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(list(queries))])
    ms = np.asarray(latencies)
    out = []
    for low, high in LENGTH_BUCKETS:
        inside = (lengths >= low) & (lengths <= high)
        if inside.any():
            label = f"{low}-{high}" if high < 512 else f"{low}+"
            out.append({"tokens": label, "latency": summarize(ms[inside].tolist())})
    return out


def concurrency_runs(root: Path, encoder: Any, queries: Sequence[str], levels: Sequence[int]
                     ) -> dict[str, list[dict[str, Any]]]:
    """Queries/s and p95 with batching on and off at each level, in ABBA order (on, off over
    the first half of the queries, then off, on over the second half), so a drift in a
    neighbour's load falls on both."""
    retrievers = {b: load(root, encoder, batching={"enabled": b}) for b in (True, False)}
    for r in retrievers.values():
        r.search_batch(list(queries[:8]))  # warm the encoder for batched shapes
    half = len(queries) // 2
    out: dict[str, list[dict[str, Any]]] = {f"batching={b}": [] for b in retrievers}
    for threads in levels:
        runs: dict[bool, list[tuple[list[float], float]]] = {True: [], False: []}
        for batching, part in ((True, 0), (False, 0), (False, 1), (True, 1)):
            chunk = queries[:half] if part == 0 else queries[half:]
            runs[batching].append(concurrent_run(retrievers[batching], chunk, threads))
        for batching, pair in runs.items():
            latencies = [ms for run in pair for ms in run[0]]
            elapsed = sum(run[1] for run in pair)
            out[f"batching={batching}"].append({"threads": threads,
                                                "qps": len(latencies) / elapsed,
                                                "latency": summarize(latencies)})
    return out


def backend_runs(root: Path, backend: str, queries: Sequence[str], args: argparse.Namespace
                 ) -> dict[str, Any]:
    encoder = make_encoder(backend)
    return {**c1_runs(root, backend, encoder, queries, args.warmup),
            **concurrency_runs(root, encoder, queries, args.concurrency)}


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
    lines = ["# End to end with the query encoder (caches off: every search a full miss)", "",
             f"{results['docs']:,} documents; SciFact's queries; filter {FILTER}.", ""]
    rows = []
    for backend, runs in results["backends"].items():
        for name, summary in runs["c1"].items():
            rows.append([backend, name, percentile_cells(summary)])
    lines += [markdown_table(["backend", "run", "p50 / p95 / p99 ms"], rows), ""]
    rows = [[backend, point["tokens"], point["latency"]["n"], percentile_cells(point["latency"])]
            for backend, runs in results["backends"].items()
            for point in runs["c1 by query length"]]
    lines += ["Defaults at concurrency 1, by query length:", "",
              markdown_table(["backend", "tokens", "queries", "p50 / p95 / p99 ms"], rows), ""]
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
    parser.add_argument("--docs", type=int, default=100_000,
                        help="grow SciFact to this many documents (0: SciFact alone)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS))
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reference = SentenceTransformerEncoder()
    root = grown_index(args.data, args.work, args.docs, reference)
    queries = list(read_queries(args.data / "queries.jsonl").values())
    queries = (queries * (1 + args.queries // len(queries)))[: args.queries + args.warmup]
    results = {"docs": Retriever.load(root).snapshot.manifest.n_docs,
               "backends": {b: backend_runs(root, b, queries, args) for b in args.backends},
               "vectors": vector_dtype_runs(args.data, args.work, reference)}
    markdown = render(results)
    publish_report("throughput", args, results, markdown, key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
