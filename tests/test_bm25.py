"""BM25 impacts against the rank-bm25 oracle, on SciFact, and the top-C kernel's contract."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from indexes.analyzer import Analyzer
from indexes.bm25 import BM25Index, BM25Params
from indexes.corpus import read_corpus, read_qrels, read_queries


@pytest.fixture(scope="module")
def scifact_tokens(dataset):
    path: Path = dataset("scifact")
    analyzer = Analyzer()
    docs = [analyzer(d.content) for d in read_corpus(path)]
    qrels = read_qrels(path / "qrels" / "test.tsv")
    queries = [analyzer(t) for q, t in read_queries(path / "queries.jsonl").items() if q in qrels]
    return docs, queries


def test_okapi_equals_rank_bm25_on_scifact(scifact_tokens):
    docs, queries = scifact_tokens
    assert len(queries) == 300
    oracle = BM25Okapi(docs)
    index = BM25Index.build(docs, BM25Params(variant="okapi"))
    for tokens in queries:
        expected = oracle.get_scores(tokens)
        rows, scores = index.top_candidates(tokens, 100)
        np.testing.assert_allclose(scores, expected[rows], rtol=1e-6)
        top = np.sort(expected[expected > 0])[::-1][:100]
        np.testing.assert_allclose(scores, top, rtol=1e-6)
        # Ids agree wherever the score is not tied with the 100th (ties may pick either).
        cutoff = top[-1]
        strict = set(np.flatnonzero(expected > cutoff * (1 + 1e-6)))
        assert strict <= set(rows.tolist())


def test_lucene_variant_matches_hand_computation():
    docs = [["apple", "banana"], ["apple", "apple", "cherry"], ["banana"]]
    params = BM25Params(variant="lucene", k1=1.2, b=0.75)
    index = BM25Index.build(docs, params)
    rows, scores = index.top_candidates(["apple"], 10)
    n, df, avgdl = 3, 2, 2.0
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))

    def part(tf: int, dl: int) -> float:
        return idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))

    assert rows.tolist() == [1, 0]
    np.testing.assert_allclose(scores, [part(2, 3), part(1, 2)], rtol=1e-6)


def test_repeated_query_terms_count_like_rank_bm25():
    docs = [["a1", "b1"], ["b1", "c1"], ["a1", "a1", "c1"], ["d1"]]
    oracle = BM25Okapi(docs)
    index = BM25Index.build(docs)
    rows, scores = index.top_candidates(["a1", "a1", "c1"], 10)
    np.testing.assert_allclose(scores, oracle.get_scores(["a1", "a1", "c1"])[rows], rtol=1e-6)


def test_mask_restricts_candidates_and_unknown_terms_touch_nothing():
    docs = [["x1"], ["x1", "y1"], ["y1"], ["x1"]]
    index = BM25Index.build(docs)
    mask = np.array([False, True, True, False])
    rows, _ = index.top_candidates(["x1"], 10, mask)
    assert rows.tolist() == [1]
    rows, scores = index.top_candidates(["zzz"], 10)
    assert rows.size == 0 and scores.size == 0
    # The scratch buffers are clean after a masked query: a later query is unaffected.
    rows, scores = index.top_candidates(["y1"], 10)
    assert sorted(rows.tolist()) == [1, 2]


def test_save_load_round_trip(tmp_path):
    docs = [["alpha", "beta"], ["beta", "gamma", "gamma"], ["delta"]]
    index = BM25Index.build(docs, BM25Params(variant="lucene", k1=0.9, b=0.4))
    index.save(tmp_path)
    loaded = BM25Index.load(tmp_path)
    assert loaded.params == index.params
    for query in (["beta"], ["gamma", "alpha"], ["delta", "beta"]):
        a, b = index.top_candidates(query, 5), loaded.top_candidates(query, 5)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
