"""Filters at access-control scale on the realistic synthetic corpus, side by side in one run.

    python -m benchmarks.filters                    # 1M passages, 1000 queries per case
    python -m benchmarks.filters --docs 200000 --queries 300    # a quick run
    python -m benchmarks.filters --validate-mask-only           # the validate + mask tables

The search path with the query vector given (no encoder): validate (the per-build filter memo)
-> filter mask (the per-build mask cache, or a named filter's bound mask) -> BM25 top C inside
the mask (filter-aware intersection or MaxScore pruning, chosen per query) -> exact re-rank of
the C candidates -> fusion -> top k. Document hydration (the doc store) is left out: the
generated passages are arrays, not stored text. Cases: no filter, ~1% and ~14% filters, IN
over article ids with 10 / 1,000 / 10,000 / 100,000 values (at most the corpus's articles, one
per 5 passages: each IN case is named by the values it holds), a named filter (the IN 10,000
list registered as ``user-42``, referred to as ``{"$named": "user-42"}``), and no filter / the 1%
filter through the exhaustive BM25 kernel (what pruning and the filter-aware kernel replace).
Filters repeat across queries, as a user's access list does. A separate table times validate
+ mask for 10,000 IN values: a first sight (fresh memo and mask cache), a repeat decoded from
fresh JSON, a repeat of the same object, and the named reference, with the garbage collections
that ran inside the timed calls (``--validate-mask-only``: these tables alone, for 10,000 and
100,000 values, without the BM25 index and the vectors). Vectors are int8 by default.
The corpus's BM25 index is cached under build/ (its build sorts every posting).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    memory_mb,
    percentile_cells,
    publish_report,
    single_thread,
    summarize,
)
from benchmarks.synthetic import random_unit_vectors
from benchmarks.synthetic_corpus import (
    CorpusSpec,
    SyntheticCorpus,
    article_id,
    bm25_index,
    generate,
    metadata_index,
)
from benchmarks.synthetic_corpus import queries as corpus_queries
from indexes.bm25 import BM25Index
from indexes.bm25_strategy import Kernel
from indexes.metadata import MetadataIndex
from indexes.vectors import VectorStore
from retrieval.config import RetrieverConfig
from retrieval.filters import evaluate_counted
from retrieval.filters.named import BoundFilters, NamedFilters, combined_mask
from retrieval.request_path.fusion import top_k_order
from retrieval.request_path.pipeline import fuse
from retrieval.request_path.validate import FilterMemo, SearchRequest, validate

DIM = 384
NAMED = "user-42"
BUILD_DIR = Path(__file__).resolve().parents[1] / "build"
IN_SIZES = (10, 1_000, 10_000, 100_000)
NAMED_SIZE = 10_000  # the IN case registered as the named filter and timed for validate + mask


class Setup:
    """The corpus's indexes, vectors and queries."""

    def __init__(self, n_docs: int, n_queries: int, vector_dtype: str) -> None:
        began = time.perf_counter()
        self.corpus = generate(CorpusSpec(n_docs))
        self.bm25: BM25Index = cached_bm25(self.corpus)
        self.metadata: MetadataIndex = metadata_index(self.corpus)
        self.vectors = VectorStore.build(random_unit_vectors(n_docs, DIM, seed=3),
                                         vector_dtype)  # type: ignore[arg-type]
        self.tokens = corpus_queries(self.corpus, n_queries, seed=1)
        self.texts = [" ".join(t) for t in self.tokens]
        self.query_vectors = random_unit_vectors(n_queries, DIM, seed=4)
        self.config = RetrieverConfig()
        self.setup_s = time.perf_counter() - began

    def fresh_memo(self) -> FilterMemo:
        return FilterMemo(self.metadata.kinds, self.config.limits)


class MetadataSetup:
    """The corpus and its metadata index only: what the validate + mask tables need."""

    def __init__(self, n_docs: int) -> None:
        began = time.perf_counter()
        self.corpus = generate(CorpusSpec(n_docs))
        self.metadata: MetadataIndex = metadata_index(self.corpus)
        self.texts = [" ".join(corpus_queries(self.corpus, 1, seed=1)[0])]
        self.config = RetrieverConfig()
        self.setup_s = time.perf_counter() - began

    def fresh_memo(self) -> FilterMemo:
        return FilterMemo(self.metadata.kinds, self.config.limits)


class FilterSetup(Protocol):
    corpus: SyntheticCorpus
    metadata: MetadataIndex
    texts: list[str]
    config: RetrieverConfig

    def fresh_memo(self) -> FilterMemo: ...


