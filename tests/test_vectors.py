"""Document vector storage: float32, float16 and int8 re-rank scores, memory, round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexes.errors import EncoderMismatchError
from indexes.vectors import QUANTIZE_ROWS, VectorStore, quantize_int8


@pytest.fixture(scope="module")
def unit_vectors() -> np.ndarray:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((2_000, 384)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def query(unit_vectors: np.ndarray) -> np.ndarray:
    # Close to one stored vector, so the top of the ranking is not a near tie.
    near = unit_vectors[3] + 0.3 * unit_vectors[11]
    return (near / np.linalg.norm(near)).astype(np.float32)


# Largest errors seen here: float16 3e-5, int8 1.5e-3 (per-dimension codes of 384-d units).
TOLERANCE = {"float32": 1e-6, "float16": 2e-4, "int8": 5e-3}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_scores_match_float32(unit_vectors, query, dtype):
    rows = np.array([3, 11, 0, 1999, 500, 3], dtype=np.int64)  # any order, repeats allowed
    exact = unit_vectors[rows] @ query
    store = VectorStore.build(unit_vectors, dtype)
    scores = store.scores(query, rows)
    assert scores.dtype == np.float32 and scores.shape == rows.shape
    np.testing.assert_allclose(scores, exact, atol=TOLERANCE[dtype])
    everything = np.arange(len(unit_vectors))
    top = np.argsort(-store.scores(query, everything))[:10]
    assert top[0] == 3  # the planted neighbour stays first whatever the storage


def test_memory_per_dtype(unit_vectors):
    sizes = {d: VectorStore.build(unit_vectors, d).nbytes for d in ("float32", "float16", "int8")}
    assert sizes["float16"] * 2 == sizes["float32"]
    assert sizes["int8"] * 4 == sizes["float32"]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("mmap", [True, False])
def test_saved_store_scores_the_same(tmp_path: Path, unit_vectors, query, dtype, mmap):
    store = VectorStore.build(unit_vectors, dtype)
    store.save(tmp_path)
    loaded = VectorStore.load(tmp_path, mmap=mmap)
    rows = np.arange(0, len(unit_vectors), 7)
    assert loaded.dtype == dtype and loaded.dim == 384
    np.testing.assert_array_equal(loaded.scores(query, rows), store.scores(query, rows))
    np.testing.assert_allclose(loaded.reconstruct_rows(rows[:5]), unit_vectors[rows[:5]],
                               atol=TOLERANCE[dtype])


def test_query_of_the_wrong_dimension_is_refused(unit_vectors):
    store = VectorStore.build(unit_vectors[:10])
    with pytest.raises(EncoderMismatchError, match="dimension 128 but the index holds 384"):
        store.scores(np.ones(128, dtype=np.float32), np.array([0, 1]))


def test_int8_codes_quantized_in_blocks_equal_the_whole_matrix_quantized_at_once() -> None:
    vectors = np.random.default_rng(3).standard_normal((QUANTIZE_ROWS + 1_000, 8)).astype(
        np.float32)
    codes, scale, low = quantize_int8(vectors)
    whole = np.clip(np.rint((vectors - low) / scale) - 128.0, -128, 127).astype(np.int8)
    assert np.array_equal(codes, whole)
    assert (codes == -128).any() and (codes == 127).any()  # both ends of the range are used


def test_a_float32_store_keeps_the_given_matrix_without_copying_it(unit_vectors) -> None:
    assert np.shares_memory(VectorStore.build(unit_vectors, "float32").data, unit_vectors)
