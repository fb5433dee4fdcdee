"""Long documents: one vector per document against passages grouped by document.

    python -m benchmarks.passages                     # Cranfield long documents + 1M passages
    python -m benchmarks.passages --quick             # + 100k passages (10k documents) only
    python -m benchmarks.passages --dataset cisi --group 8 --no-latency

Quality: a BEIR collection's documents concatenated ``--group`` at a time (consecutive ids, one
paragraph each, "title. text") into long documents; a long document's relevance to a query is
the highest grade of its members. Both builds use the real model; nDCG@10 of the whole-document
build, of the passage build grouped by document, and of the passage build ungrouped (its
passages mapped to their documents, first occurrence kept: duplicates take places in the top
10), with build time and index size of both.

Latency: the search path (validate, BM25 top-C, re-rank, fuse, group, hydrate) over a
synthetic Zipfian corpus (``benchmarks.synthetic_corpus``) of ``--passages`` passages, 10 per
document, with random unit vectors: encoding a million passages is out of reach on this
machine, and the grouping cost does not depend on what the vectors mean. Query vectors are
given, so no encoder runs.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    single_thread,
    tree_bytes,
)
from benchmarks.synthetic import random_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, bm25_index, generate, metadata_index
from benchmarks.synthetic_corpus import queries as corpus_queries
from indexes import (
    BuildConfig,
    Document,
    PassageConfig,
    SentenceTransformerEncoder,
    build_index,
    read_corpus,
    read_qrels,
    read_queries,
)
from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.ann import ExactDense
from indexes.docstore import DocStore
from indexes.manifest import EncoderInfo, Manifest
from indexes.passages import PassageInfo, PassageMap
from indexes.vectors import VectorStore
from retrieval import Retriever, RetrieverConfig
from retrieval.demo_quality import ndcg_at_10
from retrieval.loaded_build import LoadedBuild

PER_DOCUMENT = 10
DIM = 384

# -- quality -----------------------------------------------------------------------------------


def long_documents(path: Path, group: int
                   ) -> tuple[list[Document], dict[str, str], dict[str, dict[str, int]]]:
    """Documents of ``group`` consecutive members, the queries and the qrels on them."""
    members = list(read_corpus(path))
    parent_of: dict[str, str] = {}
    docs = []
    for start in range(0, len(members), group):
        chunk = members[start:start + group]
        doc_id = f"long-{start // group}"
        paragraphs = [f"{m.title}. {m.text}".strip(". ") if m.title else m.text for m in chunk]
        docs.append(Document(doc_id, "\n\n".join(paragraphs)))
        parent_of.update({m.id: doc_id for m in chunk})
    qrels: dict[str, dict[str, int]] = {}
    for query, judged in read_qrels(path / "qrels" / "test.tsv").items():
        for member, grade in judged.items():
            if grade > 0 and member in parent_of:
                parent = qrels.setdefault(query, {})
                parent[parent_of[member]] = max(grade, parent.get(parent_of[member], 0))
    queries = {q: t for q, t in read_queries(path / "queries.jsonl").items() if q in qrels}
    return docs, queries, qrels


def run_of(retriever: Retriever, queries: dict[str, str], **options: Any
           ) -> dict[str, dict[str, float]]:
    """Query -> {document id: score}, each document at its first (best) place."""
    run: dict[str, dict[str, float]] = {}
    results = retriever.search_batch(list(queries.values()), k=10, **options)
    for query, result in zip(queries, results, strict=True):
        ranked: dict[str, float] = {}
        for place, hit in enumerate(result.hits):
            ranked.setdefault(hit.doc_id, 10.0 - place)
        run[query] = ranked
    return run


def quality(args: argparse.Namespace) -> dict[str, Any]:
    docs, queries, qrels = long_documents(args.data / args.dataset, args.group)
    encoder = SentenceTransformerEncoder()
    configs = {"whole documents": BuildConfig(reuse_vectors=False),
               "passages": BuildConfig(reuse_vectors=False, passages=PassageConfig(
                   max_tokens=args.max_tokens, overlap_tokens=args.overlap))}
    rows: dict[str, Any] = {}
    for name, config in configs.items():
        root = args.work / f"{args.dataset}-{name.replace(' ', '-')}"
        shutil.rmtree(root, ignore_errors=True)
        began = time.perf_counter()
        report = build_index(docs, root, encoder=encoder, config=config, progress=False)
        seconds = time.perf_counter() - began
        with Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder) as retriever:
            scores = {"ndcg@10": ndcg_at_10(qrels, run_of(retriever, queries))}
            if report.passages is not None:
                scores["ndcg@10 grouped"] = ndcg_at_10(
                    qrels, run_of(retriever, queries, group_by="document"))
        size_mb = round(tree_bytes(report.path) / 2**20, 2)
        rows[name] = {"rows": report.n_docs, "build_s": round(seconds, 1),
                      "stages_s": report.seconds, "index_mb": size_mb,
                      "window": report.window.model_dump() if report.window else None, **scores}
    return {"dataset": args.dataset, "group": args.group, "documents": len(docs),
            "queries": len(queries), "builds": rows}


def quality_table(result: dict[str, Any]) -> str:
    builds = result["builds"]
    whole, parts = builds["whole documents"], builds["passages"]
    table = markdown_table(
        ["build", "rows", "nDCG@10", "build s", "index MB"],
        [["one vector per document", whole["rows"], f"{whole['ndcg@10']:.4f}",
          whole["build_s"], whole["index_mb"]],
         ["passages, grouped by document", parts["rows"], f"{parts['ndcg@10 grouped']:.4f}",
          parts["build_s"], parts["index_mb"]],
         ["passages, not grouped", parts["rows"], f"{parts['ndcg@10']:.4f}", "", ""]])
    window = whole["window"]
    return (f"{result['dataset']}: {result['documents']} long documents of {result['group']} "
            f"members, {result['queries']} queries; {window['over_window']} documents "
            f"({window['share']:.0%}) longer than the {window['window']}-token window "
            f"(longest {window['longest_tokens']} tokens)\n\n{table}")


# -- latency -------------------------------------------------------------------------------


def synthetic_passage_build(n_passages: int) -> LoadedBuild:
    """A passage build held in memory: ``PER_DOCUMENT`` consecutive rows per document."""
    corpus = generate(CorpusSpec(n_passages, passages_per_article=PER_DOCUMENT))
    rows = np.arange(n_passages)
    passages = PassageMap((rows // PER_DOCUMENT).astype(np.int32),
                          (rows % PER_DOCUMENT).astype(np.int32),
                          (rows % PER_DOCUMENT * 500).astype(np.int64),
                          (rows % PER_DOCUMENT * 500 + 600).astype(np.int64))
    docs = DocStore.build([Document(f"doc-{r // PER_DOCUMENT}", f"passage {r}", "")
                           for r in range(n_passages)])
    vectors = VectorStore.build(related_vectors(n_passages, seed=3), "float32")
    analyzer = Analyzer(AnalyzerConfig(stemmer=None, stop_words=()))
    metadata = metadata_index(corpus)
    info = PassageInfo(max_tokens=256, overlap_tokens=0, n_documents=int(passages.parent[-1]) + 1,
                       n_passages=n_passages, max_per_document=PER_DOCUMENT)
    manifest = Manifest(
        format_version=1, build_id="synthetic-passages", created_at="", n_docs=n_passages,
        analyzer=analyzer.config.model_dump(mode="json"), analyzer_fingerprint=analyzer.fingerprint,
        encoder=EncoderInfo(encoder_id="random:none:fp32:384", model="random", dim=DIM,
                            vector_dtype="float32"),
        bm25={}, metadata_fields=dict(metadata.kinds), files={}, passages=info)
    return LoadedBuild(path=Path("."), manifest=manifest, analyzer=analyzer,
                       bm25=bm25_index(corpus), metadata=metadata, vectors=vectors, docs=docs,
                       dense=ExactDense(vectors), passages=passages)


def related_vectors(n_passages: int, seed: int) -> np.ndarray:
    """Unit vectors in which the passages of one document share a direction (as real
    passages of one text do), so a document's passages crowd a top 10 together."""
    documents = random_unit_vectors(-(-n_passages // PER_DOCUMENT), DIM, seed=seed)
    vectors = random_unit_vectors(n_passages, DIM, seed=seed + 1)
    for start in range(0, n_passages, 100_000):  # bounded temporaries
        stop = min(start + 100_000, n_passages)
        block = documents[np.arange(start, stop) // PER_DOCUMENT] + 0.6 * vectors[start:stop]
        vectors[start:stop] = _unit(block)
    return vectors


def _unit(matrix: np.ndarray) -> np.ndarray:
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


def latency(n_passages: int, n_queries: int, warmup: int) -> dict[str, Any]:
    began = time.perf_counter()
    snapshot = synthetic_passage_build(n_passages)
    setup_s = time.perf_counter() - began
    retriever = Retriever(snapshot, RetrieverConfig(), None)
    spec_queries = corpus_queries(generate(CorpusSpec(1000)), n_queries + warmup, seed=1)
    texts = [" ".join(words) for words in spec_queries]
    # Each query lies near one passage: its document's other passages rank close behind it.
    near = np.random.default_rng(4).integers(0, n_passages, len(texts))
    vectors = _unit(snapshot.vectors.reconstruct_rows(near) + 0.5 * random_unit_vectors(
        len(texts), DIM, seed=5))
    grouped = {"group_by": "document"}
    options: dict[str, dict[str, Any]] = {
        "passages (k=10)": {}, "grouped by document (k=10)": grouped,
        "grouped, context=1": {**grouped, "context": 1},
        # C = k: the candidates often span fewer than k documents, so grouping widens them
        "grouped, candidates=10": {**grouped, "candidates": 10}}
    runners = {name: _runner(retriever, texts, vectors, opts) for name, opts in options.items()}
    with single_thread():
        samples = measure_side_by_side(runners, list(range(warmup, warmup + n_queries)),
                                       list(range(warmup)))
    retriever.close()
    return {"passages": n_passages, "documents": n_passages // PER_DOCUMENT,
            "queries": n_queries, "setup_s": round(setup_s, 1),
            "latency_ms": {name: s.summary() for name, s in samples.items()},
            "distinct_documents": {name: float(np.mean(s.outputs)) for name, s in samples.items()}}


def _runner(retriever: Retriever, texts: Sequence[str], vectors: np.ndarray,
            options: dict[str, Any]) -> Any:
    def run(i: int) -> int:
        hits = retriever.search(texts[i], k=10, query_vector=vectors[i], **options).hits
        return len({h.doc_id for h in hits})

    return run


def latency_table(result: dict[str, Any]) -> str:
    rows = [[name, percentile_cells(summary), f"{result['distinct_documents'][name]:.1f}"]
            for name, summary in result["latency_ms"].items()]
    return (f"{result['passages']:,} passages of {result['documents']:,} documents, "
            f"{result['queries']} queries, one thread\n\n"
            + markdown_table(["search", "p50 / p95 / p99 ms", "distinct documents in top 10"],
                             rows))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--dataset", default="cranfield")
    parser.add_argument("--group", type=int, default=8, help="members per long document")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="100k passages, 300 queries")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("build/bench-passages"))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.passages, args.queries = 100_000, 300
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {}
    sections = []
    if not args.no_quality:
        results["quality"] = quality(args)
        sections.append(quality_table(results["quality"]))
    if not args.no_latency:
        results["latency"] = latency(args.passages, args.queries, args.warmup)
        sections.append(latency_table(results["latency"]))
    publish_report("passages", args, results, "\n\n".join(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
