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


# --- the top-C kernel against a plain reference: same rows, same score bits, same ties ---


def reference_top(index: BM25Index, tokens: list[str], n: int, mask: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The pre-kernel algorithm: float64 sums in query-term order from 0.0, then a total order
    (score desc, row asc) over every touched, allowed row."""
    ids, weights = index.query_terms(tokens)
    scores = np.zeros(index.n_docs)
    touched = np.zeros(index.n_docs, dtype=bool)
    for t, w in zip(ids, weights, strict=True):
        for p in range(index.indptr[t], index.indptr[t + 1]):
            scores[index.rows[p]] += w * index.impacts[p]
            touched[index.rows[p]] = True
    if mask is not None:
        touched &= mask
    rows = np.flatnonzero(touched).astype(np.int32)
    order = np.lexsort((rows, -scores[rows]))[:n]
    return rows[order], scores[rows][order]


def random_corpus(seed: int, n_docs: int = 400, vocab: int = 40) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    docs = [[f"w{t}" for t in rng.zipf(1.3, size=int(rng.integers(1, 30))) % vocab]
            for _ in range(n_docs)]
    return docs + docs[:50]  # duplicated documents: exact score ties across rows


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert got[0].dtype == np.int32 and got[1].dtype == np.float64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])  # bit for bit, not approximately


@pytest.mark.parametrize("variant", ["okapi", "lucene"])
def test_top_candidates_equal_reference_rows_scores_and_ties(variant):
    rng = np.random.default_rng(7)
    for seed, n_docs in ((0, 400), (1, 400), (2, 5000)):  # 5000: the top-k buffer overflows
        docs = random_corpus(seed, n_docs)
        index = BM25Index.build(docs, BM25Params(variant=variant))
        for _ in range(40):
            size = int(rng.integers(1, 6))
            tokens = [f"w{t}" for t in rng.integers(0, 45, size)]  # some unknown, some repeated
            mask = rng.random(len(docs)) < rng.choice([0.02, 0.5, 1.0])
            everything = reference_top(index, tokens, len(docs))
            allowed = reference_top(index, tokens, len(docs), mask)
            for n in (0, 1, 7, 300, 10_000):
                assert_same(index.top_candidates(tokens, n), (everything[0][:n], everything[1][:n]))
                assert_same(index.top_candidates(tokens, n, mask),
                            (allowed[0][:n], allowed[1][:n]))
            rows, scores = index.score_touched(tokens, mask)
            order = np.lexsort((rows, -scores))
            assert_same((rows[order], scores[order]), allowed)
            probe = rng.choice(len(docs), size=min(len(docs), 25), replace=False)
            expected = dict(zip(*(a.tolist() for a in everything), strict=True))
            assert index.score_rows(tokens, probe).tolist() == [
                expected.get(int(r), 0.0) for r in probe]


def test_score_rows_of_every_row_in_any_order_equal_the_touched_scores():
    # The lockstep binary search at its edges: terms of one posting (the rare words of a
    # random corpus) and of every row, the first and last rows, repeated and unsorted rows.
    docs = [["common", "rare"] if i == 0 else ["common", f"w{i % 7}"] for i in range(300)]
    docs[-1] = ["common", "last"]
    index = BM25Index.build(docs)
    tokens = ["last", "w3", "common", "rare", "unknown"]
    rows, scores = index.score_touched(tokens)
    expected = dict(zip(rows.tolist(), scores.tolist(), strict=True))
    probe = np.array([299, 0, 5, 5, 298, 0, 150], dtype=np.int64)
    assert index.score_rows(tokens, probe).tolist() == [expected[int(r)] for r in probe]
    assert index.score_rows(tokens, np.arange(300)).tolist() == [expected[r] for r in range(300)]
    assert index.score_rows(tokens, np.empty(0, dtype=np.int64)).size == 0
    rare_rows, rare_scores = index.score_touched(["rare"])
    assert rare_rows.tolist() == [0]
    assert index.score_rows(["rare"], np.array([1, 0, 299])).tolist() == [
        0.0, rare_scores[0], 0.0]


def test_cut_off_ties_keep_lowest_rows():
    docs = [["tie", "pad"]] * 20 + [["tie", "tie"]] * 3 + [["other", "pad"]] * 60
    index = BM25Index.build(docs)
    rows, scores = index.top_candidates(["tie"], 8)
    assert rows.tolist() == [20, 21, 22, 0, 1, 2, 3, 4]
    assert scores[0] == scores[2] > scores[3] == scores[7]


def test_non_positive_impacts_take_the_general_path_exactly():
    # okapi idf is exactly 0 for a term in half the documents: its impacts are all 0.0, so
    # "score 0.0" cannot mean "untouched"; negative impacts stand for a negative idf floor.
    docs = [["half", "x1"], ["half"], ["y1"], ["z1", "x1"]]
    index = BM25Index.build(docs)
    assert index.impacts[index.indptr[index.vocab["half"]]] == 0.0
    for tokens in (["half"], ["half", "x1"], ["x1", "half"], ["y1", "half", "z1"]):
        assert_same(index.top_candidates(tokens, 10), reference_top(index, tokens, 10))
        assert sorted(index.score_touched(tokens)[0].tolist()) == \
            sorted(reference_top(index, tokens, 10)[0].tolist())
    mixed = index.impacts.copy()
    mixed[::2] *= -1  # signs differing inside a term too: the set is exact, not a heuristic
    for impacts in (-np.abs(index.impacts), mixed):
        other = BM25Index(index.vocab_list, index.indptr, index.rows, impacts, index.n_docs,
                          index.params)
        for tokens in (["x1"], ["half", "x1", "y1"], ["z1", "y1"]):
            assert_same(other.top_candidates(tokens, 2), reference_top(other, tokens, 2))
        assert not other._buffer().any() and not other._general_buffers()[0].any()
    assert not index._buffer().any() and not index._general_buffers()[0].any()  # left clean


def test_scratch_is_per_thread_and_results_match_serial():
    from concurrent.futures import ThreadPoolExecutor

    index = BM25Index.build(random_corpus(11, n_docs=3000, vocab=60))
    rng = np.random.default_rng(3)
    queries = [[f"w{t}" for t in rng.integers(0, 60, int(rng.integers(1, 5)))]
               for _ in range(300)]
    serial = [index.top_candidates(q, 50) for q in queries]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda q: index.top_candidates(q, 50), queries * 4))
    for got, want in zip(parallel, serial * 4, strict=True):
        assert_same(got, want)


def test_mask_of_wrong_shape_or_dtype_is_refused():
    index = BM25Index.build([["a1"], ["a1", "b1"]])
    with pytest.raises(ValueError, match="mask"):
        index.top_candidates(["a1"], 5, np.ones(1, dtype=bool))
    with pytest.raises(ValueError, match="mask"):
        index.top_candidates(["a1"], 5, np.ones(2, dtype=np.int8))
