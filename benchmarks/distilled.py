"""The distilled query encoder against MiniLM INT8: ``python -m benchmarks.distilled``.

    python -m benchmarks.distilled                      # quality, encoder time, full miss 100k
    python -m benchmarks.distilled --docs 100000 1000000
    python -m benchmarks.distilled --write-shipped      # retrain the generic encoder first

Side by side in one run:

- quality per collection (SciFact test queries, Cranfield, CISI): nDCG@10 and recall@100 of
  the default retriever with MiniLM INT8 query vectors, with the shipped generic distilled
  encoder's and with one distilled for that index (``retrieval distill``), all over the same
  MiniLM document vectors; the per-index encoder's training time on this machine;
- the encoder alone, one query per call, p50/p95 by query length in tokens;
- a full miss (cache off, the encoder in the call, a filter on year) p50/p95/p99 on SciFact
  grown to ``--docs`` documents with clustered distractor vectors
  (``benchmarks.throughput.grown_index``), INT8 and distilled taking turns in chunks of 50
  queries, with the default (union) candidate policy and with keyword candidates only; beside
  them the same searches with the query vector given, the floor any encoder adds to.

``--write-shipped`` trains the generic encoder on the passages of the three collections the
repository ships (examples/data; their queries are never seen), measures it on each and
writes it to ``indexes/distilled/all-MiniLM-L6-v2``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from benchmarks.relevance import COLLECTIONS, SHIPPED_DATA
from benchmarks.throughput import FILTER, LENGTH_BUCKETS, grown_index, index_root
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.distill import DistillSettings, distill
from indexes.distilled_encoder import SHIPPED, DistilledEncoder
from indexes.encoders import Encoder, SentenceTransformerEncoder
from indexes.onnx_encoder import OnnxEncoder
from retrieval import Retriever
from retrieval.distill import distill_index, judged_quality
from retrieval.query_encoder import DISTILLED_DIR

NDCG_TOLERANCE = 0.005  # the drop on every collection that would make it the default


def data_dir(name: str) -> Path:
    shared = REPO.parent / "shared" / "data" / name
    return shared if (shared / "corpus.jsonl").is_file() else SHIPPED_DATA / name


def judged(name: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    folder = data_dir(name)
    qrels = read_qrels(folder / "qrels" / "test.tsv")
    queries = {q: t for q, t in read_queries(folder / "queries.jsonl").items() if q in qrels}
    return queries, qrels


def write_shipped(work: Path, int8: Encoder) -> DistilledEncoder:
    """Train the generic encoder on the shipped passages, measure it, store it in the package."""
    passages = [doc.content for name in COLLECTIONS
                for doc in read_corpus(SHIPPED_DATA / name)]
    encoder = distill(passages, "examples/data passages: scifact, cranfield, cisi")
    reference = SentenceTransformerEncoder()
    encoder.info.quality["judged"] = {
        name: judged_quality(index_root(data_dir(name), work, "float32", reference), encoder,
                             *judged(name), reference=int8)
        for name in COLLECTIONS}
    if SHIPPED.exists():
        shutil.rmtree(SHIPPED)
    encoder.save(SHIPPED)
    print(f"wrote {SHIPPED} ({encoder.encoder_id})")
    return encoder


def quality_runs(work: Path, int8: Encoder, shipped: DistilledEncoder) -> dict[str, Any]:
    """Per collection: INT8, shipped and per-index distilled figures, and training time."""
    reference = SentenceTransformerEncoder()
    out = {}
    for name in COLLECTIONS:
        root = index_root(data_dir(name), work, "float32", reference)
        own_dir = root / DISTILLED_DIR
        own = (DistilledEncoder.load(own_dir) if own_dir.is_dir()
               else distill_index(root, DistillSettings())[0])
        queries, qrels = judged(name)
        figures = judged_quality(root, shipped, queries, qrels, reference=int8)
        figures["own"] = judged_quality(root, own, queries, qrels, reference=int8)["distilled"]
        figures["own_training_seconds"] = own.info.training["seconds"]
        out[name] = figures
    return out


def encoder_times(encoders: dict[str, Encoder], queries: Sequence[str], tokens: Sequence[int]
                  ) -> dict[str, Any]:
    """p50/p95 ms of ``encode([query])`` per encoder and token-length bucket."""
    runners = {name: (lambda q, e=e: e.encode([q])) for name, e in encoders.items()}
    samples = measure_side_by_side(runners, list(queries[50:]), list(queries[:50]), chunk=50)
    out: dict[str, Any] = {}
    for name, sample in samples.items():
        wall = np.asarray(sample.wall_ms)
        lengths = np.asarray(tokens[50:])
        out[name] = {"all": sample.summary()}
        for low, high in LENGTH_BUCKETS:
            picked = wall[(lengths >= low) & (lengths <= high)]
            if picked.size:
                out[name][f"{low}-{high}"] = {
                    "queries": int(picked.size), "p50": float(np.percentile(picked, 50)),
                    "p95": float(np.percentile(picked, 95))}
    return out


def full_miss(root: Path, encoders: dict[str, Encoder], queries: Sequence[str], warmup: int
              ) -> dict[str, Any]:
    policies = {"union (default)": "union", "keyword": "keyword"}
    retrievers = {f"{name}, {label}": Retriever.load(
                      root, {"cache": {"backend": "none"}, "candidate_policy": policy}, encoder=e)
                  for label, policy in policies.items() for name, e in encoders.items()}
    given = dict(zip(queries, encoders["MiniLM INT8"].encode(list(queries)), strict=True))
    try:
        runners = {name: (lambda q, r=r: r.search(q, filters=FILTER, k=10))
                   for name, r in retrievers.items()}
        for label in policies:  # the floor: the same searches with no encoder in the call
            retriever = retrievers[f"MiniLM INT8, {label}"]
            runners[f"none (vector given), {label}"] = (
                lambda q, r=retriever: r.search(q, filters=FILTER, k=10, query_vector=given[q]))
        samples = measure_side_by_side(runners, list(queries[warmup:]), list(queries[:warmup]),
                                       chunk=50, rewarm=3)
        return {"docs": retrievers[next(iter(retrievers))].snapshot.manifest.n_docs,
                **{name: s.summary() for name, s in samples.items()}}
    finally:
        for retriever in retrievers.values():
            retriever.close()


def render(results: dict[str, Any]) -> str:
    lines = ["# Distilled query encoder against MiniLM INT8", "",
             "## Quality (default retriever, same MiniLM document vectors)", ""]
    rows = []
    for name, q in results["quality"].items():
        base = q["reference"]
        for label, figures in (("MiniLM INT8", base), ("distilled, shipped generic",
                                                       q["distilled"]),
                               ("distilled for this index", q["own"])):
            rows.append([name, label, f"{figures['ndcg@10']:.4f}",
                         f"{figures['ndcg@10'] - base['ndcg@10']:+.4f}",
                         f"{figures['recall@100']:.4f}"])
    lines += [markdown_table(["collection", "query encoder", "nDCG@10", "vs INT8",
                              "recall@100"], rows), ""]
    worst = min(q["own"]["ndcg@10"] - q["reference"]["ndcg@10"]
                for q in results["quality"].values())
    verdict = "default" if worst >= -NDCG_TOLERANCE else "an option, not the default"
    lines += [f"Worst nDCG@10 change of the per-index encoder: {worst:+.4f} (the default needs "
              f">= -{NDCG_TOLERANCE} on every collection): it is {verdict}.", ""]
    training = ", ".join(f"{n} {q['own_training_seconds']:.0f} s"
                         for n, q in results["quality"].items())
    lines += [f"Training time per index on this machine: {training}.", "",
              "## Encoder alone, one query per call (ms p50 / p95)", ""]
    buckets = [f"{low}-{high}" for low, high in LENGTH_BUCKETS]
    rows = [[name, percentile_cells(t["all"], ("p50", "p95")),
             *[percentile_cells(t[b], ("p50", "p95")) if b in t else "-" for b in buckets]]
            for name, t in results["encoder"].items()]
    lines += [markdown_table(["encoder", "all", *[f"{b} tokens" for b in buckets]], rows), ""]
    lines += ["## Full miss (cache off, encoder in the call), ms p50 / p95 / p99", ""]
    rows = [[f"{run['docs']:,}", *name.split(", "), percentile_cells(run[name])]
            for run in results["full_miss"] for name in run if name != "docs"]
    lines += [markdown_table(["documents", "query encoder", "candidates", "p50 / p95 / p99"],
                             rows)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distilled", description=__doc__)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--docs", type=int, nargs="*", default=[100_000])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--write-shipped", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    int8 = OnnxEncoder(quantized=True)
    shipped = (write_shipped(args.work, int8) if args.write_shipped
               else DistilledEncoder.load(SHIPPED))
    encoders: dict[str, Encoder] = {"MiniLM INT8": int8, "distilled": shipped}
    queries = list(read_queries(data_dir("scifact") / "queries.jsonl").values())
    queries = (queries * (1 + args.queries // len(queries)))[: args.queries + args.warmup]
    tokens = [len(ids) for ids in int8.token_ids(queries)]
    reference = SentenceTransformerEncoder()
    results = {
        "quality": quality_runs(args.work, int8, shipped),
        "encoder": encoder_times(encoders, queries, tokens),
        "full_miss": [full_miss(grown_index(data_dir("scifact"), args.work, n, reference,
                                            clustered=True), encoders, queries, args.warmup)
                      for n in args.docs],
    }
    publish_report("distilled", args, results, render(results), key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
