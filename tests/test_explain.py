"""``search(..., explain=True)``: every hit's explanation reproduces its score (BM25 parts add
up to the BM25 score, the fusion recomputed from the reported normalization gives the fused
score), ranks agree with the scores, the ranking is the same without it, and the result cache
never serves a result without explanations to a search that asked for them."""

from __future__ import annotations

import numpy as np
import pytest
from live_index import build_small, scifact_docs, unit_vectors

from retrieval import Retriever

QUERIES = ["cells in the immune system", "gene expression in tumours", "blood pressure"]


@pytest.fixture(scope="module")
def root(tmp_path_factory, dataset):
    path = tmp_path_factory.mktemp("explain")
    build_small(path, scifact_docs(dataset("scifact"), 300))
    return path


def fused_from(why) -> float:
    bounds, w = why.normalization, why.vector_weight
    if why.fusion == "zscore":
        mix = (w * (why.vector - bounds["vector_mean"]) / bounds["vector_std"]
               + (1 - w) * (why.bm25 - bounds["bm25_mean"]) / bounds["bm25_std"])
        return (mix - bounds["mix_min"]) / (bounds["mix_max"] - bounds["mix_min"])
    return (w * (why.vector - bounds["vector_min"]) / (bounds["vector_max"] - bounds["vector_min"])
            + (1 - w) * (why.bm25 - bounds["bm25_min"]) / (bounds["bm25_max"] - bounds["bm25_min"]))


@pytest.mark.parametrize("fusion", ["zscore", "minmax"])
def test_explanations_reproduce_every_score(root, fusion):
    config = {"cache": {"backend": "none"}, "fusion": fusion, "live_lag_seconds": None}
    with Retriever.load(root, config) as retriever:
        for n, query in enumerate(QUERIES):
            vector = unit_vectors(1, n)[0]
            plain = retriever.search(query, None, 10, query_vector=vector)
            explained = retriever.search(query, None, 10, query_vector=vector, explain=True)
            assert [h.doc_id for h in explained.hits] == [h.doc_id for h in plain.hits]
            assert all(h.explanation is None for h in plain.hits)
            for hit in explained.hits:
                why = hit.explanation
                assert why is not None and why.fusion == fusion
                assert why.bm25 == pytest.approx(hit.bm25_score)
                assert sum(why.bm25_terms.values()) == pytest.approx(hit.bm25_score, rel=1e-5)
                assert why.vector == pytest.approx(hit.vector_score)
                assert why.fused + why.features == pytest.approx(hit.score)
                assert fused_from(why) == pytest.approx(why.fused, abs=1e-6)
                assert 1 <= why.bm25_rank <= why.candidates == explained.candidates
            by_bm25 = sorted(explained.hits, key=lambda h: -h.bm25_score)
            ranks = [h.explanation.bm25_rank for h in by_bm25]
            assert ranks == sorted(ranks)
            by_cosine = sorted(explained.hits, key=lambda h: -h.vector_score)
            assert [h.explanation.vector_rank for h in by_cosine] == \
                sorted(h.explanation.vector_rank for h in by_cosine)


def test_the_result_cache_keeps_explained_results_apart(root):
    with Retriever.load(root, {"live_lag_seconds": None}) as retriever:
        vector = unit_vectors(1, 7)[0]
        first = retriever.search(QUERIES[0], None, 5, query_vector=vector)
        again = retriever.search(QUERIES[0], None, 5, query_vector=vector, explain=True)
        assert again.hits and all(h.explanation is not None for h in again.hits)
        assert [h.doc_id for h in again.hits] == [h.doc_id for h in first.hits]
        batch = retriever.search_batch(QUERIES, None, 3,
                                       query_vectors=np.stack([vector] * 3), explain=True)
        assert all(h.explanation is not None for r in batch for h in r.hits)


@pytest.fixture(scope="module")
def passage_root(tmp_path_factory, dataset):
    from live_index import INFO

    from indexes import BuildConfig, PassageConfig, build_index
    from indexes.wal.split import split, token_counter

    path = tmp_path_factory.mktemp("explain-passages")
    docs = scifact_docs(dataset("scifact"), 120)
    small = PassageConfig(max_tokens=64, overlap_tokens=8)
    rows, _ = split(docs, token_counter(None), small)
    build_index(docs, path, vectors=unit_vectors(len(rows), 3), encoder_info=INFO,
                config=BuildConfig(passages=small), progress=False)
    return path


@pytest.mark.parametrize("fusion", ["zscore", "minmax"])
def test_explanations_of_grouped_hits_rank_among_every_candidate(passage_root, fusion):
    """With group_by the hits are each document's best passage; their explanations were made
    over those alone, so the normalization and ranks disagreed with the scores."""
    config = {"cache": {"backend": "none"}, "fusion": fusion, "live_lag_seconds": None}
    with Retriever.load(passage_root, config) as retriever:
        for n, query in enumerate(QUERIES):
            result = retriever.search(query, None, 10, query_vector=unit_vectors(1, n)[0],
                                      group_by="document", explain=True)
            assert len({h.parent_id for h in result.hits}) == len(result.hits)
            for hit in result.hits:
                why = hit.explanation
                assert why is not None and why.fused + why.features == pytest.approx(hit.score)
                assert fused_from(why) == pytest.approx(why.fused, abs=1e-6)
                assert why.candidates == result.candidates


def test_min_max_bounds_are_the_candidates_own():
    """``min(initial=0.0)`` reported 0 for every minimum above it: the explanation's bounds
    did not give back the fused score."""
    from retrieval import RetrieverConfig
    from retrieval.request_path.explain import normalization

    bounds = normalization(np.array([2.0, 3.0, 5.0]), np.array([0.5, 0.8, 0.6], np.float32),
                           RetrieverConfig(fusion="minmax"))
    assert bounds == pytest.approx({"bm25_min": 2.0, "bm25_max": 5.0, "vector_min": 0.5,
                                    "vector_max": 0.8})
