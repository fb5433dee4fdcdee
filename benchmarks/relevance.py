"""The relevance score, fitted and checked in one run: ``python -m benchmarks.relevance``.

1. **Fit** ``retrieval.relevance``'s logistic model on the training queries of the shipped
   collections (SciFact: ``qrels/train.tsv``; Cranfield and CISI: the ``train`` half of
   ``qrels/test.tsv`` by a hash of the query id), top 10 hits each, with the retriever's
   defaults. ``--write-default`` stores it as the calibration shipped for all-MiniLM-L6-v2.
2. **Reliability** on the held-out queries (SciFact's test queries; the other halves): the
   queries in 4 equal-count bins of their top hit's relevance, the mean estimate and the share
   whose top hit is relevant per bin.
3. **Transfer**: ``min_score`` chosen on SciFact's training queries for a target precision of
   the top hit, then the precision of the queries kept on every collection's held-out queries.
4. **Cost**: what the score adds to a search (the terms' bound, the hits' coverage, the
   model), timed alone, beside a whole uncached search on the same queries.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, RESULTS_DIR, markdown_table, publish_report
from indexes import build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from retrieval import Retriever, RetrieverConfig
from retrieval.calibrate import (
    JudgedHits,
    fit_judged,
    judged_hits,
    judged_splits,
    precision_above,
    reliability,
    threshold_for,
)
from retrieval.latency import summarize
from retrieval.relevance import (
    SHIPPED,
    Calibration,
    coverage,
    keyword_bound,
)

COLLECTIONS = ("scifact", "cranfield", "cisi")
SHIPPED_DATA = REPO / "examples" / "data"


def index_of(name: str, data: Path, indexes: Path) -> Path:
    """The collection's index under ``indexes`` (the tests' folder: built once, reused)."""
    root = indexes / name
    if not (root / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data / name)), root, progress=False)
    return root


def judged(retriever: Retriever, folder: Path) -> tuple[JudgedHits, JudgedHits]:
    queries, train, held_out = judged_splits(folder)
    return judged_hits(retriever, queries, train), judged_hits(retriever, queries, held_out)


def score_cost(retriever: Retriever, calibration: Calibration, texts: list[str],
               rounds: int) -> dict[str, float]:
    """ms per search of what the relevance score adds to it: the query terms' bound (one
    document-frequency lookup a term), the top 10 hits' coverage and the logistic model."""
    snapshot = retriever.snapshot
    bm25 = snapshot.bm25
    tokens = [snapshot.analyzer(text) for text in texts]
    hits = [retriever.search(text, k=10).hits for text in texts]
    times = []
    for _ in range(rounds):
        for terms, found in zip(tokens, hits, strict=True):
            cosine = np.array([h.vector_score for h in found])
            keyword = np.array([h.bm25_score for h in found])
            started = time.perf_counter()
            covered = coverage(keyword, keyword_bound(terms, bm25))
            calibration.score(cosine, covered, np.arange(1, cosine.size + 1))
            times.append((time.perf_counter() - started) * 1e3)
    return summarize(times)


def timed_searches(retriever: Retriever, texts: list[str]) -> list[float]:
    times = []
    for text in texts:
        started = time.perf_counter()
        retriever.search(text)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = RetrieverConfig(cache={"backend": "none"})
    parts: dict[str, tuple[JudgedHits, JudgedHits]] = {}
    model = ""
    for name in COLLECTIONS:
        root = index_of(name, args.data, args.indexes)
        with Retriever.load(root, config) as retriever:
            model = retriever.snapshot.manifest.encoder.model
            parts[name] = judged(retriever, args.data / name)
    calibration = fit_judged({name: train for name, (train, _) in parts.items()}, model)
    if args.write_default:
        SHIPPED.write_text(calibration.model_dump_json(indent=1) + "\n", encoding="utf-8")
    results: dict[str, Any] = {"calibration": calibration.model_dump(), "reliability": {
        name: reliability(calibration, held_out, args.bins)
        for name, (_, held_out) in parts.items()}}
    results["transfer"] = []
    for target in args.precisions:
        threshold = threshold_for(calibration, parts["scifact"][0], target)
        row: dict[str, Any] = {"target": target, "min_score": threshold}
        for name, (_, held_out) in parts.items():
            share, kept = precision_above(calibration, held_out, threshold)
            row[name] = {"precision": share, "kept": kept, "of": int((held_out.top >= 0).sum())}
        results["transfer"].append(row)
    with Retriever.load(args.indexes / "scifact", config) as retriever:
        texts = list(judged_splits(args.data / "scifact")[0].values())[:args.queries]
        results["score ms"] = score_cost(retriever, calibration, texts, args.rounds)
        results["search ms"] = summarize(timed_searches(retriever, texts))
    return results


def markdown(results: dict[str, Any]) -> str:
    cal = results["calibration"]
    lines = [f"# Relevance score: logistic over cosine, BM25 coverage and log rank "
             f"(intercept {cal['intercept']:.3f}, weights "
             + ", ".join(f"{k} {v:.3f}" for k, v in cal["weights"].items())
             + f"; fitted on {cal['fitted_on']})", ""]
    for name, table in results["reliability"].items():
        lines += [f"Held-out {name}: top hit's relevance in equal-count bins", "",
                  markdown_table(["bin", "queries", "score range", "mean estimate",
                                  "top hit relevant"],
                                 [[i + 1, b["queries"], f"{b['low']:.2f}-{b['high']:.2f}",
                                   f"{b['estimate']:.2f}", f"{b['relevant']:.2f}"]
                                  for i, b in enumerate(table)]), ""]
    lines += ["min_score chosen on SciFact's training queries, precision of kept top hits on "
              "held-out queries:", ""]
    lines.append(markdown_table(
        ["target", "min_score"] + list(COLLECTIONS),
        [[r["target"], f"{r['min_score']:.3f}"]
         + [f"{r[n]['precision']:.2f} ({r[n]['kept']}/{r[n]['of']})" for n in COLLECTIONS]
         for r in results["transfer"]]))
    lines += ["", "SciFact, ms:", "", markdown_table(
        ["", "p50", "p95", "p99"],
        [[name, f"{s['p50']:.3f}", f"{s['p95']:.3f}", f"{s['p99']:.3f}"]
         for name, s in (("the relevance score's part of a search", results["score ms"]),
                         ("a whole uncached search", results["search ms"]))])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=SHIPPED_DATA,
                        help="folder holding scifact/, cranfield/, cisi/")
    parser.add_argument("--indexes", type=Path, default=REPO / "build" / "test-indexes")
    parser.add_argument("--bins", type=int, default=4)
    parser.add_argument("--precisions", type=float, nargs="+", default=[0.7, 0.8, 0.9])
    parser.add_argument("--queries", type=int, default=300, help="SciFact queries timed")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--write-default", action="store_true",
                        help="store the fit as the calibration shipped in the package")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    results = run(args)
    publish_report("relevance", args, results, markdown(results))


if __name__ == "__main__":
    main()