def cached_bm25(corpus: SyntheticCorpus) -> BM25Index:
    """The corpus's BM25 index, saved under build/ on first use and memory-mapped after: its
    build sorts every (word, row) pair (minutes and ~6 GB peak at 1M passages)."""
    directory = BUILD_DIR / f"synthetic-corpus-{corpus.n_docs}-seed{corpus.spec.seed}" / "bm25"
    if not (directory / "params.json").exists():
        bm25_index(corpus).save(directory)
    return BM25Index.load(directory, mmap=True)


def selective_filters(setup: FilterSetup) -> dict[str, dict[str, Any]]:
    """'1%': the category AND year pair allowing closest to 1%; '14%': the year range closest
    to 14%; 'IN n': n article ids drawn without replacement (seeded)."""
    corpus, n = setup.corpus, setup.corpus.n_docs
    from benchmarks.synthetic_corpus import CATEGORIES

    pairs = [(abs(np.count_nonzero((corpus.category == c) & (corpus.year == y)) / n - 0.01), c,
              int(y)) for c in range(len(CATEGORIES)) for y in np.unique(corpus.year)]
    _, cat, year = min(pairs)
    years = [(abs(np.count_nonzero(corpus.year >= y) / n - 0.14), int(y))
             for y in np.unique(corpus.year)]
    rng = np.random.default_rng(9)
    cases: dict[str, dict[str, Any]] = {
        "1%": {"category": CATEGORIES[cat], "year": year},
        "14%": {"year": {"gte": min(years)[1]}},
    }
    for size in IN_SIZES:
        picks = rng.choice(corpus.n_articles, size=in_held(size, corpus.n_articles),
                           replace=False)
        cases[in_case(size, corpus.n_articles)] = {
            "article": {"in": [article_id(int(a)) for a in picks]}}
    return cases


def in_held(size: int, n_articles: int) -> int:
    """How many article ids the IN case asking ``size`` holds: below ``5 * size`` passages the
    corpus has fewer articles, and the case holds every one."""
    return min(size, n_articles)


def in_case(size: int, n_articles: int) -> str:
    """The name of the IN case asking ``size`` article ids, stating how many it holds."""
    held = in_held(size, n_articles)
    return f"IN {held:,}" if held == size else f"IN {held:,} (every article; {size:,} asked)"


KERNELS = {"chosen": None, "exhaustive": Kernel.EXHAUSTIVE, "walk": Kernel.MASK_WALK}


