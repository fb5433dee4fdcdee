"""Writes over HTTP against the in-process writer, in one run: ``python -m benchmarks.writes``.

1. **Throughput** (documents/s) of upserts with precomputed vectors, batches of 1 and 100, by
   ``--clients`` concurrent callers: ``IndexWriter.upsert`` in this process (threads sharing
   one writer), then ``POST /v1/documents`` to ``retrieval serve`` with 2 forked workers (each
   worker's writer takes the root's append lock in turn) through ``RemoteRetriever.upsert``
   (vectors as base64 float32). Every write is one fsync'd record either way; the HTTP figure
   adds JSON, the network stack and the lock hand-over. Two modes (``run``): the write path
   alone, and while serving (every serving process applying the writes as they land).
2. **Visibility lag**: after each acknowledged HTTP write (one document), the time until a
   search in *another* serving process (a ``Retriever`` following the same root here, with
   the service's default ``live_lag_seconds``) returns that document: p50/p95/p99/max.

The index is SciFact with its vectors from an existing build (``--vectors-from``); upserted
documents carry random unit vectors of the index's dimension (throughput does not depend on
what they say).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import DEFAULT_DATA, REPO, RESULTS_DIR, markdown_table, publish_report
from benchmarks.http import serving
from benchmarks.live import scifact
from indexes import Document, build_index
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.latency import summarize

LAG_TARGET_MS = 1000.0
RATIO_TARGET = 0.5
KEY = "bench-write-key"


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def batches(tag: str, size: int, count: int, dim: int) -> list[tuple[list[Document], Any]]:
    return [([Document(f"{tag}-{b}-{i}", f"benchmark document {tag} {b} {i}",
                       metadata={"year": 2000 + i % 20}) for i in range(size)],
             unit_rows(size, dim, b)) for b in range(count)]


def rate(write: Callable[[list[Document], Any], Any], work: list[tuple[list[Document], Any]],
         clients: int) -> float:
    """Documents per second with ``clients`` threads taking batches from ``work``."""
    pending = list(reversed(work))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not pending:
                    return
                docs, vectors = pending.pop()
            write(docs, vectors)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(len(d) for d, _ in work) / (time.perf_counter() - started)


def http_writer(url: str) -> Callable[[list[Document], Any], Any]:
    """``RemoteRetriever.upsert`` (vectors sent as base64 float32), one client per thread."""
    from retrieval.client import RemoteRetriever

    local = threading.local()

    def write(docs: list[Document], vectors: np.ndarray) -> int:
        if not hasattr(local, "client"):
            local.client = RemoteRetriever(url, KEY, timeout=60)
        return int(local.client.upsert(docs, vectors).seq)

    return write


def lag_ms(url: str, root: Path, writes: int, dim: int) -> list[float]:
    """ms from each HTTP acknowledgement to the document showing up in another process's
    search (polled every 2 ms)."""
    write = http_writer(url)
    observed = []
    with Retriever.load(root, {"cache": {"backend": "none"}}) as follower:
        for n, (docs, vectors) in enumerate(batches("lag", 1, writes, dim)):
            write(docs, vectors)
            acked = time.perf_counter()
            spec = {"id": docs[0].id}
            while not follower.search(docs[0].text, spec, 1, query_vector=vectors[0]).hits:
                time.sleep(0.002)
            observed.append((time.perf_counter() - acked) * 1000)
            time.sleep(0.01 + (n % 5) * 0.01)  # writes land at varied points of a poll
    return observed


MODES = {"write path": {"live_lag_seconds": None}, "while serving": {}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each mode on a fresh root: ``write path`` with no process following the log, and
    ``while serving`` with every serving process applying the writes as they land (the
    in-process writer beside a ``Retriever`` following the root, as an app embedding both
    would; the service's workers each following it)."""
    docs, vectors, info = scifact(args.data, args.vectors_from)
    results: dict[str, Any] = {"clients": args.clients, "rates": {}}
    with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text(f"{KEY} write\n")
        for mode, live in MODES.items():
            root = Path(tmp) / mode.replace(" ", "-")
            build_index(docs, root, vectors=vectors, encoder_info=info, progress=False)
            retriever = {"cache": {"backend": "none"}, **live}
            follower = Retriever.load(root, retriever) if not live else None
            with IndexWriter(root) as writer:
                for size, count in ((1, args.single), (100, args.hundreds)):
                    work = batches(f"local{size}", size, count, info.dim)
                    results["rates"][f"{mode}: in-process, batch {size}"] = rate(
                        lambda d, v: writer.upsert(d, vectors=v), work, args.clients)
            if follower is not None:
                follower.close()
            with serving(root, 2, retriever,
                         {"api_keys_file": str(keys), "metrics_auth": False}) as (url, _):
                for size, count in ((1, args.single), (100, args.hundreds)):
                    work = batches(f"http{size}", size, count, info.dim)
                    results["rates"][f"{mode}: HTTP, batch {size}"] = rate(
                        http_writer(url), work, args.clients)
                if not live:
                    results["lag_ms"] = summarize(lag_ms(url, root, args.lag_writes, info.dim))
    rates = results["rates"]
    results["ratios"] = {f"{mode}, batch {size}": rates[f"{mode}: HTTP, batch {size}"]
                         / rates[f"{mode}: in-process, batch {size}"]
                         for mode in MODES for size in (1, 100)}
    return results


def markdown(results: dict[str, Any]) -> str:
    lag = results["lag_ms"]
    return "\n\n".join([
        f"Upserts with precomputed vectors, {results['clients']} concurrent callers "
        "(documents/s):",
        markdown_table(["mode: writer", "docs/s"], [[name, f"{value:.0f}"]
                                                    for name, value in results["rates"].items()]),
        "HTTP / in-process: " + ", ".join(f"{name} {value:.2f}" for name, value in
                                          results["ratios"].items())
        + f" (target >= {RATIO_TARGET} for batches of 100)",
        "Visibility lag, HTTP acknowledgement to a search in another process (ms):",
        markdown_table(["p50", "p95", "p99", "max"],
                       [[f"{lag[k]:.1f}" for k in ("p50", "p95", "p99", "max")]]),
        f"lag p99 target <= {LAG_TARGET_MS:.0f} ms",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--vectors-from", type=Path,
                        default=REPO / "build" / "test-indexes" / "scifact")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--single", type=int, default=400, help="writes of 1 document")
    parser.add_argument("--hundreds", type=int, default=40, help="writes of 100 documents")
    parser.add_argument("--lag-writes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    results = run(args)
    publish_report("writes", args, results, markdown(results))


if __name__ == "__main__":
    main()
