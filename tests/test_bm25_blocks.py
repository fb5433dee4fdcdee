"""The exhaustive BM25 kernel by blocks of rows and by row ranges (``range_top_rows``), and
one index's rows split across cores (``BM25Index``, ``indexes.fan_out``): the same top C,
scores bit for bit and ties, as ``general_rows``, which keeps its own list of touched rows."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_bm25_filtered import SETTINGS, assert_same, cases

from indexes.bm25 import BM25Index
from indexes.bm25_kernels import BLOCK_ROWS, general_rows, range_top_rows
from indexes.fan_out import search_alone
from indexes.topk import sorted_best


def reference(index: BM25Index, tokens: list[str], mask: np.ndarray, k: int
              ) -> tuple[np.ndarray, np.ndarray]:
    ids, weights = index.query_terms(tokens)
    n = index.n_docs
    return general_rows(index.indptr, index.rows, index.impacts, ids, weights, mask, True, k,
                        np.zeros(n), np.zeros(n, dtype=np.bool_), np.empty(n, dtype=np.int32))


@SETTINGS
@given(cases(), st.sampled_from([1, 2, 3, 16, BLOCK_ROWS]), st.floats(0.0, 1.0))
def test_blocks_and_ranges_equal_the_reference(
        case: tuple[BM25Index, list[str], np.ndarray, int], block: int, cut: float) -> None:
    index, tokens, mask, k = case
    ids, weights = index.query_terms(tokens)
    if index._nonpositive and not index._nonpositive.isdisjoint(ids.tolist()):
        return  # the kernel needs positive impacts; general_rows handles these queries
    scratch = np.zeros(index.n_docs)
    split = int(cut * index.n_docs)
    parts = [range_top_rows(index.indptr, index.rows, index.impacts, ids, weights, mask, True,
                            k, scratch, first, end, block)
             for first, end in ((0, split), (split, index.n_docs))]
    assert not scratch.any()  # the scratch contract: left all zeros
    found_s = np.concatenate([s for _, s in parts])
    found_r = np.concatenate([r for r, _ in parts])
    got = sorted_best(found_s, found_r, found_s.size, min(k, found_s.size))
    assert_same(got, reference(index, tokens, mask, k))


def test_a_large_query_on_a_large_index_splits_its_rows_and_answers_the_same() -> None:
    """Three row blocks and a query of ~100,000 postings: searched alone, the rows split into
    one range per core (this host has two); under concurrency they stay whole. Both answers
    equal the reference, ties included (many documents repeat)."""
    rng = np.random.default_rng(5)
    n_docs = 2 * BLOCK_ROWS + 1_000
    docs = [[f"w{t}" for t in rng.integers(0, 12, size=rng.integers(1, 6))]
            for _ in range(n_docs)]
    index = BM25Index.build(docs)
    query = ["w1", "w2", "w3", "w1"]
    ids, _ = index.query_terms(query)
    everything = np.ones(n_docs, dtype=bool)
    want = reference(index, query, everything, 300)
    try:
        search_alone(False)
        assert index._row_ranges(index.indptr, ids) == [(0, n_docs)]
        assert_same(index.top_candidates(query, 300), want)
        search_alone(True)
        ranges = index._row_ranges(index.indptr, ids)
        assert len(ranges) == 2 and ranges[0][0] == 0 and ranges[-1][1] == n_docs
        assert ranges[0][1] % BLOCK_ROWS == 0
        assert_same(index.top_candidates(query, 300), want)
        assert_same(index.top_candidates(query, 300, everything), want)
        assert_same(index.top_candidates(query, 300, kernel="exhaustive"), want)
        assert_same(index.top_candidates(query, 7, everything, kernel="exhaustive"),
                    reference(index, query, everything, 7))
    finally:
        search_alone(True)
