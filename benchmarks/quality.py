"""Retrieval quality with ranx (nDCG@10, recall@k, MRR@10) for our retriever and baselines."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from retrieval import Retriever

DEFAULT_METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
RunDict = dict[str, dict[str, float]]


def evaluate_run(
    qrels: Mapping[str, Mapping[str, int]], run: RunDict, metrics: Sequence[str] = DEFAULT_METRICS
) -> dict[str, float]:
    """Mean of each metric over the qrels' queries (a query missing from the run scores 0)."""
    from numba.core.errors import NumbaTypeSafetyWarning
    from ranx import Qrels, Run, evaluate

    full_run = {q: dict(run.get(q, {})) for q in qrels}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
        scores = evaluate(Qrels(dict(qrels)), Run(full_run), list(metrics), make_comparable=True)
    if isinstance(scores, float | np.floating):
        scores = {metrics[0]: scores}
    return {m: float(v) for m, v in scores.items()}


def retriever_run(
    retriever: Retriever, queries: Mapping[str, str], k: int = 100,
    query_vectors: np.ndarray | None = None, **search: object,
) -> RunDict:
    """Run every query through ``search_batch`` and collect {query id: {doc id: score}}."""
    ids = list(queries)
    results = retriever.search_batch([queries[q] for q in ids], k=k, query_vectors=query_vectors,
                                     **search)  # type: ignore[arg-type]
    return {q: {h.doc_id: h.score for h in r.hits} for q, r in zip(ids, results, strict=True)}


def dense_run(retriever: Retriever, queries: Mapping[str, str], query_vectors: np.ndarray,
              k: int = 100) -> RunDict:
    """Exact dense search over the whole corpus (faiss flat inner product), no BM25 gate."""
    snapshot = retriever.snapshot
    run: RunDict = {}
    for q, vector in zip(queries, query_vectors, strict=True):
        rows, scores = snapshot.vectors.dense_top_k(vector, k)
        run[q] = {snapshot.docs.doc_id(int(r)): float(s) for r, s in zip(rows, scores, strict=True)}
    return run


SUITE_METRICS = ("ndcg@10", "recall@10", "recall@100", "recall@1000", "mrr@10")


def run_from_outputs(query_ids: Sequence[str], outputs: Sequence[tuple]) -> RunDict:
    """{query id: {doc id: score}} from per-query (timings, ids, scores) outputs.

    Scores are replaced by ``n - rank``: ranx then evaluates exactly the order each system
    returned (it would re-order ties, e.g. equal RRF scores, its own way). A duplicate id keeps
    its first (best) rank.
    """
    run: RunDict = {}
    for q, output in zip(query_ids, outputs, strict=True):
        ids = list(dict.fromkeys(output[1]))
        run[q] = {doc: float(len(ids) - rank) for rank, doc in enumerate(ids)}
    return run


def qrels_from_relevant(query_ids: Sequence[str], relevant: Sequence[Sequence[str] | None]
                        ) -> dict[str, dict[str, int]]:
    """Binary qrels from a query log's optional ``relevant`` lists (queries without one skip)."""
    return {q: dict.fromkeys(docs, 1) for q, docs in zip(query_ids, relevant, strict=True) if docs}
