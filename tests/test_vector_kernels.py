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
