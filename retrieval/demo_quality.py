"""The demo's quality line: nDCG@10 of the default against BM25 alone and dense alone.

ranx (the ``dev`` extra, which ``make demo`` installs) computes the metric; without it the demo
says how to get it and goes on.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from indexes.corpus import read_qrels
from retrieval.retriever import Retriever

Run = dict[str, dict[str, float]]


def print_quality(retriever: Retriever, folder: Path, queries: dict[str, str]) -> None:
    """Print nDCG@10 of three runs on ``folder``'s test qrels (nothing when it has none)."""
    qrels_path = folder / "qrels" / "test.tsv"
    if not qrels_path.is_file():
        print(f"\nquality: {qrels_path} not found, nDCG@10 not measured")
        return
    qrels = read_qrels(qrels_path)
    judged = {q: text for q, text in queries.items() if q in qrels}
    try:
        scores = three_way_ndcg(retriever, judged, qrels)
    except ImportError:
        print("\nquality: install the dev extra (pip install -e '.[dev]') to measure nDCG@10")
        return
    config = retriever.config
    labels = {
        "default": f"default ({config.candidate_policy}: BM25 top-{config.candidates} -> "
                   f"{config.vector_weight:g}*cos + {1 - config.vector_weight:g}*BM25, "
                   f"{config.fusion})",
        "bm25": "BM25 only",
        "dense": "dense only (exact, whole corpus)",
    }
    print(f"\nquality on {folder.name}'s {len(judged)} judged queries (qrels/test.tsv), nDCG@10,"
          " the same query vectors for every run:")
    for name, label in labels.items():
        print(f"  {label:<58} {scores[name]:.3f}")

def three_way_ndcg(retriever: Retriever, queries: dict[str, str],
                   qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """nDCG@10 of the retriever's configuration, of BM25 alone and of exact dense search."""
    if retriever.encoder is None:
        raise ValueError("the retriever has no query encoder to embed the judged queries")
    ids = list(queries)
    vectors = retriever.encoder.encode([queries[q] for q in ids])
    bm25_only = Retriever.load(retriever.snapshot.path,
                               retriever.config.model_copy(update={"vector_weight": 0.0}),
                               encoder=retriever.encoder)
    runs = {"default": _search_run(retriever, ids, queries, vectors),
            "bm25": _search_run(bm25_only, ids, queries, vectors),
            "dense": _dense_run(retriever, ids, vectors)}
    bm25_only.close()
    return {name: ndcg_at_10(qrels, run) for name, run in runs.items()}


def _search_run(retriever: Retriever, ids: list[str], queries: dict[str, str],
                vectors: np.ndarray) -> Run:
    results = retriever.search_batch([queries[q] for q in ids], k=100, query_vectors=vectors)
    return {q: {h.doc_id: h.score for h in r.hits} for q, r in zip(ids, results, strict=True)}


def _dense_run(retriever: Retriever, ids: list[str], vectors: np.ndarray) -> Run:
    snapshot = retriever.snapshot
    run: Run = {}
    for q, vector in zip(ids, vectors, strict=True):
        rows, scores = snapshot.vectors.dense_top_k(vector, 100)
        run[q] = {snapshot.docs.doc_id(int(r)): float(s) for r, s in zip(rows, scores, strict=True)}
    return run


def ndcg_at_10(qrels: dict[str, dict[str, int]], run: Run) -> float:
    """Mean nDCG@10 over the qrels' queries (a query the run misses scores 0)."""
    from numba.core.errors import NumbaTypeSafetyWarning
    from ranx import Qrels, Run, evaluate

    full = {q: dict(run.get(q, {})) for q in qrels}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
        return float(evaluate(Qrels(qrels), Run(full), "ndcg@10", make_comparable=True))