def search_runner(setup: Setup, spec: dict[str, Any] | None, kernel: str = "chosen",
                  named: BoundFilters | None = None
                  ) -> tuple[Callable[[int], Any], dict[str, list[float]]]:
    """One query of the search path; also records its stage times (ms). ``kernel``: "chosen"
    (the index picks per query), "exhaustive" (no filter-aware kernel, no pruning) or "walk"
    (the mask walk, as the index runs it when it keeps no restricted postings)."""
    memo, config, clock = setup.fresh_memo(), setup.config, time.perf_counter
    if named is not None:
        memo.named = named
    stages: dict[str, list[float]] = {"validate+mask": [], "bm25": [], "rerank+fuse": []}
    index = setup.bm25

    def run(i: int) -> Any:
        t0 = clock()
        request = validate(setup.texts[i], spec, None, None, config, memo)
        mask = request_mask(request, setup.metadata)
        t1 = clock()
        # The mask walk needs a mask: without one the index chooses.
        forced = None if mask is None and kernel == "walk" else KERNELS[kernel]
        rows, bm25 = index.top_candidates(setup.tokens[i], request.candidates, mask, forced)
        t2 = clock()
        cosine = setup.vectors.scores(setup.query_vectors[i], rows)
        order = top_k_order(fuse(bm25, cosine, config), request.k)
        t3 = clock()
        for name, value in zip(stages, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            stages[name].append(value * 1e3)
        return rows[order]

    return run, stages


def request_mask(request: SearchRequest, metadata: MetadataIndex) -> np.ndarray | None:
    """The request's mask as the pipeline computes it (``pipeline.filter_mask``)."""
    if request.named is not None:
        return combined_mask(request.named, request.filter, metadata)[0]
    return None if request.filter is None else evaluate_counted(request.filter, metadata)[0]


def search_cases(setup: Setup, filters: dict[str, dict[str, Any]], warmup: int
                 ) -> list[dict[str, Any]]:
    runners, stage_log = {}, {}
    named = NamedFilters(max_in_values=setup.config.limits.max_in_values)
    listed = in_case(NAMED_SIZE, setup.corpus.n_articles)
    bound = named.register(NAMED, filters[listed], None, setup.metadata)
    cases: dict[str, tuple[dict[str, Any] | None, str]] = {"no filter": (None, "chosen")}
    cases.update({name: (spec, "chosen") for name, spec in filters.items()})
    cases[f"named ({NAMED}: {listed})"] = ({"$named": NAMED}, "chosen")
    cases["no filter, exhaustive kernel"] = (None, "exhaustive")
    cases["1%, exhaustive kernel"] = (filters["1%"], "exhaustive")
    cases["1%, mask walk (no restricted postings)"] = (filters["1%"], "walk")
    for name, (spec, kernel) in cases.items():
        runners[name], stage_log[name] = search_runner(setup, spec, kernel, bound)
    items = list(range(warmup, len(setup.tokens)))
    samples = measure_side_by_side(runners, items, list(range(warmup)), chunk=50)
    rows = []
    for name, (spec, _) in cases.items():
        memo = setup.fresh_memo()
        memo.named = bound
        mask = request_mask(validate("x", spec, None, None, setup.config, memo), setup.metadata)
        allowed = setup.metadata.n_docs if mask is None else int(np.count_nonzero(mask))
        stages = {s: summarize(v[warmup:]) for s, v in stage_log[name].items()}
        rows.append({"case": name, "allowed": allowed, "e2e": samples[name].summary(),
                     "stages": stages})
    return rows


class GcCount:
    """Garbage collections (and their ms) that start while ``inside`` is set."""

    def __init__(self) -> None:
        self.inside = False
        self.by_generation = [0, 0, 0]
        self.ms = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.inside:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.by_generation[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._began) * 1e3


def validate_mask_runs(setup: FilterSetup, spec: dict[str, Any], repeats: int
                       ) -> dict[str, Any]:
    """validate + mask for one IN filter: first sight, repeat from fresh JSON, same object;
    and the garbage collections that ran inside the timed calls."""
    config, text, clock = setup.config, setup.texts[0], time.perf_counter
    collections = GcCount()

    cpu: dict[str, list[float]] = {"first": [], "fresh": [], "same": []}

    def timed(filters: Any, memo: FilterMemo, run: str) -> float:
        """Wall ms (the figure the targets are on); the thread's CPU ms go to ``cpu``: on a
        shared machine they show the work apart from the waits for a core."""
        collections.inside = True
        began, began_cpu = clock(), time.thread_time()
        request = validate(text, filters, None, None, config, memo)
        assert request.filter is not None
        evaluate_counted(request.filter, setup.metadata)
        elapsed = (clock() - began) * 1e3
        cpu[run].append((time.thread_time() - began_cpu) * 1e3)
        collections.inside = False
        return elapsed

    payload = json.dumps(spec)
    first, fresh, same = [], [], []
    gc.callbacks.append(collections)
    try:
        for _ in range(repeats):
            decoded = json.loads(payload)  # a new request: new list, new strings (not timed)
            setup.metadata.masks.clear()
            first.append(timed(decoded, setup.fresh_memo(), "first"))
        memo = setup.fresh_memo()
        timed(spec, memo, "same")
        cpu["same"].clear()  # the memo's first sight, not a repeat: untimed in the wall too
        for _ in range(repeats):
            fresh.append(timed(json.loads(payload), memo, "fresh"))
            same.append(timed(spec, memo, "same"))
    finally:
        gc.callbacks.remove(collections)
    named = NamedFilters(max_in_values=config.limits.max_in_values)
    bound = named.register(NAMED, spec, None, setup.metadata)  # at registration / swap
    memo = setup.fresh_memo()
    memo.named = bound
    lookups = []
    for _ in range(repeats):
        reference = json.loads(json.dumps({"$named": NAMED}))  # as a request decodes it
        began = clock()
        request = validate(text, reference, None, None, config, memo)
        request_mask(request, setup.metadata)
        lookups.append((clock() - began) * 1e3)
    skip = max(1, repeats // 10)
    return {"named: validate + mask of {'$named': ...}": summarize(lookups[skip:]),
            "first sight (parse + mask)": summarize(first[skip:]),
            "repeat, fresh JSON": summarize(fresh[skip:]),
            "repeat, same object": summarize(same[skip:]),
            "cpu": {run: summarize(times[skip:]) for run, times in cpu.items()},
            "gc": {"collections_by_generation": collections.by_generation,
                   "ms": collections.ms, "tracked_objects": len(gc.get_objects())}}


def render_validate_mask(title: str, runs: dict[str, Any]) -> list[str]:
    cpu = {"first sight (parse + mask)": "first", "repeat, fresh JSON": "fresh",
           "repeat, same object": "same"}
    table = [[name, percentile_cells(s),
              percentile_cells(runs["cpu"][cpu[name]]) if name in cpu else "-"]
             for name, s in runs.items() if name not in ("gc", "cpu")]
    gcs = runs["gc"]
    return ["", title, "", markdown_table(["run", "p50 / p95 / p99 ms", "CPU ms (thread)"],
                                          table), "",
            f"Garbage collections inside the timed calls (generations 0 / 1 / 2): "
            f"{' / '.join(map(str, gcs['collections_by_generation']))}, {gcs['ms']:.2f} ms in "
            f"all; {gcs['tracked_objects']:,} objects tracked by the collector."]


def validate_mask_only(args: argparse.Namespace) -> int:
    """The validate + mask tables for 10,000 and 100,000 IN values (fewer in a corpus of
    fewer articles: ``in_held``), nothing else."""
    setup = MetadataSetup(args.docs)
    filters = selective_filters(setup)
    runs, tables = {}, []
    for size in (NAMED_SIZE, 100_000):
        name = in_case(size, setup.corpus.n_articles)
        runs[name] = validate_mask_runs(setup, filters[name], args.in_repeats)
        tables += render_validate_mask(in_title(in_held(size, setup.corpus.n_articles)),
                                       runs[name])
    lines = [f"## validate + mask of IN filters: {args.docs:,} realistic passages", "",
             f"setup {setup.setup_s:.0f} s; RSS {memory_mb()['rss']:.0f} MB; load average "
             f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min).", *tables]
    publish_report("filters-validate-mask", args, {"n_docs": args.docs, "runs": runs},
                   "\n".join(lines))
    return 0


def in_title(values: int) -> str:
    return f"validate + mask, {values:,} IN values:"


def render(n_docs: int, setup: Setup, rows: list[dict[str, Any]],
           in_runs: dict[str, Any], rss: dict[str, float]) -> str:
    kept = setup.bm25.restricted.stats()
    listed = in_case(NAMED_SIZE, setup.corpus.n_articles)
    lines = [f"## Filters at access-control scale: {n_docs:,} realistic passages",
             "", f"{setup.bm25.indptr[-1]:,} postings; vectors {setup.vectors.dtype} "
             f"(dim {DIM}); RSS {rss['rss']:.0f} MB (peak {rss['peak']:.0f} MB); "
             f"setup {setup.setup_s:.0f} s; load average at the end "
             f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min). "
             f"Restricted postings kept by the index at the end: {kept['masks']} masks, "
             f"{kept['bytes'] / 1e6:.1f} MB (the 1% and {listed} masks' query terms, "
             "made by the first searches that met each term under each filter).", ""]
    table = []
    for row in rows:
        stages = row["stages"]
        table.append([row["case"], f"{row['allowed'] / n_docs:.2%}",
                      percentile_cells(row["e2e"]),
                      *(f"{stages[s]['p50']:.3f}" for s in ("validate+mask", "bm25",
                                                             "rerank+fuse"))])
    lines.append(markdown_table(["case", "allowed", "p50 / p95 / p99 ms",
                                 "validate+mask p50", "bm25 p50", "rerank+fuse p50"], table))
    lines += render_validate_mask(in_title(in_held(NAMED_SIZE, setup.corpus.n_articles)),
                                  in_runs)
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000, help="measured queries per case")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--vectors", choices=["float32", "float16", "int8"], default="int8")
    p.add_argument("--in-repeats", type=int, default=200)
    p.add_argument("--validate-mask-only", action="store_true",
                   help="only the validate + mask tables (no BM25 index, no vectors)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.validate_mask_only:
        return validate_mask_only(args)
    setup = Setup(args.docs, args.queries + args.warmup, args.vectors)
    rss = memory_mb()
    filters = selective_filters(setup)
    with single_thread():
        rows = search_cases(setup, filters, args.warmup)
        listed = filters[in_case(NAMED_SIZE, setup.corpus.n_articles)]
        in_runs = validate_mask_runs(setup, listed, args.in_repeats)
    results = {"n_docs": args.docs, "rss_mb": rss, "cases": rows, "in_10000": in_runs,
               "postings": int(setup.bm25.indptr[-1])}
    publish_report("filters", args, results, render(args.docs, setup, rows, in_runs, rss))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
