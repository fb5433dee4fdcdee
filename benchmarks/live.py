"""Live updates, measured: ``python -m benchmarks.live``.

1. **Upsert throughput** through ``IndexWriter`` (validate, embed, append, fsync, ack): texts
   encoded by the real model (encoding dominates), and with precomputed vectors (the log alone).
2. **Visibility lag**: a writer subprocess upserts one document every 30 ms (200 writes); this
   process serves the root with the default ``live_lag_seconds`` and notes when each
   acknowledged seq becomes searchable (same monotonic clock): p50/p95/p99/max.
3. **Search path with a delta** of 0%, 1% and 10% of SciFact (withheld from the base build,
   then upserted) against a fresh build of the same live corpus: p50/p95/p99 per search (query
   vector given, so the encoder is not measured), side by side in alternating chunks; plus the
   time to apply the delta (live BM25 statistics rebuild) and to compact it.

SciFact vectors come from an existing SciFact index (``--vectors-from``, by content hash), so
only part 1 runs the model.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    fmt_ms,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    single_thread,
)
from indexes import Document, EncoderInfo, build_index, read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.storage import load_array
from indexes.vectors import VectorStore, content_hashes
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.latency import summarize

NO_CACHE = {"cache": {"backend": "none"}, "live_lag_seconds": None}


def scifact(data: Path, vectors_from: Path) -> tuple[list[Document], np.ndarray, EncoderInfo]:
    docs = list(with_demo_metadata(read_corpus(data)))
    build = resolve_build_dir(vectors_from)
    store = VectorStore.load(build / "vectors")
    row_of = {bytes(h): r for r, h in enumerate(load_array(build / "vectors" /
                                                           "content_hashes.npy"))}
    rows = [row_of[bytes(h)] for h in content_hashes([d.content for d in docs])]
    return docs, store.reconstruct_rows(np.asarray(rows)), read_manifest(build).encoder


def delta_case(docs: list[Document], vectors: np.ndarray, info: EncoderInfo, fraction: float,
               work: Path, queries: list[str], query_vectors: np.ndarray,
               repeats: int) -> dict[str, Any]:
    """Base = corpus minus ``fraction``, those upserted; live vs a fresh build of it."""
    rng = random.Random(15)
    withheld = sorted(rng.sample(range(len(docs)), int(round(fraction * len(docs)))))
    held = set(withheld)
    kept = [i for i in range(len(docs)) if i not in held]
    root, fresh_root = work / f"live-{fraction}", work / f"fresh-{fraction}"
    build_index([docs[i] for i in kept], root, vectors=vectors[kept], encoder_info=info,
                progress=False)
    order = kept + withheld
    build_index([docs[i] for i in order], fresh_root, vectors=vectors[order], encoder_info=info,
                progress=False)
    live = Retriever.load(root, NO_CACHE)
    apply_s = 0.0
    writer = IndexWriter(root)
    if withheld:
        writer.upsert([docs[i] for i in withheld], vectors=vectors[withheld])
        started = time.perf_counter()
        live.refresh()
        apply_s = time.perf_counter() - started
    fresh = Retriever.load(fresh_root, NO_CACHE)
    items = [(q, v) for _ in range(repeats) for q, v in zip(queries, query_vectors, strict=True)]
    with single_thread():
        samples = measure_side_by_side(
            {"live": lambda item: live.search(item[0], query_vector=item[1]),
             "fresh": lambda item: fresh.search(item[0], query_vector=item[1])},
            items, warmup=items[:50], chunk=50)
    same = sum([h.doc_id for h in a.hits] == [h.doc_id for h in b.hits] for a, b in
               zip(samples["live"].outputs, samples["fresh"].outputs, strict=True))
    compact_s = None
    if withheld:
        started = time.perf_counter()
        writer.compact()
        compact_s = time.perf_counter() - started
    writer.close()
    live.close()
    fresh.close()
    summaries = {name: s.summary() for name, s in samples.items()}
    # A busy shared machine puts scheduler stalls into single samples: the p95 over queries of
    # each query's median over the repeats shows the search's own tail.
    steady = {name: float(np.percentile(np.median(np.reshape(s.wall_ms, (repeats, -1)), axis=0),
                                        95)) for name, s in samples.items()}
    return {"fraction": fraction, "delta_docs": len(withheld), "apply_seconds": apply_s,
            "compact_seconds": compact_s, "live": summaries["live"],
            "fresh": summaries["fresh"], "same_top10": same / len(items),
            "p95_ratio": summaries["live"]["p95"] / summaries["fresh"]["p95"],
            "steady_p95": steady, "steady_p95_ratio": steady["live"] / steady["fresh"]}


def upsert_throughput(docs: list[Document], vectors: np.ndarray, info: EncoderInfo,
                      work: Path, n_encoded: int) -> dict[str, float]:
    root = work / "throughput"
    build_index(docs[:2000], root, vectors=vectors[:2000], encoder_info=info, progress=False)
    out = {}
    with IndexWriter(root, SentenceTransformerEncoder()) as writer:
        writer.upsert([Document("warm", "warm up the model")])
        changed = [Document(d.id, f"{d.text} (revised)", d.title, d.metadata)
                   for d in docs[:n_encoded]]
        started = time.perf_counter()
        for start in range(0, n_encoded, 32):
            writer.upsert(changed[start:start + 32])
        out["encoded_docs_per_s"] = n_encoded / (time.perf_counter() - started)
        started = time.perf_counter()
        for start in range(2000, 4000, 100):
            writer.upsert(docs[start:start + 100], vectors=vectors[start:start + 100])
        out["precomputed_docs_per_s"] = 2000 / (time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(200):
            writer.upsert([docs[4000 + i]], vectors=vectors[4000 + i:4001 + i])
        out["single_doc_writes_per_s"] = 200 / (time.perf_counter() - started)
    return out


def visibility_lag(root: Path, writes: int) -> dict[str, float]:
    """A writer subprocess appends; this process notes when each seq is being served.

    One write is applied first (``refresh``): it pays the one-off analysis of the base's texts
    (reported as ``apply_seconds`` of the delta cases), so the lags are the steady state.
    """
    retriever = Retriever.load(root, {"cache": {"backend": "none"}})  # default lag
    with IndexWriter(root) as writer:
        vector = np.zeros((1, writer.manifest.encoder.dim), dtype=np.float32)
        vector[0, 0] = 1.0
        writer.upsert([Document("lag-warm", "visibility probe warm-up")], vectors=vector)
    retriever.refresh()
    seen: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            build_id = retriever.snapshot.build_id
            seq = int(build_id.rsplit("+", 1)[1]) if "+" in build_id else 0
            seen.setdefault(seq, time.monotonic())
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    child = subprocess.run([sys.executable, "-m", "benchmarks.live", "--write-child", str(root),
                            "--writes", str(writes)], capture_output=True, text=True,
                           check=True, cwd=REPO)
    time.sleep(2.0)
    stop.set()
    watcher.join()
    retriever.close()
    lags = []
    for line in child.stdout.split("\n"):
        if line.strip():
            seq, acked = line.split()
            first = min((t for s, t in seen.items() if s >= int(seq)), default=None)
            if first is not None:
                lags.append((first - float(acked)) * 1e3)
    return {**summarize(lags), "writes": writes, "seen": len(lags)}


def write_child(root: Path, writes: int) -> None:
    with IndexWriter(root) as writer:
        dim = writer.manifest.encoder.dim
        rng = np.random.default_rng(0)
        for i in range(writes):
            vector = rng.normal(size=(1, dim)).astype(np.float32)
            seq = writer.upsert([Document(f"lag-{i}", f"visibility probe {i}")],
                                vectors=vector / np.linalg.norm(vector))
            print(seq, time.monotonic(), flush=True)
            time.sleep(0.03)


def report(results: dict[str, Any]) -> str:
    rows = [[f"{c['fraction']:.0%} ({c['delta_docs']} docs)", percentile_cells(c["fresh"]),
             percentile_cells(c["live"]), f"{c['p95_ratio']:.2f}x",
             f"{fmt_ms(c['steady_p95']['fresh'])} / {fmt_ms(c['steady_p95']['live'])} "
             f"({c['steady_p95_ratio']:.2f}x)", f"{c['same_top10']:.1%}",
             f"{c['apply_seconds']:.3f}",
             "" if c["compact_seconds"] is None else f"{c['compact_seconds']:.2f}"]
            for c in results["deltas"]]
    lag = results["lag"]
    put = results["throughput"]
    return "\n\n".join([
        "## Search path with a delta (ms p50 / p95 / p99; query vector given)",
        markdown_table(["delta", "fresh build", "base + delta", "p95 ratio",
                        "p95 of per-query medians: fresh / live", "same top-10",
                        "apply s", "compact s"], rows),
        "## Visibility lag (ms, acknowledged -> served, default live_lag_seconds=1)",
        markdown_table(["writes", "p50", "p95", "p99", "max"],
                       [[lag["writes"], *(fmt_ms(lag[k]) for k in ("p50", "p95", "p99", "max"))]]),
        "## Upsert throughput (docs/s, fsync per call)",
        markdown_table(["encoded by the model (32/call)", "precomputed (100/call)",
                        "single-document calls"],
                       [[f"{put['encoded_docs_per_s']:.0f}", f"{put['precomputed_docs_per_s']:.0f}",
                         f"{put['single_doc_writes_per_s']:.0f}"]]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--vectors-from", type=Path,
                        default=REPO / "build" / "test-indexes" / "scifact")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--encoded", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--write-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_child is not None:
        write_child(args.write_child, args.writes)
        return
    docs, vectors, info = scifact(args.data, args.vectors_from)
    qrels = read_qrels(args.data / "qrels" / "test.tsv")
    queries = [t for q, t in read_queries(args.data / "queries.jsonl").items() if q in qrels]
    query_vectors = SentenceTransformerEncoder().encode(queries)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        deltas = [delta_case(docs, vectors, info, f, work, queries, query_vectors, args.repeats)
                  for f in (0.0, 0.01, 0.10)]
        lag = visibility_lag(work / "live-0.01", args.writes)
        throughput = upsert_throughput(docs, vectors, info, work, args.encoded)
    results = {"deltas": deltas, "lag": lag, "throughput": throughput}
    publish_report("live", args, results, report(results))


if __name__ == "__main__":
    main()
