"""The streamed sharded build at up to 10M passages on a local Ray cluster, then its search
path, routed over every shard and on one shard alone.

    python -m benchmarks.streamed_shards --docs 10000000 --shards 8

Each shard's rows come from the realistic synthetic corpus (``benchmarks.synthetic_corpus``:
Zipfian vocabulary, 60-140 words a passage, metadata) generated for that shard alone (its own
seed; ids and article ids global), with clustered vectors around centres shared by every
shard (so the dense leg trains and calibrates IVF as on real embeddings). Nothing holds the
whole collection: each Ray task generates its shard, the survey and the write read it once
each (``indexes.shard_build``), and a fresh worker process per task reports its own peak
memory. The search path is ``Retriever.load`` over the sharded build (the shards searched in
threads, merged) and over shard 0 alone, with the default union policy and with keyword
candidates, and with ``--tantivy`` tantivy's BM25 top 300 over the same passages (fed shard
by shard), in one rotation (``measure_side_by_side``); query vectors drawn around the same
centres, given; no cache.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    summarize,
)
from benchmarks.synthetic import clustered_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, article_id, generate, queries
from indexes.sharding import shard_ranges

WORK = Path("build/streamed-shards")
DIM = 384


@dataclass(frozen=True)
class SyntheticShard:
    """Rows [start, stop) of an ``n_docs`` collection, generated on demand (a shard source)."""

    n_docs: int
    start: int
    stop: int
    shard: int

    def __call__(self) -> tuple[list[Any], np.ndarray]:
        from indexes.docstore import Document

        corpus = generate(CorpusSpec(n_docs=self.stop - self.start, seed=1 + self.shard))
        vocab = np.array(corpus.vocab)
        documents = []
        for i in range(corpus.n_docs):
            row = self.start + i
            text = " ".join(vocab[corpus.words[corpus.offsets[i]:corpus.offsets[i + 1]]])
            record = {**corpus.record(i), "article": article_id(row // 5)}
            documents.append(Document(f"p{row}", text, "", record))
        vectors = clustered_unit_vectors(corpus.n_docs, DIM, seed=1000 + self.shard,
                                         centers_of=self.n_docs)
        return documents, vectors


def build(n_docs: int, shards: int, root: Path, cpus_per_task: float) -> dict[str, Any]:
    import ray

    from indexes.build import BuildConfig
    from indexes.manifest import EncoderInfo
    from indexes.ray_build import ray_runner
    from indexes.shard_build import build_streamed
    sources = [SyntheticShard(n_docs, a, b, i)
               for i, (a, b) in enumerate(shard_ranges(n_docs, shards))]
    info = EncoderInfo(encoder_id="given", model="given", dim=DIM, vector_dtype="float32")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        began = time.perf_counter()
        report = build_streamed(sources, root, encoder_info=info,
                                run=ray_runner(cpus_per_task),
                                config=BuildConfig(vector_dtype="int8",
                                                   analysis_workers=int(cpus_per_task)))
        seconds = time.perf_counter() - began
    finally:
        ray.shutdown()
    return {"seconds": seconds, "stages": report.seconds, "size_bytes": report.size_bytes,
            "driver_peak_rss_bytes": report.peak_rss_bytes,
            "shard_seconds": report.part_seconds,
            "shard_peak_rss_bytes": report.part_peak_rss_bytes}


def build_tantivy(sources: list[SyntheticShard], directory: Path) -> dict[str, Any]:
    """tantivy 0.27 (``en_stem``, two writer threads) fed the same shards' texts one shard at
    a time; the seconds count adding, committing and merging, not generating."""
    import tantivy

    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", tokenizer_name="en_stem")
    directory.mkdir(parents=True)
    index = tantivy.Index(schema.build(), path=str(directory))
    writer = index.writer(heap_size=512_000_000, num_threads=2)
    seconds = 0.0
    for source in sources:
        documents, _ = source()
        began = time.perf_counter()
        for d in documents:
            writer.add_document(tantivy.Document(id=d.id, body=d.text))
        seconds += time.perf_counter() - began
        del documents
    began = time.perf_counter()
    writer.commit()
    writer.wait_merging_threads()
    seconds += time.perf_counter() - began
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return {"seconds": seconds, "size_bytes": size}


def search(root: Path, n_docs: int, n_queries: int, peer: Path | None) -> dict[str, Any]:
    from retrieval import Retriever, RetrieverConfig

    words = queries(generate(CorpusSpec(n_docs=100_000)), n_queries + 100)
    asked = [" ".join(w) for w in words]
    vectors = clustered_unit_vectors(len(asked), DIM, seed=7, centers_of=n_docs)
    config = RetrieverConfig(cache={"backend": "none"})
    keyword = config.model_copy(update={"candidate_policy": "keyword"})
    live = Retriever.load(root, config).snapshot.path
    opened = {"routed, union (default)": Retriever.load(root, config),
              "routed, keyword candidates": Retriever.load(root, keyword),
              "shard 0 alone, union": Retriever.load(live / "shards" / "shard-000", config),
              "shard 0 alone, keyword candidates": Retriever.load(live / "shards" / "shard-000",
                                                                  keyword)}
    def searching(retriever: Any) -> Callable[[int], Any]:
        return lambda i: retriever.search(asked[i], k=10, query_vector=vectors[i])

    runners = {name: searching(r) for name, r in opened.items()}
    if peer is not None:
        import tantivy

        index = tantivy.Index.open(str(peer))
        index.reload()
        searcher = index.searcher()
        runners["tantivy BM25 top 300"] = lambda i: searcher.search(
            index.parse_query(asked[i], ["body"]), 300)
    items = list(range(100, len(asked)))
    samples = measure_side_by_side(runners, items, warmup=list(range(100)))
    return {name: summarize(s.wall_ms) for name, s in samples.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=10_000_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--cpus-per-task", type=float, default=1.0,
                   help="2 on a 2-core machine: one shard at a time (for shards whose build "
                   "needs more than half the memory)")
    p.add_argument("--tantivy", action="store_true", help="also build tantivy from the same "
                   "shards and search it beside")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    root = WORK / f"{args.docs}-{args.shards}"
    built = build(args.docs, args.shards, root, args.cpus_per_task)
    print(f"built in {built['seconds']:.0f} s", flush=True)
    peer = None
    if args.tantivy:
        peer = WORK / f"tantivy-{args.docs}"
        built["tantivy"] = build_tantivy(
            [SyntheticShard(args.docs, a, b, i)
             for i, (a, b) in enumerate(shard_ranges(args.docs, args.shards))], peer)
        print(f"tantivy built in {built['tantivy']['seconds']:.0f} s", flush=True)
    searched = search(root, args.docs, args.queries, peer)
    rss = built["shard_peak_rss_bytes"]
    build_table = markdown_table(
        ["passages", "shards", "build s", "docs/s", "stages s", "index GiB",
         "peak RSS per shard task GiB (max)", "driver peak RSS GiB"],
        [[f"{args.docs:,}", str(args.shards), f"{built['seconds']:.0f}",
          f"{args.docs / built['seconds']:,.0f}",
          ", ".join(f"{k} {v:.0f}" for k, v in built["stages"].items()),
          f"{built['size_bytes'] / 2**30:.1f}", f"{max(rss) / 2**30:.1f}",
          f"{built['driver_peak_rss_bytes'] / 2**30:.1f}"]]
        + ([[f"{args.docs:,}", "tantivy, 2 threads", f"{built['tantivy']['seconds']:.0f}",
             f"{args.docs / built['tantivy']['seconds']:,.0f}", "",
             f"{built['tantivy']['size_bytes'] / 2**30:.1f}", "", ""]]
           if args.tantivy else []))
    search_table = markdown_table(["path", "p50 / p95 / p99 ms"],
                                  [[name, percentile_cells(s)] for name, s in searched.items()])
    publish_report("streamed-shards", args, {"build": built, "search": searched},
                   "## The streamed sharded build on Ray\n\n" + build_table
                   + "\n\n## Search, query vectors given\n\n" + search_table)


if __name__ == "__main__":
    main()
