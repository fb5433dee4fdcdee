"""Quality on real data with the real model: the default beats BM25 alone and dense alone."""

from __future__ import annotations

import pytest

from benchmarks.quality import dense_run, evaluate_run, retriever_run
from retrieval import Retriever, RetrieverConfig


def _three_way(beir_index, encoder, name: str) -> dict[str, float]:
    root, queries, qrels = beir_index(name)
    retriever = Retriever.load(root, encoder=encoder)
    bm25_only = Retriever.load(root, RetrieverConfig(vector_weight=0.0), encoder=encoder)
    vectors = encoder.encode(list(queries.values()))
    scores = {
        "default": evaluate_run(qrels, retriever_run(retriever, queries, query_vectors=vectors)),
        "bm25": evaluate_run(qrels, retriever_run(bm25_only, queries, query_vectors=vectors)),
        "dense": evaluate_run(qrels, dense_run(retriever, queries, vectors)),
    }
    print(name, {k: round(v["ndcg@10"], 4) for k, v in scores.items()})
    return {k: v["ndcg@10"] for k, v in scores.items()}


def test_scifact_default_beats_bm25_and_dense(beir_index, encoder):
    ndcg = _three_way(beir_index, encoder, "scifact")
    assert ndcg["default"] >= 0.72
    assert ndcg["default"] > ndcg["bm25"]
    assert ndcg["default"] > ndcg["dense"]


@pytest.mark.parametrize("name", ["cranfield", "cisi"])
def test_default_beats_both_on_other_collections(beir_index, encoder, name):
    ndcg = _three_way(beir_index, encoder, name)
    assert ndcg["default"] > ndcg["bm25"]
    assert ndcg["default"] > ndcg["dense"]
