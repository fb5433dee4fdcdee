"""End-to-end demo: build an index, search it, print its quality and per-stage p50/p95/p99."""

from __future__ import annotations

import itertools
from pathlib import Path

from indexes.build import build_index
from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder
from indexes.errors import CorpusError
from retrieval.demo_quality import print_quality
from retrieval.latency import by_stage, format_table
from retrieval.retriever import Retriever

# A development checkout may hold the larger SciFact next to the repository; every clone ships
# Cranfield (1,400 documents, 225 judged queries) under examples/data.
NEIGHBOUR_DATA = Path("../shared/data/scifact")
SHIPPED_DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "cranfield"
EXAMPLE_FILTER = {"doc_type": {"in": ["review", "trial"]}, "year": {"gte": 2010}}
WARMUP = 20


def default_data() -> Path:
    """The BEIR folder the demo uses when none is given."""
    return NEIGHBOUR_DATA if (NEIGHBOUR_DATA / "corpus.jsonl").is_file() else SHIPPED_DATA


def _source(data: str | None) -> tuple[str, Path, list, dict[str, str]]:
    """(name, BEIR folder, documents, {query id: text})."""
    path = Path(data) if data else default_data()
    if not (path / "corpus.jsonl").is_file():
        raise CorpusError(f"{path} has no corpus.jsonl: give --data a BEIR folder "
                          "(corpus.jsonl, queries.jsonl, qrels/test.tsv)")
    docs = list(with_demo_metadata(read_corpus(path)))
    queries = read_queries(path / "queries.jsonl")
    print(f"data: BEIR folder {path.resolve()} ({len(docs)} documents, {len(queries)} queries;"
          " department/doc_type/year are generated demo fields)")
    return path.name, path, docs, queries


def run_demo(data: str | None, out: Path, n_queries: int = 1000) -> int:
    name, folder, docs, queries_by_id = _source(data)
    root = out / name
    encoder = SentenceTransformerEncoder()
    print(f"building index at {root} (vectors of unchanged documents are reused) ...")
    report = build_index(docs, root, encoder=encoder)
    print(f"build {report.build_id}: {report.n_docs} docs, {report.describe_vectors()}, "
          f"seconds {report.seconds}")
    # Queries use the configured (default: ONNX INT8) encoder; documents used the torch reference.
    uncached = Retriever.load(root, {"cache": {"backend": "none"}})
    print_quality(uncached, folder, queries_by_id)
    queries = list(queries_by_id.values())
    _show_example(uncached, queries[0])
    sample = list(itertools.islice(itertools.cycle(queries), n_queries + WARMUP))
    runs = (("no filter, no cache (query encoder included)", uncached, None),
            (f"filter {EXAMPLE_FILTER}, no cache (query encoder included)", uncached,
             EXAMPLE_FILTER))
    for label, retriever, filters in runs:
        _report(label, [retriever.search(q, filters=filters, k=10).timings for q in sample])
    cached = Retriever.load(root)  # the in-process cache (the default)
    for query in sample:
        cached.search(query, filters=EXAMPLE_FILTER, k=10)
    _report("the same queries again, in-process result cache (hits)",
            [cached.search(q, filters=EXAMPLE_FILTER, k=10).timings for q in sample])
    return 0


def _report(label: str, timings: list[dict[str, float]]) -> None:
    print(f"\n{label}: {len(timings) - WARMUP} queries, warm-up discarded\n")
    print(format_table(by_stage(timings[WARMUP:])))


def _show_example(retriever: Retriever, query: str) -> None:
    result = retriever.search(query, filters=EXAMPLE_FILTER, k=5)
    print(f"\nquery: {query!r}\nfilters: {EXAMPLE_FILTER} ({result.allowed} documents allowed)")
    for rank, hit in enumerate(result.hits, start=1):
        meta = hit.metadata
        print(f"  {rank}. [{hit.doc_id}] score={hit.score:.3f} bm25={hit.bm25_score:.2f} "
              f"cos={hit.vector_score:.3f} {meta.get('doc_type')}/{meta.get('year')} "
              f"{(hit.title or hit.text)[:60]}")
