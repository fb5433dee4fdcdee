"""The compiled fusion and top-k order (``retrieval.request_path.fusion``) against numpy
oracles: z-score fusion as its formula reads, the top k best first with ties by lower index,
at the cut too (of entries tied with the k-th, the lowest indices are kept)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.request_path.fusion import minmax, top_k_order, zscore, zscore_fusion

SCORES = st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0, 11.5]), max_size=400)


@settings(max_examples=200, deadline=None)
@given(SCORES, st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.3, 0.7, 1.0]))
def test_zscore_fusion_is_its_formula(bm25: list[float], seed: int, weight: float) -> None:
    bm25_scores = np.array(bm25, dtype=np.float64)
    rng = np.random.default_rng(seed)
    cosine = rng.choice(np.array([-0.5, 0.1, 0.1, 0.8], dtype=np.float32), bm25_scores.size)
    want = minmax(weight * zscore(cosine) + (1.0 - weight) * zscore(bm25_scores))
    got = zscore_fusion(bm25_scores, cosine, weight)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@settings(max_examples=300, deadline=None)
@given(SCORES, st.integers(0, 400))
def test_top_k_order_breaks_ties_by_lower_index_also_at_the_cut(scores: list[float], k: int
                                                                ) -> None:
    values = np.array(scores, dtype=np.float64)
    want = np.lexsort((np.arange(values.size), -values))[:k]
    got = top_k_order(values, k)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)



def test_minmax_of_finite_scores_whose_spread_overflows_stays_finite() -> None:
    """±1.7e308 (a feature's "unknown" sentinel) made ``high - low`` infinite and the top
    score inf / inf = NaN, scrambling the ranking it adjusted."""
    scores = np.array([-1.7e308, 0.0, 1.7e308])
    np.testing.assert_allclose(minmax(scores), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(minmax(np.array([3.0, 1.0, 2.0])), [1.0, 0.0, 0.5])
