"""Sharded search against one index, side by side, and a latency model for many shards.

    python -m benchmarks.shards                         # 1M passages, 2 and 4 shards
    python -m benchmarks.shards --docs 200000 --ray     # smaller, plus the Ray Serve hop

The realistic synthetic corpus (``benchmarks.synthetic_corpus``: Zipfian vocabulary of 200,000
words), random unit vectors (dim 384), query vectors given (no encoder), no cache. One search:
validate -> filter -> BM25 top C -> re-rank -> fuse -> top k -> hydrate (ids only: generated
passages are arrays). Unsharded: ``Retriever``; in-process shards: ``Retriever`` over a
``ShardedBuild`` of shards sliced from the same global index (``indexes.sharding``), so both
return the same hits (checked). Both dense legs are exact: the guardrail rarely fires on these
queries. Beside the wall clock, the calling thread's CPU time of each search: a sharded
search (and a BM25 walk of 50,000 postings or more) runs parts on pool threads, whose CPU it
leaves out. (The process's CPU time would count them, but the kernel adds another running
thread's time at scheduler ticks: per search, it jumps by whole ticks.)

The latency model: per-shard ``answer`` times (each shard alone, measured) are the draws; a
router over S shards waits for the slowest of S draws, then merges (the real merge timed over S
answers made of the measured ones) and pays a hop per search: Ray's, measured with ``--ray``
or given with ``--ray-hop-ms`` (without either, no model is made; the report gives what
in-process sharding adds at p50). Predicted router p95 for S = 2 ... 64 shards of the
measured shard size. ``--ray`` serves a smaller on-disk sharded build on a local Ray cluster
(2 CPUs) and times the router handle against the in-process router on the same shards.
"""

from __future__ import annotations

import argparse
import os
import time
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
from benchmarks.synthetic import random_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, bm25_index, generate, metadata_index
from benchmarks.synthetic_corpus import queries as corpus_queries
from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.ann import ExactDense
from indexes.docstore import DocStore, Document
from indexes.manifest import FORMAT_VERSION, EncoderInfo, Manifest
from indexes.metadata import MetadataIndex
from indexes.sharding import shard_ranges, slice_bm25, slice_metadata
from indexes.vectors import VectorStore
from retrieval import Retriever, RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.sharding import ShardedBuild
from retrieval.sharding.whole import merged_top

DIM = 384
MODEL_SHARDS = (2, 4, 8, 16, 32, 64)  # 2 and 4: checked against the measured routers
ANALYZER = AnalyzerConfig(stemmer=None, stop_words=())  # generated words are already terms


def in_memory_build(name: str, bm25: Any, metadata: MetadataIndex, vectors: np.ndarray,
                    ids: list[str]) -> LoadedBuild:
    """A LoadedBuild of in-memory components (nothing written: 1M passages stay quick)."""
    info = EncoderInfo(encoder_id="bench:random:fp32:384", model="bench", dim=DIM,
                       vector_dtype="float32")
    analyzer = Analyzer(ANALYZER)
    manifest = Manifest(format_version=FORMAT_VERSION, build_id=name, created_at="",
                        n_docs=len(ids), analyzer=ANALYZER.model_dump(mode="json"),
                        analyzer_fingerprint=analyzer.fingerprint, encoder=info,
                        bm25=bm25.params.model_dump(mode="json"),
                        metadata_fields=dict(metadata.kinds), files={})
    store = VectorStore(vectors, "float32")
    docs = DocStore.build([Document(i, "", "") for i in ids])
    return LoadedBuild(Path(name), manifest, analyzer, bm25, metadata, store, docs,
                       ExactDense(store))


@dataclass(frozen=True)
class Shard:
    """One shard of the benchmark: its build and the global row where it starts."""

    snapshot: LoadedBuild
    start: int


