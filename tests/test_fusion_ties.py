"""Reciprocal rank fusion over tied scores (``retrieval.request_path.fusion``)."""

from __future__ import annotations

import numpy as np

from retrieval.request_path.fusion import ranks_desc, rrf_fusion


def test_candidates_equal_in_both_scores_fuse_equal_whatever_their_position():
    """A union's dense-only candidates all score 0 in BM25 (BM25 returned fewer than C rows).
    Ranked by position, the first of them got a better BM25 rank than the last: two
    candidates equal in both scores fused apart, so the order the dense leg appended them in
    decided between them."""
    bm25 = np.array([7.0, 3.0, 0.0, 0.0, 0.0])
    cosine = np.array([0.2, 0.5, 0.4, 0.9, 0.4], dtype=np.float32)
    fused = rrf_fusion(bm25, cosine, 60)
    assert fused[2] == fused[4]
    assert fused[3] > fused[2]  # a better cosine still ranks above among the zeros


def test_ties_share_the_best_rank_of_their_group():
    assert ranks_desc(np.array([3.0, 0.0, 0.0, 5.0, 0.0, 3.0, 1.0])).tolist() == \
        [2.0, 5.0, 5.0, 1.0, 5.0, 2.0, 4.0]
    assert ranks_desc(np.array([1.0, 2.0, 3.0])).tolist() == [3.0, 2.0, 1.0]
    assert ranks_desc(np.array([])).tolist() == []
