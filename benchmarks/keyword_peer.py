"""The search path against tantivy's BM25 on the same corpus and queries, in one run.

    python -m benchmarks.keyword_peer --docs 1000000

The realistic synthetic corpus (``benchmarks.synthetic_corpus``) with clustered vectors, and
query vectors drawn around the same clusters (so the dense leg's IVF index works as on real
embeddings); query vectors given (no encoder), no cache. This project: the whole search path
(validate, BM25 top 300, dense leg, re-rank, fuse, top 10, hydrate) with the default union
policy and with keyword candidates only, and its BM25 top 300 alone (``BM25Index``), on the
plain postings format and on the compact one (``indexes.compact_postings``). tantivy
0.27 (``en_stem``, one segment after merging): BM25 top 300 and top 10 of the same query text
(its default OR query, ``count=False``). Turns rotate in chunks (``measure_side_by_side``).

What each side is: tantivy-py's ``Searcher.search`` collects through a ``MultiCollector``,
which scores every matching document (no Block-WAND pruning: its top 10 costs what its top
300 does); tantivy from Rust with a bare ``TopDocs`` would prune. It runs on one thread. This
project's BM25 spreads a query over both cores once it has 50,000 postings or more, and the
union policy's dense leg runs beside it: the CPU column shows what each side spent, as the
process's CPU time over a side's measured searches (all threads) divided by their number. It
is a mean, not per-search percentiles: Linux updates the CPU time of threads other than the
reading one only at their ticks and switches, so one search's reading can be off by a tick
(``benchmarks.common.Samples``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.build_speed import corpus_texts
from benchmarks.common import (
    RESULTS_DIR,
    Samples,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    summarize,
)
from benchmarks.synthetic import clustered_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, generate, queries

WORK = Path("build/keyword-peer")
PEER = "tantivy BM25 top 300"
CPU_COLUMN = "CPU ms per search, mean (all threads)"


def project_index(n_docs: int, texts: list[str], records: list[dict[str, object]],
                  postings: str) -> Path:
    from indexes.build import BuildConfig, build_index
    from indexes.docstore import Document
    from indexes.manifest import EncoderInfo

    root = WORK / f"project-{n_docs}-{postings}"
    if not (root / "CURRENT").is_file():
        docs = [Document(id=f"p{i}", text=t, metadata=r)
                for i, (t, r) in enumerate(zip(texts, records, strict=True))]
        info = EncoderInfo(encoder_id="given", model="given", dim=384, vector_dtype="float32")
        build_index(docs, root, vectors=clustered_unit_vectors(n_docs, 384), encoder_info=info,
                    progress=False, config=BuildConfig(postings=postings))  # type: ignore[arg-type]
    return root


def tantivy_index(n_docs: int, texts: list[str]) -> Any:
    import tantivy

    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", tokenizer_name="en_stem")
    directory = WORK / f"tantivy-{n_docs}"
    if not directory.is_dir():
        directory.mkdir(parents=True)
        index = tantivy.Index(schema.build(), path=str(directory))
        writer = index.writer(heap_size=512_000_000, num_threads=1)
        for i, text in enumerate(texts):
            writer.add_document(tantivy.Document(id=f"p{i}", body=text))
        writer.commit()
        writer.wait_merging_threads()
    index = tantivy.Index.open(str(directory))
    index.reload()
    return index


def tantivy_top(index: Any, asked: list[str], n: int) -> Callable[[int], Any]:
    """tantivy's BM25 top ``n`` of query ``asked[i]``, its default OR query over the body,
    with no ``Count`` collector (``count=False``): counting every match is work the project's
    side does not do. Every benchmark comparing with tantivy asks it through this."""
    searcher = index.searcher()
    return lambda i: searcher.search(index.parse_query(asked[i], ["body"]), n, count=False)


def report(samples: Mapping[str, Samples]) -> tuple[dict[str, Any], str]:
    """The results (wall percentiles per side, and ``cpu_ms_mean``) and their table: wall
    p50 / p95 / p99 per search, CPU per search as a mean over the measured searches."""
    results: dict[str, Any] = {name: summarize(s.wall_ms) for name, s in samples.items()}
    cpu = {name: s.cpu_ms_mean() for name, s in samples.items()}
    tantivy_p95 = results[PEER]["p95"]
    rows = [[name, percentile_cells(results[name]), f"{cpu[name]:.3g}",
             f"{tantivy_p95 / results[name]['p95']:.2f}x"] for name in samples]
    table = markdown_table(["", "p50 / p95 / p99 ms", CPU_COLUMN,
                            "tantivy top-300 p95 / this p95"], rows)
    return {**results, "cpu_ms_mean": cpu}, table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    from retrieval import Retriever, RetrieverConfig

    texts, records = corpus_texts(args.docs)
    root = project_index(args.docs, texts, records, "plain")
    compact_root = project_index(args.docs, texts, records, "compact")
    peer = tantivy_index(args.docs, texts)
    del texts, records
    words = queries(generate(CorpusSpec(n_docs=min(args.docs, 100_000))), args.queries + 100)
    asked = [" ".join(w) for w in words]
    vectors = clustered_unit_vectors(len(asked), 384, seed=7, centers_of=args.docs)
    config = RetrieverConfig(cache={"backend": "none"})
    union = Retriever.load(root, config)
    keyword = Retriever.load(root, config.model_copy(update={"candidate_policy": "keyword"}))
    compact = Retriever.load(compact_root, config)
    bm25, analyzer = union.snapshot.bm25, union.snapshot.analyzer
    compact_bm25 = compact.snapshot.bm25
    runners = {
        "search path, union (default)": lambda i: union.search(asked[i], k=10,
                                                               query_vector=vectors[i]),
        "search path, keyword candidates": lambda i: keyword.search(asked[i], k=10,
                                                                    query_vector=vectors[i]),
        "search path, union, compact postings": lambda i: compact.search(
            asked[i], k=10, query_vector=vectors[i]),
        "BM25 top 300 alone": lambda i: bm25.top_candidates(analyzer(asked[i]), 300),
        "BM25 top 300 alone, compact postings": lambda i: compact_bm25.top_candidates(
            analyzer(asked[i]), 300),
        PEER: tantivy_top(peer, asked, 300),
        "tantivy BM25 top 10": tantivy_top(peer, asked, 10),
    }
    items = list(range(100, len(asked)))
    samples = measure_side_by_side(runners, items, warmup=list(range(100)))
    results, table = report(samples)
    publish_report("keyword-peer", args, results,
                   f"## Search path against tantivy's BM25, {args.docs:,} passages, "
                   f"{len(items)} queries\n\n{table}")


if __name__ == "__main__":
    main()