class Setup:
    def __init__(self, n_docs: int, n_queries: int, shard_counts: list[int]) -> None:
        began = time.perf_counter()
        corpus = generate(CorpusSpec(n_docs))
        bm25, metadata = bm25_index(corpus), metadata_index(corpus)
        vectors = random_unit_vectors(n_docs, DIM, seed=3)
        ids = [f"doc-{i}" for i in range(n_docs)]
        self.whole = in_memory_build("whole", bm25, metadata, vectors, ids)
        self.shards = {}
        for count in shard_counts:
            self.shards[count] = [
                Shard(in_memory_build(f"shard-{i:03d}", slice_bm25(bm25, a, b),
                                         slice_metadata(metadata, a, b), vectors[a:b], ids[a:b]),
                      a)
                for i, (a, b) in enumerate(shard_ranges(n_docs, count))]
        self.texts = [" ".join(t) for t in corpus_queries(corpus, n_queries, seed=1)]
        self.vectors = random_unit_vectors(n_queries, DIM, seed=4)
        # guardrail: BM25 candidates, the dense leg only when BM25 finds too few. The default
        # union policy would scan every vector here (the shards' dense legs are exact).
        self.config = RetrieverConfig(cache={"backend": "none"}, candidate_policy="guardrail")
        self.setup_s = time.perf_counter() - began

    def sharded(self, count: int) -> Retriever:
        """The one request path over ``count`` in-process shards (``Retriever`` over a
        ``ShardedBuild``), as ``Retriever.load`` opens a sharded build."""
        shards = self.shards[count]
        build = ShardedBuild.of(Path(f"sharded-{count}"), self.whole.manifest,
                                [s.snapshot for s in shards], [s.start for s in shards])
        return Retriever(build, self.config, None)


def cpu_timed(searcher: Any, setup: Setup, sink: list[float]) -> Any:
    """A runner searching query ``i`` that appends the calling thread's CPU time (ms) to
    ``sink``: less sensitive than wall clock to the neighbours' load on a shared machine, but
    blind to the parts a fan-out hands to pool threads."""
    def run(i: int) -> Any:
        began = time.thread_time_ns()
        result = searcher.search(setup.texts[i], None, 10, query_vector=setup.vectors[i])
        sink.append((time.thread_time_ns() - began) / 1e6)
        return result
    return run


def same_hits(got: list[Any], want: list[Any]) -> bool:
    """Same ids in the same order, every score within 1e-6."""
    for a, b in zip(got, want, strict=True):
        if [h.doc_id for h in a.hits] != [h.doc_id for h in b.hits]:
            return False
        scores = [(h.score, h.bm25_score, h.vector_score) for h in a.hits]
        if not np.allclose(scores, [(h.score, h.bm25_score, h.vector_score) for h in b.hits],
                           rtol=0, atol=1e-6):
            return False
    return True


def per_shard_times(setup: Setup, count: int, items: list[int]
                    ) -> tuple[list[float], list[tuple[np.ndarray, np.ndarray]]]:
    """Each shard's work for one search timed alone (ms): BM25 top C and the cosines of its
    candidates, what a shard deployment does for a search; and the last query's BM25
    answers (for merges)."""
    times: list[float] = []
    answers: list[tuple[np.ndarray, np.ndarray]] = []
    candidates = setup.config.candidates
    for i in items:
        tokens = setup.whole.analyzer(setup.texts[i])
        answers = []
        for shard in setup.shards[count]:
            began = time.perf_counter()
            rows, scores = shard.snapshot.bm25.top_candidates(tokens, candidates)
            shard.snapshot.vectors.scores(setup.vectors[i], rows)
            times.append((time.perf_counter() - began) * 1e3)
            answers.append((rows, scores))
    return times, answers


def merge_ms(setup: Setup, answers: list[tuple[np.ndarray, np.ndarray]], count: int,
             repeats: int = 200) -> float:
    """Median time of the real BM25 merge (``merged_top``) over ``count`` answers (the
    measured ones, repeated as if from further shards)."""
    many = [answers[j % len(answers)] for j in range(count)]
    starts = np.arange(count, dtype=np.int64) * setup.whole.manifest.n_docs
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        merged_top(many, starts, setup.config.candidates)
        samples.append((time.perf_counter() - began) * 1e3)
    return float(np.median(samples))


