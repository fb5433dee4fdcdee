"""Filling the IVF lists (``indexes.ann_assign``): the bfloat16 shortlist finds float32's
nearest list for every vector, its error bound holds, and lists filled through it hold the
same rows, in the same order, as faiss' own ``add``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.ann import fill_lists, trained_ivf
from indexes.ann_assign import bf16_error, nearest_lists
from indexes.ann_train import nearest


def assert_same_nearest(vectors: np.ndarray, centroids: np.ndarray, got: np.ndarray) -> None:
    """``got`` is float32's nearest list of every row, or ties it to float32's rounding."""
    want = nearest(vectors, centroids)
    rows = np.flatnonzero(got != want)
    exact = vectors[rows].astype(np.float64) @ centroids.astype(np.float64).T
    scale = np.linalg.norm(vectors[rows], axis=1) * np.linalg.norm(centroids, axis=1).max()
    gap = exact[np.arange(len(rows)), want[rows]] - exact[np.arange(len(rows)), got[rows]]
    assert np.all(np.abs(gap) <= 1e-5 * scale), (rows, gap)


def test_the_bf16_shortlist_finds_each_vectors_nearest_list():
    """Clustered unit vectors against 500 lists trained on them, with rows scaled from 1e-3 to
    1e3 (inner product, so the norms matter): the shortlist's answers are float32's."""
    from benchmarks.synthetic import clustered_unit_vectors
    from indexes.ann_train import train_two_level

    vectors = clustered_unit_vectors(40_000, 64, seed=3)
    centroids = train_two_level(vectors[:20_000], 500, seed=0)
    vectors *= np.logspace(-3, 3, len(vectors), dtype=np.float32)[:, None]
    got, how = nearest_lists(vectors, centroids, bf16=True)
    assert how == "bf16 shortlist"
    assert_same_nearest(vectors, centroids, got)
    assert nearest_lists(vectors[:10], centroids, bf16=False)[1] == "float32"


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), lists=st.integers(1, 60), dim=st.integers(1, 48),
       ties=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_the_bf16_shortlist_agrees_on_any_vectors(rows, lists, dim, ties, seed):
    """Any sizes, Gaussian values (negative scores included), and centroids that repeat (exact
    ties) or lie within bfloat16's rounding of each other."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((rows, dim)).astype(np.float32)
    centroids = rng.standard_normal((lists, dim)).astype(np.float32)
    if ties and lists > 1:
        centroids[1::2] = centroids[::2][:len(centroids[1::2])] * np.float32(1 + 1e-3)
    got, _ = nearest_lists(vectors, centroids, bf16=True)
    assert_same_nearest(vectors, centroids, got)


def test_the_bf16_error_bound_holds():
    """The bound the shortlist rests on: |bfloat16 score - float64 score| <= bf16_error(d)
    |x| |c|, over values whose bfloat16 rounding is as large as it gets (mantissas just past
    a rounding midpoint) and over Gaussian ones."""
    import torch

    rng = np.random.default_rng(5)
    for dim in (1, 7, 384, 1024):
        worst = np.float32(1 + 2 ** -8 + 2 ** -12) * rng.choice([-1, 1], size=(64, dim))
        for vectors in (worst.astype(np.float32),
                        rng.standard_normal((64, dim)).astype(np.float32)):
            centroids = np.abs(vectors[::-1]).astype(np.float32)
            half = (torch.from_numpy(vectors).bfloat16()
                    @ torch.from_numpy(centroids).bfloat16().T).float().numpy()
            exact = vectors.astype(np.float64) @ centroids.astype(np.float64).T
            bound = bf16_error(dim) * np.outer(np.linalg.norm(vectors, axis=1),
                                               np.linalg.norm(centroids, axis=1))
            assert np.all(np.abs(half - exact) <= bound)


@pytest.mark.parametrize("bf16", [True, False])
def test_lists_filled_by_assignment_equal_faiss_add(bf16):
    """The lists hold the same rows in the same order as faiss' own ``add`` puts there."""
    import faiss

    from benchmarks.synthetic import clustered_unit_vectors

    matrix = clustered_unit_vectors(30_000, 96, seed=2)
    theirs = trained_ivf(matrix[:12_000], 300, seed=0)
    ours = faiss.clone_index(theirs)
    theirs.add(matrix)
    assert fill_lists(ours, matrix, bf16=bf16) == ("bf16 shortlist" if bf16 else "float32")
    assert ours.ntotal == theirs.ntotal == len(matrix)
    for lst in range(theirs.nlist):
        size = theirs.invlists.list_size(lst)
        assert ours.invlists.list_size(lst) == size
        ids = faiss.rev_swig_ptr(ours.invlists.get_ids(lst), size)
        assert np.array_equal(ids, faiss.rev_swig_ptr(theirs.invlists.get_ids(lst), size))
        codes = faiss.rev_swig_ptr(ours.invlists.get_codes(lst), size * ours.code_size)
        assert np.array_equal(codes, faiss.rev_swig_ptr(theirs.invlists.get_codes(lst),
                                                        size * theirs.code_size))
