"""Re-rank products read in place (``indexes.vector_kernels``): the values numpy's gather and
product give, the same bits for a row wherever it stands, numpy's rules for odd rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.vectors import VectorStore

DIM = 48


def store_of(dtype: str, n: int = 300, seed: int = 3) -> tuple[VectorStore, np.ndarray]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return VectorStore.build(vectors, dtype), vectors  # type: ignore[arg-type]


def numpy_scores(store: VectorStore, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """What ``scores`` computed before: the rows gathered, widened, then one product."""
    block = np.take(store._rows, rows, axis=0).astype(np.float64)
    if store.dtype == "int8":
        assert store.scale is not None and store.low is not None
        block = (block + 128.0) * store.scale + store.low
    return block @ query.astype(np.float64)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float32", "int8"]),
       rows=st.lists(st.integers(-300, 299), max_size=40), seed=st.integers(0, 2**16))
def test_scores_equal_the_gathered_product(dtype: str, rows: list[int], seed: int) -> None:
    store, _ = store_of(dtype)
    query = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    picked = np.array(rows, dtype=np.int64)
    got = store.scores(query, picked)
    assert got.dtype == np.float32 and got.shape == (len(rows),)
    np.testing.assert_allclose(got, numpy_scores(store, query, picked), rtol=0, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(0, 299), min_size=1, max_size=23), cut=st.integers(0, 22))
def test_a_row_scores_the_same_bits_wherever_it_stands(rows: list[int], cut: int) -> None:
    """Rows are summed four at a time: a row's score must not depend on its neighbours, or a
    shard, a whole build and an explanation could disagree in the last bit."""
    store, _ = store_of("float32")
    query = np.random.default_rng(1).standard_normal(DIM).astype(np.float32)
    picked = np.array(rows, dtype=np.int32)
    alone = np.concatenate([store.scores(query, picked[i:i + 1]) for i in range(len(rows))])
    np.testing.assert_array_equal(store.scores(query, picked), alone)
    np.testing.assert_array_equal(store.scores(query, picked[cut:]), alone[cut:])


def test_a_row_past_the_end_is_numpys_index_error() -> None:
    store, _ = store_of("float32")
    with pytest.raises(IndexError):
        store.scores(np.ones(DIM, dtype=np.float32), np.array([0, 300]))
    with pytest.raises(IndexError):
        store.scores(np.ones(DIM, dtype=np.float32), np.array([-301]))


def test_rows_given_as_a_list_or_unsigned_score_as_numpy_does() -> None:
    store, vectors = store_of("float32")
    query = np.random.default_rng(2).standard_normal(DIM).astype(np.float32)
    expected = vectors[[5, 7]] @ query
    np.testing.assert_allclose(store.scores(query, [5, 7]), expected, atol=1e-6)
    np.testing.assert_allclose(store.scores(query, np.array([5, 7], dtype=np.uint16)),
                               expected, atol=1e-6)
    assert store.scores(query, np.empty(0, dtype=np.int64)).shape == (0,)


@pytest.mark.parametrize("rows", [[], (), np.array([3, 1], dtype=">i8"),
                                  np.array([3, 1], dtype=np.int16), np.array([[3], [1]])])
def test_rows_the_kernel_does_not_take_score_as_numpy_does(rows: object) -> None:
    """An empty list (numpy makes it float64), another byte order or width, a column."""
    store, _ = store_of("int8")
    query = np.random.default_rng(4).standard_normal(DIM).astype(np.float32)
    got = store.scores(query, rows)
    expected = numpy_scores(store, query, np.asarray(rows, dtype=np.int64))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_scores_of_every_row_are_the_scores_of_those_rows(dtype: str) -> None:
    """An exact search over a wide filter scores every row, one over a narrow filter the
    allowed rows; an int8 store's are the same kernel's, to the bit."""
    store, _ = store_of(dtype, n=1000)
    query = np.random.default_rng(5).standard_normal(DIM).astype(np.float32)
    rows = np.random.default_rng(6).permutation(1000)[:77]
    every, picked = store.scores_all(query, block=64)[rows], store.scores(query, rows)
    if dtype == "int8":
        np.testing.assert_array_equal(every, picked)
    np.testing.assert_allclose(every, picked, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_warming_a_store_loads_the_kernel_for_both_row_types(dtype: str) -> None:
    """The request path hands the kernel int32 rows (BM25's) and int64 (with the dense
    leg's): each is its own machine code, loaded at start-up, not by a request."""
    from indexes.vector_kernels import dot_rows
    from indexes.warmup import warm_vectors

    store, _ = store_of(dtype, n=50, seed=9)
    warm_vectors(store)
    matrix = numba_typeof(store._rows)
    taken = {signature[1].dtype.name for signature in dot_rows.signatures
             if signature[0] == matrix}
    assert {"int32", "int64"} <= taken


def numba_typeof(value: object) -> object:
    from numba import typeof

    return typeof(value)
