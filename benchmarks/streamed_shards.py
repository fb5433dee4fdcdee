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
centres, given; no cache. Both builds' seconds include generating the synthetic passages, as
each side reads its input: the project's tasks generate each shard (texts, metadata, vectors)
twice, to survey it and to write it; tantivy generates each shard's texts once.
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
from benchmarks.synthetic_corpus import (
    CorpusSpec,
    SyntheticCorpus,
    article_id,
    generate,
    queries,
)
from indexes.sharding import shard_ranges

WORK = Path("build/streamed-shards")
DIM = 384
# The vectors' centres are a 1M corpus's (1,000 topics) at every size. With sqrt(N) centres a
# 10M collection's 1.25M-row shard held ~400 vectors a centre, split over its 4,472 IVF lists:
# recall@100 reached 0.94 at nprobe 512 and every shard's calibration fell back to exact search.
TOPICS_OF = 1_000_000


@dataclass(frozen=True)
class SyntheticShard:
    """Rows [start, stop) of an ``n_docs`` collection, generated on demand (a shard source)."""

    n_docs: int
    start: int
    stop: int
    shard: int

    def __call__(self) -> tuple[list[Any], np.ndarray]:
        from indexes.docstore import Document

        corpus = self.corpus()
        documents = [Document(f"p{self.start + i}", text, "", self.record(corpus, i))
                     for i, text in enumerate(texts_of(corpus))]
        vectors = clustered_unit_vectors(corpus.n_docs, DIM, seed=1000 + self.shard,
                                         centers_of=TOPICS_OF)
        return documents, vectors

    def corpus(self) -> SyntheticCorpus:
        return generate(CorpusSpec(n_docs=self.stop - self.start, seed=1 + self.shard))

    def record(self, corpus: SyntheticCorpus, i: int) -> dict[str, Any]:
        return {**corpus.record(i), "article": article_id((self.start + i) // 5)}

    def passages(self) -> list[tuple[str, str]]:
        """(id, text) of each row: what a keyword-only engine indexes of the shard, generated
        as ``__call__`` generates it (the same texts), without the metadata and vectors."""
        return [(f"p{self.start + i}", text) for i, text in enumerate(texts_of(self.corpus()))]


def texts_of(corpus: SyntheticCorpus, block: int = 10_000) -> list[str]:
    """Each passage's words joined by spaces: a block of passages joined at once, then cut
    at the passages' character offsets (a join per passage is several times slower)."""
    vocab = corpus.vocab
    sizes = np.fromiter(map(len, vocab), dtype=np.int64, count=len(vocab))
    texts: list[str] = []
    for first in range(0, corpus.n_docs, block):
        ends = corpus.offsets[first:min(first + block, corpus.n_docs) + 1]
        words = corpus.words[ends[0]:ends[-1]]
        joined = " ".join(map(vocab.__getitem__, words.tolist()))
        # A passage's characters: its words' and a space after each; the last has none.
        chars = np.concatenate([[0], np.cumsum(sizes[words] + 1)])
        starts, stops = chars[ends[:-1] - ends[0]], chars[ends[1:] - ends[0]] - 1
        texts += [joined[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    return texts


def build(n_docs: int, shards: int, root: Path, cpus_per_write: float,
          cpus_per_survey: float = 1.0) -> dict[str, Any]:
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
                                run=ray_runner(cpus_per_survey),
                                run_writes=ray_runner(cpus_per_write),
                                config=BuildConfig(vector_dtype="int8",
                                                   analysis_workers=int(cpus_per_write)))
        seconds = time.perf_counter() - began
    finally:
        ray.shutdown()
    return {"seconds": seconds, "stages": report.seconds, "size_bytes": report.size_bytes,
            "driver_peak_rss_bytes": report.peak_rss_bytes,
            "shard_seconds": report.part_seconds,
            "shard_peak_rss_bytes": report.part_peak_rss_bytes}


def build_tantivy(sources: list[SyntheticShard], directory: Path) -> dict[str, Any]:
    """tantivy 0.27 (``en_stem``, two writer threads) fed the same shards' texts one shard at
    a time. As the project's build generates each shard inside its timed tasks, the seconds
    count generating each shard's texts (once: one pass is all tantivy needs), adding,
    committing and merging; ``generate_seconds`` is the generating's share."""
    import tantivy

    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", tokenizer_name="en_stem")
    directory.mkdir(parents=True)
    index = tantivy.Index(schema.build(), path=str(directory))
    writer = index.writer(heap_size=512_000_000, num_threads=2)
    generating = 0.0
    began = time.perf_counter()
    for source in sources:
        started = time.perf_counter()
        passages = source.passages()
        generating += time.perf_counter() - started
        for doc_id, text in passages:
            writer.add_document(tantivy.Document(id=doc_id, body=text))
        del passages
    writer.commit()
    writer.wait_merging_threads()
    seconds = time.perf_counter() - began
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return {"seconds": seconds, "generate_seconds": generating, "size_bytes": size}


GENERATED = ("Both builds' seconds include generating the synthetic passages: the project "
             "generates each shard (texts, metadata, vectors) twice, to survey it and to write "
             "it; tantivy each shard's texts once.")


def tantivy_row(n_docs: int, built: dict[str, Any]) -> list[str]:
    """tantivy's row of the build table: its seconds include generating the texts."""
    return [f"{n_docs:,}", "tantivy, 2 threads", f"{built['seconds']:.0f}",
            f"{n_docs / built['seconds']:,.0f}",
            f"generating the texts {built['generate_seconds']:.0f}",
            f"{built['size_bytes'] / 2**30:.1f}", "", ""]


def search(root: Path, n_docs: int, n_queries: int, peer: Path | None,
           policies: list[str]) -> dict[str, Any]:
    from retrieval import Retriever, RetrieverConfig

    words = queries(generate(CorpusSpec(n_docs=100_000)), n_queries + 100)
    asked = [" ".join(w) for w in words]
    vectors = clustered_unit_vectors(len(asked), DIM, seed=7, centers_of=TOPICS_OF)
    config = RetrieverConfig(cache={"backend": "none"})
    named = {"union": ("union (default)", config),
             "keyword": ("keyword candidates",
                         config.model_copy(update={"candidate_policy": "keyword"}))}
    live = Retriever.load(root, config).snapshot.path
    opened = {}
    for policy in policies:
        name, settings = named[policy]
        opened[f"routed, {name}"] = Retriever.load(root, settings)
        opened[f"shard 0 alone, {name}"] = Retriever.load(live / "shards" / "shard-000",
                                                          settings)
    def searching(retriever: Any) -> Callable[[int], Any]:
        return lambda i: retriever.search(asked[i], k=10, query_vector=vectors[i])

    runners = {name: searching(r) for name, r in opened.items()}
    if peer is not None:
        import tantivy

        from benchmarks.keyword_peer import tantivy_top

        index = tantivy.Index.open(str(peer))
        index.reload()
        runners["tantivy BM25 top 300"] = tantivy_top(index, asked, 300)
    items = list(range(100, len(asked)))
    samples = measure_side_by_side(runners, items, warmup=list(range(100)))
    out = {name: summarize(s.wall_ms) for name, s in samples.items()}
    for policy in policies:
        name = named[policy][0]
        out.update(model_check(opened[f"routed, {name}"], asked, vectors, items, policy, name))
    return out


def model_check(routed: Any, asked: list[str], vectors: np.ndarray, items: list[int],
                policy: str, name: str) -> dict[str, Any]:
    """Each shard's answer to each query, timed (BM25 top C, with ``union`` the dense leg's
    top C', and the re-rank scores of those rows: what a router asks of a shard), and what
    the sharding latency model (``benchmarks.shards``: a router waits for its slowest shard,
    each shard on cores of its own) predicts from them, beside the bound for this host, whose
    2 cores take the shards' answers in turn (their sum over 2). The merge and the hop are
    left out of both (a fraction of a millisecond at C = 300, ``benchmarks.shards``)."""
    shards = routed.snapshot.local_builds()
    config = routed.config
    answers = np.empty((len(items), len(shards)))
    for q, i in enumerate(items):
        for s, shard in enumerate(shards):
            began = time.perf_counter()
            rows, _ = shard.bm25.top_candidates(shard.analyzer(asked[i]), config.candidates)
            if policy == "union":
                dense_rows, _ = shard.dense.search(vectors[i], config.dense_candidates)
                rows = np.union1d(rows, dense_rows)
            shard.vectors.scores(vectors[i], rows)
            answers[q, s] = (time.perf_counter() - began) * 1e3
    return {f"model, {name}: slowest of {len(shards)} shards' answers": summarize(
                answers.max(axis=1).tolist()),
            f"bound on 2 cores, {name}: sum of the shards' answers / 2": summarize(
                (answers.sum(axis=1) / 2).tolist()),
            f"one shard's answer, {name}": summarize(answers.ravel().tolist())}


def served(root: Path, n_queries: int) -> dict[str, Any]:
    """The routed search in this process and through Ray Serve (``benchmarks.shards_ray``:
    one replica per shard, each in its own process, the build's pages shared)."""
    from benchmarks.shards_ray import hop_over

    words = queries(generate(CorpusSpec(n_docs=100_000)), n_queries + 100, seed=2)
    vectors = clustered_unit_vectors(len(words), DIM, seed=8, centers_of=TOPICS_OF)
    return hop_over(root, [" ".join(w) for w in words], vectors, warmup=100)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=10_000_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--cpus-per-write", type=float, default=1.0,
                   help="CPUs of each shard's write task (surveys take one each): 2 on a "
                   "2-core machine writes one shard at a time, for shards whose write needs "
                   "more than half the memory")
    p.add_argument("--cpus-per-survey", type=float, default=1.0,
                   help="CPUs of each shard's survey task: 1 runs two at a time on 2 cores, "
                   "2 one at a time")
    p.add_argument("--tantivy", action="store_true", help="also build tantivy from the same "
                   "shards and search it beside")
    p.add_argument("--policies", nargs="+", choices=("union", "keyword"),
                   default=["union", "keyword"])
    p.add_argument("--search-only", action="store_true", help="search the build (and the "
                   "tantivy index) an earlier run made")
    p.add_argument("--serve", action="store_true", help="only search the build made by an "
                   "earlier run, routed in-process and on Ray Serve")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    root = WORK / f"{args.docs}-{args.shards}"
    if args.serve:
        result = served(root, args.queries)
        rows = [[name, percentile_cells(s)] for name, s in result["e2e"].items()]
        publish_report("streamed-shards-serve", args, result,
                       f"## {args.docs:,} passages in {args.shards} shards, routed\n\n"
                       + markdown_table(["search", "p50 / p95 / p99 ms"], rows)
                       + f"\n\nsame hits: {result['equal']}")
        return
    peer = WORK / f"tantivy-{args.docs}" if args.tantivy else None
    if args.search_only:
        searched = search(root, args.docs, args.queries, peer, args.policies)
        publish_report("streamed-shards-search", args, searched,
                       f"## Search, {args.docs:,} passages in {args.shards} shards\n\n"
                       + markdown_table(["path", "p50 / p95 / p99 ms"],
                                        [[n, percentile_cells(s)] for n, s in searched.items()]))
        return
    built = build(args.docs, args.shards, root, args.cpus_per_write, args.cpus_per_survey)
    print(f"built in {built['seconds']:.0f} s", flush=True)
    if peer is not None and not peer.is_dir():  # else the same passages' index, reused
        built["tantivy"] = build_tantivy(
            [SyntheticShard(args.docs, a, b, i)
             for i, (a, b) in enumerate(shard_ranges(args.docs, args.shards))], peer)
        print(f"tantivy built in {built['tantivy']['seconds']:.0f} s", flush=True)
    searched = search(root, args.docs, args.queries, peer, args.policies)
    rss = built["shard_peak_rss_bytes"]
    build_table = markdown_table(
        ["passages", "shards", "build s", "docs/s", "stages s", "index GiB",
         "peak RSS per shard task GiB (max)", "driver peak RSS GiB"],
        [[f"{args.docs:,}", str(args.shards), f"{built['seconds']:.0f}",
          f"{args.docs / built['seconds']:,.0f}",
          ", ".join(f"{k} {v:.0f}" for k, v in built["stages"].items()),
          f"{built['size_bytes'] / 2**30:.1f}", f"{max(rss) / 2**30:.1f}",
          f"{built['driver_peak_rss_bytes'] / 2**30:.1f}"]]
        + ([tantivy_row(args.docs, built["tantivy"])] if "tantivy" in built else []))
    search_table = markdown_table(["path", "p50 / p95 / p99 ms"],
                                  [[name, percentile_cells(s)] for name, s in searched.items()])
    publish_report("streamed-shards", args, {"build": built, "search": searched},
                   "## The streamed sharded build on Ray\n\n" + build_table + f"\n\n{GENERATED}"
                   + "\n\n## Search, query vectors given\n\n" + search_table)


if __name__ == "__main__":
    main()