def latency_model(draws: list[float], merges: dict[int, float], hop_ms: float,
                  trials: int = 20_000, seed: int = 0) -> dict[int, dict[str, float]]:
    """Predicted router latency percentiles per shard count: max of S draws + merge + hop."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(draws)
    model = {}
    for count, merge in merges.items():
        slowest = pool[rng.integers(0, pool.size, size=(trials, count))].max(axis=1)
        total = slowest + merge + hop_ms
        model[count] = {"p50": float(np.percentile(total, 50)),
                        "p95": float(np.percentile(total, 95)),
                        "p99": float(np.percentile(total, 99)), "merge_ms": merge}
    return model


def plot_model(model: dict[str, dict[int, dict[str, float]]], measured: dict[str, float],
               path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, series in model.items():
        counts = sorted(series)
        ax.plot(counts, [series[c]["p95"] for c in counts], marker="o", label=f"{label} (model)")
    for label, value in measured.items():
        ax.scatter([int(label.split("=")[1].split(",")[0])], [value], marker="x", s=60,
                   label=f"measured p95, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # the tail past 16 shards dwarfs the rest
    ax.set_xlabel("shards (S)")
    ax.set_ylabel("router p95 (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--shards", default="2,4")
    p.add_argument("--ray", action="store_true", help="also time the Ray Serve hop")
    p.add_argument("--ray-docs", type=int, default=50_000)
    p.add_argument("--ray-hop-ms", type=float, default=None,
                   help="a Ray hop measured before (benchmarks.shards_ray) for the model")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    counts = [int(c) for c in args.shards.split(",")]
    setup = Setup(args.docs, args.queries, counts)
    warm, items = list(range(args.warmup)), list(range(args.warmup, args.queries))
    whole = Retriever(setup.whole, setup.config, None)
    searchers: dict[str, Any] = {"unsharded": whole,
                                 **{f"in-process S={c}": setup.sharded(c) for c in counts}}
    cpu: dict[str, list[float]] = {name: [] for name in searchers}
    runners = {name: cpu_timed(searcher, setup, cpu[name]) for name, searcher in searchers.items()}
    load_before = os.getloadavg()
    samples = measure_side_by_side(runners, items, warm, chunk=50)
    load_after = os.getloadavg()
    equal = {name: same_hits(s.outputs, samples["unsharded"].outputs)
             for name, s in samples.items()}
    largest = max(counts)
    draws, answers = per_shard_times(setup, largest, items)
    e2e = {name: s.summary() for name, s in samples.items()}
    cpu_ms = {name: summarize(times[len(warm):]) for name, times in cpu.items()}
    # What sharding adds in this process: the sharded search's percentiles minus the whole's.
    hop = e2e[f"in-process S={largest}"]["p50"] - e2e["unsharded"]["p50"]
    merges = {c: merge_ms(setup, answers, c) for c in MODEL_SHARDS}
    models: dict[str, dict[int, dict[str, float]]] = {}
    ray_part: dict[str, Any] = {}
    if args.ray:
        from benchmarks.shards_ray import ray_hop

        ray_part = ray_hop(args.ray_docs, len(setup.texts), args.warmup)
        models["Ray Serve"] = latency_model(draws, merges, ray_part["hop_ms_p50"])
    elif args.ray_hop_ms is not None:
        ray_part = {"hop_ms_p50": args.ray_hop_ms, "measured": "before, benchmarks.shards_ray"}
        models["Ray Serve"] = latency_model(draws, merges, args.ray_hop_ms)
    results = {"docs": args.docs, "setup_s": setup.setup_s, "e2e": e2e, "cpu_ms": cpu_ms,
               "load_average": {"before": load_before, "after": load_after}, "equal": equal,
               "shard_answer_ms": summarize(draws), "merge_ms": merges, "hop_ms": hop,
               "model": {k: {str(c): v for c, v in m.items()} for k, m in models.items()},
               "ray": ray_part}
    args.out.mkdir(parents=True, exist_ok=True)
    figure = (plot_model(models, {}, args.out / "shards-model.png") if models else None)
    publish_report("shards", args, results, render(results, largest, figure))


def render(r: dict[str, Any], largest: int, figure: Path | None) -> str:
    load = r["load_average"]
    lines = [f"## Sharded search: {r['docs']:,} passages", "",
             f"setup {r['setup_s']:.0f} s; hits equal to unsharded: {r['equal']}; load average "
             f"{load['before'][0]:.1f} before, {load['after'][0]:.1f} after the timed searches",
             ""]
    cpu = r["cpu_ms"]
    lines.append(markdown_table(
        ["search", "wall p50 / p95 / p99 ms",
         "calling thread's CPU p50 / p95 / p99 ms (pool threads not counted)"],
        [[k, percentile_cells(v), percentile_cells(cpu[k])] for k, v in r["e2e"].items()]))
    shard = r["shard_answer_ms"]
    lines += ["", f"one shard's work for a search (S={largest}): {percentile_cells(shard)} ms; "
              f"in-process sharding adds {r['hop_ms']:.3f} ms at p50", ""]
    rows = [[kind, c, f"{v['merge_ms']:.3f}", f"{v['p50']:.2f}", f"{v['p95']:.2f}"]
            for kind, model in r["model"].items() for c, v in model.items()]
    lines.append(markdown_table(["runtime", "S", "merge ms", "predicted p50", "predicted p95"],
                                rows))
    if r["ray"]:
        lines += ["", f"Ray Serve hop: {r['ray']}"]
    if figure is not None:
        lines += ["", f"![latency model]({figure.name})"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
