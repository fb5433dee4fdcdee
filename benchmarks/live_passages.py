"""Live writes on a passage build, measured: ``python -m benchmarks.live_passages``.

A passage build of long SciFact documents (two abstracts each, 256-token passages, random
8-dimensional vectors so the model is not measured). One long document at a time is upserted
(split with the model's tokenizer, logged, fsynced) and applied by a serving process
(``refresh``: every passage of the old version retired, the new passages added, BM25
statistics rebuilt); p50/p95/p99 of each after warm-up; then one compaction of all of them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import DEFAULT_DATA, RESULTS_DIR
from indexes import BuildConfig, Document, EncoderInfo, PassageConfig, build_index, read_corpus
from indexes.wal.split import split, token_counter
from indexes.writer import IndexWriter
from retrieval import Retriever

DIM = 8
INFO = EncoderInfo(encoder_id="bench/random-8", model="random-8", dim=DIM,
                   vector_dtype="float32")
CONFIG = PassageConfig(max_tokens=256)


def unit_vectors(n: int, rng: np.random.Generator) -> np.ndarray:
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def long_documents(data: Path, n: int) -> list[Document]:
    abstracts = list(itertools.islice(read_corpus(data), 2 * n))
    return [Document(f"long-{i}", f"{a.text}\n\n{b.text}", a.title)
            for i, (a, b) in enumerate(zip(abstracts[::2], abstracts[1::2], strict=True))]


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1000
    return {f"p{p}_ms": round(float(np.percentile(ms, p)), 2) for p in (50, 95, 99)}


def run(data: Path, n_docs: int, writes: int, warm_up: int, work: Path) -> dict:
    rng = np.random.default_rng(0)
    docs = long_documents(data, n_docs)
    counter = token_counter(None)
    rows, _ = split(docs, counter, CONFIG)
    root = work / "root"
    build_index(docs, root, vectors=unit_vectors(len(rows), rng), encoder_info=INFO,
                config=BuildConfig(passages=CONFIG), progress=False)
    upsert, apply = [], []
    with IndexWriter(root) as writer, Retriever.load(
            root, {"cache": {"backend": "none"}, "live_lag_seconds": None}) as retriever:
        retriever.refresh()
        for i in range(writes):
            old = docs[i % len(docs)]
            new = Document(old.id, f"{old.text}\n\nRevision {i}: {docs[-1 - i].text}", old.title)
            n_passages = len(split([new], counter, CONFIG)[0])
            started = time.perf_counter()
            writer.upsert([new], vectors=unit_vectors(n_passages, rng))
            upsert.append(time.perf_counter() - started)
            started = time.perf_counter()
            retriever.refresh()
            apply.append(time.perf_counter() - started)
        started = time.perf_counter()
        report = writer.compact()
        compact_s = time.perf_counter() - started
    return {"documents": n_docs, "passages": len(rows), "writes": writes,
            "upsert": percentiles(upsert[warm_up:]), "apply": percentiles(apply[warm_up:]),
            "compact_s": round(compact_s, 2), "compacted_rows": report.n_docs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=60)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        results = run(args.data, args.docs, args.writes, args.warm_up, Path(work))
    print(json.dumps(results, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "live_passages.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
