"""MaxScore pruning (``indexes.bm25_pruned``) and the mask walk (``indexes.bm25_mask_walk``)
against the exhaustive kernel: the same top C, scores bit for bit and ties (score desc, row
asc), on random corpora, queries and masks, called directly and through ``BM25Index`` (whose
cost model picks the kernel per query)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_bm25_filtered import SETTINGS, assert_same, cases, exhaustive

from indexes.bm25 import BM25Index
from indexes.bm25_kernels import top_rows
from indexes.bm25_mask_walk import mask_walk_top_rows
from indexes.bm25_pruned import candidates_top_rows, prune_candidates, term_maxima


def pruned_top_rows(indptr: np.ndarray, rows: np.ndarray, impacts: np.ndarray,
                    term_max: np.ndarray, term_ids: np.ndarray, weights: np.ndarray,
                    mask: np.ndarray, use_mask: bool, k: int, scratch: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """MaxScore as ``BM25Index`` runs it: the candidates scored exactly, or the exhaustive
    kernel when pruning would not pay."""
    candidates = prune_candidates(indptr, rows, impacts, term_max, term_ids, weights, mask,
                                  use_mask, k, scratch)
    if candidates.shape[0] == 0:
        return top_rows(indptr, rows, impacts, term_ids, weights, mask, use_mask, k, scratch)
    return candidates_top_rows(indptr, rows, impacts, term_ids, weights, candidates, k)


def _positive(index: BM25Index, ids: np.ndarray) -> bool:
    return not index._nonpositive or index._nonpositive.isdisjoint(ids.tolist())


@SETTINGS
@given(cases(), st.booleans())
def test_pruned_equals_exhaustive(case: tuple[BM25Index, list[str], np.ndarray, int],
                                    use_mask: bool) -> None:
    index, tokens, mask, k = case
    ids, weights = index.query_terms(tokens)
    if not _positive(index, ids):
        return  # both kernels need positive impacts; the general kernel handles these queries
    everything = np.ones(index.n_docs, dtype=bool)
    scratch = np.zeros(index.n_docs)
    got = pruned_top_rows(index.indptr, index.rows, index.impacts, index.term_max(), ids,
                          weights, mask, use_mask, k, scratch)
    assert_same(got, exhaustive(index, tokens, mask if use_mask else everything, k))
    assert not scratch.any()  # the scratch contract: left all zeros


@st.composite
def tied_corpora(draw: st.DrawFn) -> tuple[BM25Index, list[str], int]:
    """Many identical documents among others: scores tie across rows at the cut-off, the case
    where pruning must not drop a lower row that ties the C-th score."""
    base = [f"w{t}" for t in draw(st.lists(st.integers(0, 5), min_size=2, max_size=6))]
    copies = draw(st.integers(2, 60))
    others = draw(st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=8), max_size=80))
    docs = [[f"w{t}" for t in doc] for doc in others]
    positions = sorted(draw(st.lists(st.integers(0, len(docs)), min_size=copies,
                                     max_size=copies)))
    for shift, at in enumerate(positions):
        docs.insert(at + shift, list(base))
    query = [f"w{t}" for t in draw(st.lists(st.integers(0, 8), min_size=2, max_size=6))]
    return BM25Index.build(docs), query, draw(st.integers(1, copies + 3))


@SETTINGS
@given(tied_corpora())
def test_pruned_keeps_the_lowest_rows_among_ties(case: tuple[BM25Index, list[str], int]
                                                   ) -> None:
    index, tokens, k = case
    ids, weights = index.query_terms(tokens)
    if not _positive(index, ids):
        return
    everything = np.ones(index.n_docs, dtype=bool)
    got = pruned_top_rows(index.indptr, index.rows, index.impacts, index.term_max(), ids,
                          weights, everything, False, k, np.zeros(index.n_docs))
    assert_same(got, exhaustive(index, tokens, everything, k))


def test_term_maxima() -> None:
    indptr = np.array([0, 3, 3, 5], dtype=np.int64)
    impacts = np.array([0.5, 2.0, 1.0, 0.25, 0.75], dtype=np.float32)
    highest, lowest = term_maxima(indptr, impacts)
    np.testing.assert_array_equal(highest, [2.0, 0.0, 0.75])
    np.testing.assert_array_equal(lowest, [0.5, 0.0, 0.25])


def test_long_lists_of_frequent_words_are_skipped() -> None:
    """A rare word in a few documents, frequent words in many: the top 5 comes from the rare
    word's documents, so the frequent words' postings are pruned (few candidates), and the
    result is still the exhaustive one."""
    rng = np.random.default_rng(2)
    docs = [["common", *(f"filler{t}" for t in rng.integers(0, 50, size=8))]
            for _ in range(20_000)]
    for row in rng.choice(len(docs), 40, replace=False):
        docs[row].append("rare")
    index = BM25Index.build(docs)
    query = ["common", "rare", "filler1"]
    ids, weights = index.query_terms(query)
    everything = np.ones(index.n_docs, dtype=bool)
    scratch = np.zeros(index.n_docs)
    args = (index.indptr, index.rows, index.impacts, index.term_max(), ids, weights,
            everything, False, 5, scratch)
    candidates = prune_candidates(*args)
    assert 5 <= candidates.shape[0] <= 40 and not scratch.any()
    assert_same(pruned_top_rows(*args), exhaustive(index, query, everything, 5))


@SETTINGS
@given(cases(), st.sampled_from([1, 3, 4096]))  # chunk boundaries inside and across postings
def test_mask_walk_equals_exhaustive(case: tuple[BM25Index, list[str], np.ndarray, int],
                                     chunk: int) -> None:
    index, tokens, mask, k = case
    ids, weights = index.query_terms(tokens)
    if not _positive(index, ids):
        return
    scratch = np.zeros(index.n_docs)
    expected = exhaustive(index, tokens, mask, k)
    for n_allowed in (int(mask.sum()), 0):  # a short count only grows the touched list
        got = mask_walk_top_rows(index.indptr, index.rows, index.impacts, ids, weights, mask,
                                 n_allowed, k, scratch, chunk)
        assert_same(got, expected)
        assert not scratch.any()
