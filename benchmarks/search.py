"""Search-path latency with precomputed query vectors: ours against rank-bm25 and bm25s peers.

    python -m benchmarks.search                  # SciFact + synthetic 100k and 1M
    python -m benchmarks.search --quick          # SciFact + synthetic 20k, 300 queries
    python -m benchmarks.search --synthetic 100000 --no-data

The encoder is not measured: query vectors are computed up front and passed as ``query_vector``.
Per dataset, side by side on the same queries, BLAS on one thread, warm-up discarded:

- ours: ``Retriever.search`` k=10, C=300 and the default configuration otherwise (z-score
  fusion, the union policy's dense leg), no filter; and with a filter keeping ~2% of
  documents. Its BM25 spreads a query of 50,000 postings or more over the cores, and the dense
  leg runs beside BM25: not one thread at 100k and 1M;
- peer (a): rank-bm25 ``BM25Okapi.get_scores`` + numpy argpartition top-C + gather/matmul
  re-rank + min-max 0.7 fusion (on fewer queries at scale: it takes seconds per query; ours
  runs again beside it on those queries, and the speed-up is taken from that pair);
- peer (b): bm25s (numba backend, one query per call, n_threads=1) + the same re-rank and fusion.

Both peers index the tokens of the index's own analyzer, so BM25 does the same work everywhere.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    Samples,
    environment,
    fmt_ms,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    plot_cdfs,
    single_thread,
    timestamp,
    verdict,
    write_results,
)
from benchmarks.peers import (
    bm25s_candidates,
    peer,
    rank_bm25_candidates,
    tokenize_corpus,
)
from benchmarks.synthetic import random_unit_vectors, synthetic_vocabulary_documents
from indexes import Analyzer, EncoderInfo, build_index, read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from retrieval import RetrievalError, Retriever, RetrieverConfig
from retrieval.latency import by_stage

DEFAULT_SIZES = (100_000, 1_000_000)
K, CANDIDATES, VECTOR_WEIGHT = 10, 300, 0.7
# department (1/5) x doc_type (1/5) x half of the 30 demo years = 2% of documents.
FILTER = {"department": "cardiology", "doc_type": "review", "year": {"gte": 2010}}
STOP_TERMS = 20  # most frequent synthetic terms, left out of queries as stop words would be
RANDOM_ENCODER = EncoderInfo(encoder_id="random:none:fp32:384", model="random", dim=384,
                             vector_dtype="float32")
OURS, OURS_FILTER, PEER_A, PEER_B = "ours", "ours + 2% filter", "rank-bm25 (a)", "bm25s (b)"
OURS_ON_A = "ours, rank-bm25's queries"  # ours beside rank-bm25, on the prefix it is timed on


@dataclass
class Dataset:
    """One corpus ready to search: our retriever plus what the peers need to index it."""

    name: str
    retriever: Retriever
    texts: list[str]
    doc_ids: np.ndarray
    vectors: np.ndarray  # float32 (n, d), the peers' re-rank matrix
    queries: list[str] = field(default_factory=list)
    query_vectors: np.ndarray = field(default_factory=lambda: np.empty((0, 0), np.float32))
    warmup: list[int] = field(default_factory=list)  # query indices run first and discarded
    measured: list[int] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def n_docs(self) -> int:
        return len(self.texts)

    @property
    def analyzer(self) -> Analyzer:
        return self.retriever.snapshot.analyzer


# -- datasets --------------------------------------------------------------------------------


def beir_dataset(path: Path, work: Path, n_queries: int | None, warmup: int) -> Dataset:
    """A BEIR folder indexed with the real encoder; its queries encoded once, up front."""
    from indexes import SentenceTransformerEncoder

    started = time.perf_counter()
    encoder = SentenceTransformerEncoder()
    docs = list(with_demo_metadata(read_corpus(path)))
    root = work / path.name
    # Rebuilt every run: vectors of unchanged documents are reused by content hash.
    report = build_index(docs, root, encoder=encoder, progress=True)
    retriever = Retriever.load(root, RetrieverConfig(candidates=CANDIDATES), encoder=encoder)
    queries = list(read_queries(path / "queries.jsonl").values())[:n_queries]
    query_vectors = encoder.encode(queries, batch_size=64)
    return Dataset(
        name=path.name, retriever=retriever, texts=[d.content for d in docs],
        doc_ids=np.array([d.id for d in docs], dtype=object),
        vectors=retriever.snapshot.vectors.reconstruct_all(), queries=queries,
        query_vectors=query_vectors, warmup=list(range(min(warmup, len(queries)))),
        measured=list(range(len(queries))),
        notes={"source": str(path.resolve()), "vectors_encoded": report.vectors_encoded,
               "vectors_reused": report.vectors_reused,
               "prepare_seconds": round(time.perf_counter() - started, 1)},
    )


def synthetic_dataset(n: int, work: Path) -> Dataset:
    """``n`` generated documents with random unit vectors; the build is cached per size."""
    started = time.perf_counter()
    docs = list(synthetic_vocabulary_documents(n))
    vectors = random_unit_vectors(n, RANDOM_ENCODER.dim)
    retriever, cached = load_or_build(docs, vectors, work / f"synthetic-{n}")
    return Dataset(
        name=f"synthetic-{n // 1000}k", retriever=retriever, texts=[d.content for d in docs],
        doc_ids=np.array([d.id for d in docs], dtype=object), vectors=vectors,
        notes={"build_cached": cached, "prepare_seconds": round(time.perf_counter() - started, 1)},
    )


def load_or_build(docs: list, vectors: np.ndarray, root: Path) -> tuple[Retriever, bool]:
    """The cached build under ``root`` when it holds these ``n`` documents, else a new one."""
    config = RetrieverConfig(candidates=CANDIDATES)
    if (root / "CURRENT").is_file():
        try:
            retriever = Retriever.load(root, config)
            manifest = retriever.snapshot.manifest
            if manifest.n_docs == len(docs) and manifest.encoder.encoder_id == \
                    RANDOM_ENCODER.encoder_id:
                return retriever, True
            retriever.close()
        except RetrievalError as exc:  # e.g. a format change since the cache was written
            print(f"  cached build at {root} not usable ({exc}); rebuilding")
    started = time.perf_counter()
    report = build_index(docs, root, vectors=vectors, encoder_info=RANDOM_ENCODER, progress=True)
    print(f"  built {report.n_docs} docs in {time.perf_counter() - started:.0f} s "
          f"{report.seconds}")
    return Retriever.load(root, config), False


def synthetic_queries(terms: list[str], ids: list[list[int]], n: int, seed: int = 1
                      ) -> list[str]:
    """``n`` queries of 2-4 distinct terms of one random document, without the stop terms."""
    frequency = np.bincount(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64),
                            minlength=len(terms))
    stop = set(np.argsort(-frequency)[:STOP_TERMS].tolist())
    rng = np.random.default_rng(seed)
    queries: list[str] = []
    while len(queries) < n:
        pool = sorted({t for t in ids[int(rng.integers(len(ids)))] if t not in stop})
        size = int(rng.integers(2, 5))
        if len(pool) >= size:
            queries.append(" ".join(terms[t] for t in rng.choice(pool, size, replace=False)))
    return queries


def add_synthetic_queries(ds: Dataset, terms: list[str], ids: list[list[int]], n: int,
                          warmup: int) -> None:
    ds.queries = synthetic_queries(terms, ids, n + warmup)
    ds.query_vectors = random_unit_vectors(len(ds.queries), RANDOM_ENCODER.dim, seed=2)
    ds.warmup, ds.measured = list(range(warmup)), list(range(warmup, warmup + n))
    ds.notes["stop_terms_skipped"] = STOP_TERMS


# -- the configurations under test -----------------------------------------------------------

Runner = Callable[[int], Any]


def ours(ds: Dataset, filters: dict | None) -> Runner:
    search, queries, vectors = ds.retriever.search, ds.queries, ds.query_vectors

    def run(i: int) -> tuple[dict[str, float], int, list[str]]:
        result = search(queries[i], filters=filters, k=K, candidates=CANDIDATES,
                        query_vector=vectors[i])
        return result.timings, result.allowed, [h.doc_id for h in result.hits]

    return run


# -- one dataset -----------------------------------------------------------------------------


def rank_bm25_budget(n_docs: int, n_queries: int, override: int | None) -> int:
    """rank-bm25 costs ~170 ms per query at 100k documents and over 1 s at 1M."""
    if override is not None:
        return min(override, n_queries)
    return n_queries if n_docs <= 50_000 else 200 if n_docs <= 200_000 else 30


def run_dataset(ds: Dataset, args: argparse.Namespace, terms: list[str],
                ids: list[list[int]]) -> dict[str, Samples]:
    started = time.perf_counter()
    fast = {OURS: ours(ds, None), OURS_FILTER: ours(ds, FILTER),
            PEER_B: peer(ds, bm25s_candidates(terms, ids))}
    tokens = [[terms[t] for t in row] for row in ids]
    slow = peer(ds, rank_bm25_candidates(tokens))
    del tokens
    n_slow = rank_bm25_budget(ds.n_docs, len(ds.measured), args.rank_bm25_queries)
    ds.notes["peer_index_seconds"] = round(time.perf_counter() - started, 1)
    print(f"  peers indexed in {ds.notes['peer_index_seconds']} s; measuring "
          f"{len(ds.measured)} queries (rank-bm25: {n_slow})")
    with single_thread():
        samples = measure_side_by_side(fast, ds.measured, ds.warmup, chunk=args.chunk)
        slow_warmup = ds.warmup[:max(2, min(len(ds.warmup), n_slow // 10))]
        # Ours again, in turns with rank-bm25 on its prefix, query by query (its 30 queries
        # at 1M are one default chunk): a ratio of percentiles over the same queries,
        # measured at the same time.
        samples.update(measure_side_by_side({PEER_A: slow, OURS_ON_A: fast[OURS]},
                                            ds.measured[:n_slow], slow_warmup, chunk=1))
    return samples


def stage_summaries(samples: Samples) -> dict[str, dict[str, float]]:
    return by_stage(output[0] for output in samples.outputs)


def overlap(a: Samples, b: Samples, ids_at: int) -> float:
    """Mean share of b's top-k ids also in a's, over the queries both ran."""
    pairs = zip(a.outputs, b.outputs, strict=False)
    shares = [len(set(x[ids_at]) & set(y[-1])) / max(len(y[-1]), 1) for x, y in pairs]
    return float(np.mean(shares)) if shares else 0.0


def summarize_dataset(ds: Dataset, samples: dict[str, Samples]) -> dict[str, Any]:
    allowed = samples[OURS_FILTER].outputs[0][1]
    short = sum(len(o[2]) < K for o in samples[OURS_FILTER].outputs)
    configs = {name: {"queries": len(s.wall_ms), "e2e": s.summary(),
                      "stages": stage_summaries(s)} for name, s in samples.items()}
    config = ds.retriever.config
    return {
        "name": ds.name, "n_docs": ds.n_docs, "notes": ds.notes,
        "ours_config": f"{config.fusion} fusion {config.vector_weight}, "
                       f"{config.candidate_policy} candidates",
        "allowed_fraction": allowed / ds.n_docs, "filtered_short_results": short,
        "top10_agreement": {PEER_A: overlap(samples[OURS_ON_A], samples[PEER_A], 2),
                            PEER_B: overlap(samples[OURS], samples[PEER_B], 2)},
        "configs": configs, "checks": checks(ds.n_docs, configs),
    }


def checks(n_docs: int, configs: dict[str, Any]) -> list[dict[str, Any]]:
    """Targets: p95 budgets for ours, x100 over rank-bm25 at 100k+, BM25 stage vs bm25s."""
    budget = 1.0 if n_docs <= 100_000 else 3.0 if n_docs <= 1_000_000 else None
    rows = []
    for name in (OURS, OURS_FILTER):
        p95 = configs[name]["e2e"]["p95"]
        if budget is not None:
            rows.append({"check": f"{name} e2e p95 <= {budget:g} ms", "value": p95,
                         "text": f"{fmt_ms(p95)} ms", "ok": p95 <= budget})
    ours_e2e, a_e2e = configs[OURS_ON_A]["e2e"], configs[PEER_A]["e2e"]
    speedup = {q: a_e2e[q] / ours_e2e[q] for q in ("p50", "p95")}
    rows.append({"check": "speed-up vs rank-bm25 (a) >= 100x" if n_docs >= 100_000
                 else "speed-up vs rank-bm25 (a)", "value": speedup,
                 "text": f"p50 {speedup['p50']:.0f}x, p95 {speedup['p95']:.0f}x",
                 "ok": min(speedup.values()) >= 100 if n_docs >= 100_000 else None})
    ours_bm25, b_bm25 = configs[OURS]["stages"]["bm25"], configs[PEER_B]["stages"]["bm25"]
    ratio = {q: b_bm25[q] / ours_bm25[q] for q in ("p50", "p95")}
    rows.append({"check": "BM25 stage no slower than bm25s (ratio bm25s/ours >= 1)",
                 "value": ratio, "text": f"p50 {ratio['p50']:.2f}x, p95 {ratio['p95']:.2f}x",
                 "ok": min(ratio.values()) >= 1.0})
    return rows


# -- report ----------------------------------------------------------------------------------

STAGE_ORDER = ("validate", "filter", "bm25", "embed_wait", "dense", "rerank", "fuse", "hydrate",
               "total")


def e2e_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        for name, c in r["configs"].items():
            e, st = c["e2e"], c["stages"]
            rows.append([r["name"], f"{name} ({c['queries']} q)", fmt_ms(e["p50"]),
                         fmt_ms(e["p95"]), fmt_ms(e["p99"]), fmt_ms(e["max"]),
                         percentile_cells(st["bm25"]), percentile_cells(st["rerank"])])
    return markdown_table(["dataset", "config", "e2e p50", "e2e p95", "e2e p99", "e2e max",
                           "bm25 p50 / p95 / p99", "rerank p50 / p95 / p99"], rows)


def stage_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        for name in (OURS, OURS_FILTER):
            st = r["configs"][name]["stages"]
            rows.append([r["name"], name] + [percentile_cells(st[s]) if s in st else "—"
                                             for s in STAGE_ORDER])
    return markdown_table(["dataset", "config", *STAGE_ORDER], rows)


def check_table(results: list[dict[str, Any]]) -> str:
    rows = [[r["name"], c["check"], c["text"], "—" if c["ok"] is None else verdict(c["ok"])]
            for r in results for c in r["checks"]]
    return markdown_table(["dataset", "target", "measured", "verdict"], rows)


def dataset_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        agree = ", ".join(f"{k} {v:.2f}" for k, v in r["top10_agreement"].items())
        lines.append(f"- {r['name']}: {r['n_docs']:,} docs; filter keeps "
                     f"{r['allowed_fraction']:.2%} ({r['filtered_short_results']} filtered queries "
                     f"returned < {K} hits); top-10 agreement with ours: {agree}; {r['notes']}")
    return lines


def ours_config(results: list[dict[str, Any]]) -> str:
    """The fusion and candidate policy ours ran with, as its retrievers were configured."""
    return next((r["ours_config"] for r in results if "ours_config" in r), "defaults")


def render(results: list[dict[str, Any]], env: dict[str, Any], args: argparse.Namespace,
           seconds: float) -> str:
    header = [
        f"# Search latency ({timestamp()}, git {env['git_sha']}, "
        f"sources {env['source_digest']})", "",
        f"k={K}, C={CANDIDATES}; ours: {ours_config(results)}; peers: min-max fusion "
        f"{VECTOR_WEIGHT} on the cosine; precomputed query vectors (encoder not measured); BLAS "
        f"on one thread (ours: BM25 spreads a query of 50,000 postings or more over the cores, "
        f"the dense leg runs beside it); {args.warmup} warm-up queries discarded; "
        f"configurations interleaved in chunks of {args.chunk} queries. Times in ms. "
        f"Synthetic queries: 2-4 terms of a random document, skipping the {STOP_TERMS} most "
        "frequent terms (stop words). Filter: " + str(FILTER) + ". Ours hydrates full hits "
        "(text + metadata, pydantic); peers return ids only.", "",
        f"Machine: {env['cpu_count']} CPUs, load average at start {env['load_average']}, "
        f"{env['platform']}; total run {seconds / 60:.1f} min.", "",
    ]
    return "\n".join([
        *header, "## End to end", "", e2e_table(results), "",
        "## Ours per stage (p50 / p95 / p99)", "", stage_table(results), "",
        "## Targets", "", check_table(results), "", "## Datasets", "",
        *dataset_lines(results),
    ])


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.is_dir() else None,
                   help="BEIR folder (default ../shared/data/scifact when present)")
    p.add_argument("--no-data", action="store_true", help="skip the BEIR dataset")
    p.add_argument("--synthetic", type=int, nargs="*", default=list(DEFAULT_SIZES),
                   metavar="N", help="synthetic corpus sizes; give none to skip")
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench",
                   help="where indexes are built and cached")
    p.add_argument("--queries", type=int, default=None,
                   help="measured queries (default: all BEIR queries, 1000 synthetic)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rank-bm25-queries", type=int, default=None,
                   help="queries for rank-bm25 (default: all <=50k docs, 200 <=200k, else 30)")
    p.add_argument("--chunk", type=int, default=100, help="queries per interleaving turn")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: BEIR data + synthetic 20000, 300 queries")
    args = p.parse_args(argv)
    if args.quick:
        args.synthetic, args.queries, args.warmup = [20_000], args.queries or 300, 20
    if args.no_synthetic:
        args.synthetic = []
    if args.no_data:
        args.data = None
    return args


def prepare(args: argparse.Namespace) -> list[Callable[[], Dataset]]:
    """Lazy dataset loaders, so only one corpus and its peer indexes are in memory at a time."""
    loaders: list[Callable[[], Dataset]] = []
    if args.data is not None:
        loaders.append(lambda: beir_dataset(args.data, args.work, args.queries, args.warmup))
    for n in args.synthetic:
        loaders.append(functools.partial(synthetic_dataset, n, args.work))
    return loaders


def bench_one(load: Callable[[], Dataset], args: argparse.Namespace
              ) -> tuple[dict[str, Any], dict[str, list[float]]]:
    ds = load()
    print(f"{ds.name}: {ds.n_docs:,} docs ready ({ds.notes})")
    terms, ids = tokenize_corpus(ds.analyzer, ds.texts)
    if not ds.queries:
        add_synthetic_queries(ds, terms, ids, args.queries or 1000, args.warmup)
    samples = run_dataset(ds, args, terms, ids)
    result = summarize_dataset(ds, samples)
    ds.retriever.close()
    print(e2e_table([result]) + "\n")
    return result, {name: s.wall_ms for name, s in samples.items()}


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    started = time.perf_counter()
    env = environment()
    results, panels = [], {}
    for load in prepare(args):
        result, walls = bench_one(load, args)
        results.append(result)
        panels[result["name"]] = walls
    if not results:
        raise SystemExit("nothing to measure: give --data or --synthetic sizes")
    seconds = time.perf_counter() - started
    markdown = render(results, env, args, seconds)
    payload = {"benchmark": "search", "seconds": round(seconds, 1), "environment": env,
               "config": {**{k: str(v) if isinstance(v, Path) else v
                             for k, v in vars(args).items()},
                          "k": K, "candidates": CANDIDATES, "vector_weight": VECTOR_WEIGHT,
                          "filter": FILTER, "stop_terms": STOP_TERMS},
               "datasets": results}
    json_path, md_path = write_results("search", payload, markdown, args.out)
    png = plot_cdfs(panels, json_path.with_suffix(".png"))
    print(markdown)
    print(f"\nwrote {json_path}, {md_path}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
