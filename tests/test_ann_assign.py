"""Each vector's nearest list found from 8-bit products and a bound (``indexes.ann_assign``)
is the nearest list in float32, as faiss' flat quantizer finds it, and an IVF index filled
that way is the index faiss' own ``add`` fills."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from benchmarks.synthetic import clustered_unit_vectors
from indexes.ann import ivf_params, trained_ivf
from indexes.ann_assign import (
    BLOCK,
    CentreCodes,
    centre_codes,
    fill_chunk,
    fills_from_8bit,
    int8_products_fast,
)


def _check_nearest(vectors: np.ndarray, centres: np.ndarray) -> None:
    got = CentreCodes(centres).assign(vectors)
    exact = vectors.astype(np.float64) @ centres.astype(np.float64).T
    best = exact.max(axis=1)
    # The nearest centre, up to float32 rounding between centres whose scores all but tie.
    assert np.all(exact[np.arange(len(vectors)), got] >= best - 1e-6)
    _, want = faiss_nearest(vectors, centres)
    assert np.mean(got == want) >= 0.999


def faiss_nearest(vectors: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    flat = faiss.IndexFlatIP(centres.shape[1])
    flat.add(centres)
    scores, lists = flat.search(vectors, 1)
    return scores[:, 0], lists[:, 0]


def test_clustered_vectors_get_their_nearest_list():
    vectors = clustered_unit_vectors(BLOCK * 2 + 77, 384, seed=5)  # a part block at the end
    rng = np.random.default_rng(5)
    centres = vectors[rng.choice(len(vectors), 300, replace=False)] * 0.7  # not unit norm
    _check_nearest(vectors, np.ascontiguousarray(centres))


@pytest.mark.parametrize("dim", [3, 17, 64])
def test_random_vectors_any_width_and_scale_get_their_nearest_list(dim):
    rng = np.random.default_rng(dim)
    vectors = (rng.standard_normal((3000, dim)) * rng.uniform(0.01, 50, (3000, 1)))
    centres = rng.standard_normal((97, dim)) * 3
    _check_nearest(vectors.astype(np.float32), centres.astype(np.float32))


def test_near_ties_are_settled_in_float32():
    # Centres closer to each other than an 8-bit step in every dimension: their 8-bit scores
    # tie or swap, and only the float32 second look orders them.
    rng = np.random.default_rng(2)
    base = rng.standard_normal(32).astype(np.float32)
    centres = base + rng.uniform(-1e-3, 1e-3, (50, 32)).astype(np.float32)
    vectors = base + rng.standard_normal((500, 32)).astype(np.float32)
    _check_nearest(vectors, centres)


def test_a_zero_vector_gets_a_list():
    rng = np.random.default_rng(4)
    centres = rng.standard_normal((10, 8)).astype(np.float32)
    vectors = np.zeros((3, 8), dtype=np.float32)
    assert CentreCodes(centres).assign(vectors).tolist() == [0, 0, 0]  # all tie: the first


def test_lists_filled_from_8_bit_products_equal_faiss_add():
    matrix = clustered_unit_vectors(20_000, 64, seed=8)
    empty = trained_ivf(matrix[:8_000], 300, seed=0)
    theirs, ours = faiss.clone_index(empty), faiss.clone_index(empty)
    theirs.add(matrix)
    fill_chunk(ours, centre_codes(ours), matrix)  # whatever the work and the CPU
    assert ours.ntotal == theirs.ntotal == len(matrix)
    sizes = [ours.invlists.list_size(i) for i in range(ours.nlist)]
    assert sizes == [theirs.invlists.list_size(i) for i in range(theirs.nlist)]
    queries = matrix[::500]
    for nprobe in (1, 8):
        want = theirs.search(queries, 20, params=ivf_params(nprobe))
        got = ours.search(queries, 20, params=ivf_params(nprobe))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_the_8_bit_products_keep_to_the_callers_thread_count():
    import torch

    from indexes.ann_assign import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError), torch_threads(1):
        raise ValueError("the count comes back on failure too")
    assert torch.get_num_threads() == before


def test_the_8_bit_fill_is_chosen_by_its_work_and_the_cpu():
    """Without VNNI the 8-bit product runs ~40x slower than faiss' float32 assignment, so
    the build keeps faiss' ``add`` there; the kernel's CPU flags agree with torch's (private)
    check."""
    matrix = clustered_unit_vectors(2_000, 32, seed=2)
    index = trained_ivf(matrix, 40, seed=0)
    assert not fills_from_8bit(index, len(matrix), min_work=10**15)
    assert fills_from_8bit(index, len(matrix), min_work=0) == int8_products_fast()
    import torch

    if hasattr(torch.cpu, "_is_vnni_supported") and Path("/proc/cpuinfo").is_file():
        assert int8_products_fast() == torch.cpu._is_vnni_supported()


@pytest.mark.parametrize("eight_bit", [True, False], ids=["8-bit", "faiss"])
def test_lists_filled_by_chunks_equal_one_add_and_rebalance_before_each(monkeypatch,
                                                                       eight_bit: bool):
    """Rows go in by ``FILL_CHUNK`` (the last chunk part full), the thread count looked at
    before each, by either way of filling (the 8-bit one forced where the CPU lacks VNNI);
    the index equals faiss' ``add`` of all rows at once."""
    from indexes import ann_assign

    monkeypatch.setattr(ann_assign, "FILL_CHUNK", 3_000)
    monkeypatch.setattr(ann_assign, "int8_products_fast", lambda: eight_bit)
    matrix = clustered_unit_vectors(20_000, 64, seed=9)
    empty = trained_ivf(matrix[:8_000], 200, seed=0)
    theirs, ours = faiss.clone_index(empty), faiss.clone_index(empty)
    theirs.add(matrix)
    assert ann_assign.fills_from_8bit(ours, len(matrix), min_work=0) is eight_bit
    calls: list[int] = []
    ann_assign.add_to_lists(ours, matrix, min_work=0, rebalance=lambda: calls.append(1))
    assert len(calls) == 7
    assert [ours.invlists.list_size(i) for i in range(ours.nlist)] == [
        theirs.invlists.list_size(i) for i in range(theirs.nlist)]
    queries = matrix[::700]
    want = theirs.search(queries, 20, params=ivf_params(4))
    got = ours.search(queries, 20, params=ivf_params(4))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
