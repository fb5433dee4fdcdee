"""The IVF lists chosen from 8-bit centres and a bound (``indexes.ann_coarse``) are the lists
faiss' flat quantizer chooses, and the dense leg searching them answers as faiss' own search
does: same rows, same scores, under filters too."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from benchmarks.synthetic import clustered_unit_vectors
from indexes.ann import ANN_DIR, IvfDense, build_ann, ivf_params, load_dense
from indexes.ann_coarse import CoarseLists, _approximate, coarse_lists
from indexes.vectors import VectorStore


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    root = tmp_path_factory.mktemp("coarse")
    matrix = clustered_unit_vectors(20_000, 64, seed=3)
    build_ann(matrix, root / ANN_DIR)
    leg = load_dense(root, VectorStore.build(matrix))
    assert isinstance(leg, IvfDense) and leg.coarse is not None
    return leg


def test_the_lists_are_the_flat_quantizers_choice(dense):
    centres = dense.index.quantizer.reconstruct_n(0, dense.nlist).astype(np.float64)
    queries = clustered_unit_vectors(200, 64, seed=4, centers_of=20_000)
    agree = 0
    for n in (1, 4, 16, dense.nprobe):
        _, lists = dense.index.quantizer.search(queries, n)
        for query, want in zip(queries, lists, strict=True):
            got, got_scores = dense.coarse.nearest(query, n)
            exact = centres @ query.astype(np.float64)
            np.testing.assert_allclose(got_scores, exact[got], rtol=1e-5, atol=1e-6)
            assert np.all(np.diff(exact[got]) <= 1e-6)  # best first
            others = np.delete(exact, got)
            # The best n, up to float32 rounding between lists whose scores all but tie.
            assert others.size == 0 or exact[got].min() >= others.max() - 1e-6
            agree += got.tolist() == want.tolist()
    assert agree >= 0.98 * 4 * len(queries)


def test_the_choice_is_exact_where_the_8_bit_scores_mislead():
    # Centres that differ by less than an 8-bit step in every dimension: their approximate
    # scores tie or swap, and only the bound's second look in float32 orders them.
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((300, 16)).astype(np.float32)
    centres[1:40] = centres[0] + rng.uniform(-1e-3, 1e-3, (39, 16)).astype(np.float32)
    coarse = CoarseLists(centres)
    misled = 0
    for _ in range(50):
        query = centres[0] + 0.01 * rng.standard_normal(16).astype(np.float32)
        exact = centres.astype(np.float64) @ query.astype(np.float64)
        approx = _approximate(coarse.codes_t, query * coarse.step,
                              np.float32(query @ coarse.offset))
        for n in (1, 5, 30):
            got, _ = coarse.nearest(query, n)
            # The best n, up to float32's resolution at these scores (about 16: 2e-6).
            assert exact[got].min() >= np.delete(exact, got).max() - 4e-6
            misled += set(np.argsort(-approx, kind="stable")[:n]) != set(got.tolist())
    assert misled > 100  # the 8-bit scores alone chose wrong lists in most of the 150 cases


def test_searches_answer_as_faiss_does_with_and_without_filters(dense):
    queries = clustered_unit_vectors(60, 64, seed=6, centers_of=20_000)
    rng = np.random.default_rng(7)
    masks = [None, rng.random(20_000) < 0.4, rng.random(20_000) < 0.05]
    for mask in masks:
        bitmap = None if mask is None else np.packbits(mask, bitorder="little")
        for query in queries:
            params = ivf_params(dense.nprobe)
            if bitmap is not None:
                params.sel = faiss.IDSelectorBitmap(20_000, faiss.swig_ptr(bitmap))
            want_scores, want_rows = dense.index.search(query.reshape(1, -1), 50, params=params)
            got_scores, got_rows = dense.search_once(query, 50, dense.nprobe, params)
            assert got_rows.tolist() == want_rows.tolist()
            np.testing.assert_array_equal(got_scores, want_scores)


def test_other_quantizers_leave_the_choice_to_faiss():
    quantizer = faiss.IndexFlatL2(8)
    index = faiss.IndexIVFFlat(quantizer, 8, 4)
    index.train(np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32))
    assert coarse_lists(index) is None
