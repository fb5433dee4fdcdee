"""Ingest and the LangChain vector store, measured: ``python -m benchmarks.ingest``.

1. **Ingest throughput** (documents/s, encoding excluded): ``read_corpus`` over the same
   corpus written as JSONL (default field names and mapped ones), CSV, Parquet and a folder of
   Markdown and HTML files (one document per file), best of ``--repeats``.
2. **Vector-store overhead**: ``RetrievalVectorStore.similarity_search`` against
   ``Retriever.search`` on the same loaded root, both on result-cache hits, side by side in
   alternating chunks: p50/p95/p99 per call.
"""

from __future__ import annotations

import argparse
import html
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (
    DEFAULT_DATA,
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    publish_report,
)
from indexes import FieldMapping, read_corpus, read_queries

MAPPED = FieldMapping(id_field="doc", text_field="body", title_field="headline")


def write_formats(docs: list[Any], work: Path) -> dict[str, tuple[Path, FieldMapping | None]]:
    rows = [{"doc": d.id, "headline": d.title, "body": d.text, **d.metadata} for d in docs]
    plain = work / "plain.jsonl"
    plain.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                         "metadata": d.metadata}) + "\n" for d in docs))
    mapped = work / "mapped.jsonl"
    mapped.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, work / "corpus.parquet")
    import pyarrow.csv as pa_csv

    pa_csv.write_csv(table, work / "corpus.csv")
    folder = work / "files"
    folder.mkdir()
    for i, d in enumerate(docs):
        if i % 2:
            (folder / f"{i}.md").write_text(f"# {d.title}\n\n{d.text}\n")
        else:
            (folder / f"{i}.html").write_text(
                f"<html><head><title>{html.escape(d.title)}</title></head><body>"
                f"<h1>{html.escape(d.title)}</h1><p>{html.escape(d.text)}</p></body></html>")
    return {"JSONL": (plain, None), "JSONL, mapped fields": (mapped, MAPPED),
            "CSV, mapped": (work / "corpus.csv", MAPPED),
            "Parquet, mapped": (work / "corpus.parquet", MAPPED),
            "folder of .md/.html files": (folder, None)}


def ingest_rates(formats: dict[str, tuple[Path, FieldMapping | None]], repeats: int
                 ) -> dict[str, float]:
    rates = {}
    for name, (path, mapping) in formats.items():
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            count = sum(1 for _ in read_corpus(path, mapping))
            best = min(best, time.perf_counter() - started)
        rates[name] = count / best
    return rates


def store_overhead(docs: list[Any], queries: list[str], work: Path, rounds: int
                   ) -> dict[str, dict[str, float]]:
    from retrieval.integrations.langchain_store import RetrievalVectorStore

    store = RetrievalVectorStore(work / "store")
    store.add_texts([d.text for d in docs], [d.metadata for d in docs], ids=[d.id for d in docs])
    retriever = store._retriever
    assert retriever is not None
    for query in queries:  # fill the result cache: every timed call is a hit
        retriever.search(query, None, 4)
        store.similarity_search(query, k=4)
    samples = measure_side_by_side(
        {"Retriever.search": lambda q: retriever.search(q, None, 4),
         "RetrievalVectorStore.similarity_search": lambda q: store.similarity_search(q, k=4)},
        queries * rounds, warmup=queries[:20], chunk=50)
    store.close()
    return {name: value.summary() for name, value in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    docs = list(read_corpus(args.data))
    queries = list(read_queries(args.data / "queries.jsonl").values())[:200]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        rates = ingest_rates(write_formats(docs, Path(tmp)), args.repeats)
        overhead = store_overhead(docs, queries, Path(tmp), args.rounds)
    results = {"documents": len(docs), "ingest_docs_per_s": rates, "cache_hit_ms": overhead}
    text = "\n\n".join([
        f"Ingest of {len(docs)} documents (read_corpus, best of {args.repeats}):",
        markdown_table(["format", "docs/s"], [[n, f"{r:,.0f}"] for n, r in rates.items()]),
        "Result-cache hits, ms per call:",
        markdown_table(["call", "p50", "p95", "p99"],
                       [[n, f"{s['p50']:.4f}", f"{s['p95']:.4f}", f"{s['p99']:.4f}"]
                        for n, s in overhead.items()])])
    publish_report("ingest", args, results, text)


if __name__ == "__main__":
    main()
