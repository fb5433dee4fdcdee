"""Filter-aware BM25 (``indexes.bm25_filtered``) against the exhaustive kernel: the same top C,
scores bit for bit and ties (score desc, row asc), on random corpora, queries and masks."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes.bm25 import BM25Index, BM25Params
from indexes.bm25_filtered import allowed_rows_upto, filtered_top_rows
from indexes.bm25_kernels import top_rows
from indexes.bm25_strategy import Kernel, MaskFacts, choose

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn) -> tuple[BM25Index, list[str], np.ndarray, int]:
    vocab = draw(st.integers(2, 30))
    n_docs = draw(st.integers(1, 120))
    words = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12)
    docs = [[f"w{t}" for t in draw(words)] for _ in range(n_docs)]
    docs += docs[: draw(st.integers(0, n_docs))]  # duplicates: exact score ties across rows
    variant = draw(st.sampled_from(["okapi", "lucene"]))
    index = BM25Index.build(docs, BM25Params(variant=variant))
    tokens = [f"w{t}" for t in draw(st.lists(st.integers(0, vocab + 2), max_size=8))]
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    mask = np.random.default_rng(seed).random(len(docs)) < density
    k = draw(st.sampled_from([0, 1, 3, 10, 1000]))
    return index, tokens, mask, k


def exhaustive(index: BM25Index, tokens: list[str], mask: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    ids, weights = index.query_terms(tokens)
    scratch = np.zeros(index.n_docs)
    return top_rows(index.indptr, index.rows, index.impacts, ids, weights, mask, True, k, scratch)


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert got[0].dtype == np.int32 and got[1].dtype == np.float64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])  # bit for bit


@SETTINGS
@given(cases())
def test_filtered_kernel_equals_exhaustive(case: tuple[BM25Index, list[str], np.ndarray, int]
                                           ) -> None:
    index, tokens, mask, k = case
    ids, weights = index.query_terms(tokens)
    if index._nonpositive and not index._nonpositive.isdisjoint(ids.tolist()):
        return  # both kernels need positive impacts; the general kernel handles these queries
    scratch = np.zeros(index.n_docs)
    allowed = np.flatnonzero(mask).astype(np.int32)
    got = filtered_top_rows(index.indptr, index.rows, index.impacts, ids, weights, allowed, k,
                            scratch)
    assert_same(got, exhaustive(index, tokens, mask, k))
    assert not scratch.any()  # the scratch contract: left all zeros
    # Through the index (its cost model picks either kernel), with a shared read-only mask.
    mask.flags.writeable = False
    assert_same(index.top_candidates(tokens, k, mask), exhaustive(index, tokens, mask, k))


def test_selective_masks_take_the_filtered_path_and_agree() -> None:
    rng = np.random.default_rng(3)
    docs = [[f"w{t}" for t in rng.zipf(1.3, size=20) % 50] for _ in range(20_000)]
    index = BM25Index.build(docs)
    mask = np.zeros(len(docs), dtype=bool)
    mask[rng.choice(len(docs), 40, replace=False)] = True
    mask.flags.writeable = False
    tokens = ["w1", "w2", "w3"]
    ids, _ = index.query_terms(tokens)
    lengths = index.indptr[ids + 1] - index.indptr[ids]
    plan = choose(lengths, index.n_docs, mask, MaskFacts(), True)
    assert plan.kernel is Kernel.GALLOP and plan.allowed.shape == (40,)  # few allowed
    everything = np.ones(len(docs), dtype=bool)
    assert choose(lengths, index.n_docs, everything, MaskFacts(), True).kernel not in (
        Kernel.GALLOP, Kernel.MASK_WALK)  # all allowed: no filter kernel
    for k in (1, 10, 300):
        assert_same(index.top_candidates(tokens, k, mask), exhaustive(index, tokens, mask, k))


def test_allowed_rows_stop_at_the_limit() -> None:
    mask = np.zeros(100, dtype=bool)
    mask[[3, 50, 99]] = True
    rows, ok = allowed_rows_upto(mask, 3)
    assert ok and rows.tolist() == [3, 50, 99]
    assert not allowed_rows_upto(mask, 2)[1]
