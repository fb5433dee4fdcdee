"""Document vectors for exact re-rank of a small candidate set.

Stored as float32 (exact), float16 (half the memory) or int8 codes with per-dimension scale and
offset (a quarter of the memory). Re-rank reads only the candidate rows, each dotted with the
query where it lies (``indexes.vector_kernels``); it never scans the whole matrix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexes.errors import InvalidQueryError, QueryDimensionError
from indexes.mapping import prefault_mapping
from indexes.metadata import refuse_surrogates
from indexes.storage import load_array, read_json, save_array, write_json
from indexes.vector_kernels import dot_rows, rows_in_range

VectorDtype = Literal["float32", "float16", "int8"]
# Row index types the re-rank kernel reads (native byte order); others go through np.take.
_KERNEL_ROWS = (np.dtype(np.int32), np.dtype(np.int64))
# Rows quantized at a time: quantizing the whole matrix at once made float32 temporaries of
# its size (3.8 GB each for a 2.5M-row shard), which set the peak of a shard's write.
QUANTIZE_ROWS = 65_536


def non_finite_row(vectors: np.ndarray) -> int | None:
    """The first row of ``vectors`` holding NaN or infinity; None when every value is finite
    (checked ``QUANTIZE_ROWS`` rows at a time: no mask of the whole matrix)."""
    for start in range(0, len(vectors), QUANTIZE_ROWS):
        finite = np.isfinite(vectors[start:start + QUANTIZE_ROWS]).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


FLOAT16_MAX = float(np.finfo(np.float16).max)


def out_of_range_row(vectors: np.ndarray, dtype: str) -> int | None:
    """The first row of ``vectors`` a ``dtype`` store cannot hold: float16 turns a value past
    65,504 into infinity, and every search then scores all rows alike. None when all fit."""
    if dtype != "float16":
        return None
    for start in range(0, len(vectors), QUANTIZE_ROWS):
        fits = (np.abs(vectors[start:start + QUANTIZE_ROWS]) <= FLOAT16_MAX).all(axis=1)
        if not fits.all():
            return start + int(np.argmin(fits))
    return None


def content_hashes(texts: Sequence[str]) -> np.ndarray:
    """16-byte sha256 prefix of each text, dtype S16 (the vector reuse key). A text holding
    a lone surrogate is a ``CorpusError`` (``refuse_surrogates``)."""
    try:
        digests = [hashlib.sha256(t.encode("utf-8")).digest()[:16] for t in texts]
    except UnicodeEncodeError:
        refuse_surrogates(texts, "a text")
        raise
    return np.array(digests, dtype="S16")


# A given query vector this close to unit length is taken as it is (a float32 encoder's
# output is within ~1e-7): dividing by its norm would move its scores in the last bits.
UNIT_TOLERANCE = 1e-4
Bounds = tuple[np.ndarray, np.ndarray]  # per-dimension (low, high), float32 (d,) each


def vector_bounds(vectors: np.ndarray) -> Bounds:
    """Per-dimension (min, max) of a matrix's rows: what int8 codes are scaled by."""
    return vectors.min(axis=0).astype(np.float32), vectors.max(axis=0).astype(np.float32)


def joined_bounds(parts: list[Bounds]) -> Bounds:
    """The bounds of the rows of every part together."""
    return (np.minimum.reduce([low for low, _ in parts]),
            np.maximum.reduce([high for _, high in parts]))


def widened_grid(grid: Bounds, vectors: np.ndarray) -> Bounds:
    """``grid`` where ``vectors`` fit in it; a dimension they leave is widened past them by an
    eighth of its range. Rows quantized on a grid and again on a wider one move by up to half
    a step each time: the margin keeps a stream of slightly larger vectors from widening it
    (and moving every row's codes in that dimension) at every compaction."""
    low, high = grid
    seen_low, seen_high = vector_bounds(vectors)
    margin = (high - low) / 8
    return (np.where(seen_low < low, seen_low - margin, low).astype(np.float32),
            np.where(seen_high > high, seen_high + margin, high).astype(np.float32))


def quantize_int8(vectors: np.ndarray, bounds: Bounds | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-dimension scalar quantization: x ~= (code + 128) * scale + low.

    vectors: float32 (n, d); ``bounds``: the (low, high) to scale by, the matrix's own by
    default (a shard takes the whole collection's, so its codes are the whole build's rows).
    Returns codes int8 (n, d), scale float32 (d,), low float32 (d,).
    """
    low, high = bounds if bounds is not None else vector_bounds(vectors)
    scale = np.maximum((high - low) / 255.0, 1e-12).astype(np.float32)
    codes = np.empty(vectors.shape, dtype=np.int8)
    for start in range(0, len(vectors), QUANTIZE_ROWS):
        block = vectors[start:start + QUANTIZE_ROWS]
        codes[start:start + len(block)] = np.clip(np.rint((block - low) / scale) - 128.0,
                                                  -128, 127)
    return codes, scale, low.astype(np.float32)


class VectorStore:
    """Row-aligned document vectors; ``scores`` is the query verb."""

    def __init__(
        self,
        data: np.ndarray,
        dtype: VectorDtype,
        scale: np.ndarray | None = None,
        low: np.ndarray | None = None,
    ) -> None:
        self.data = data
        # A plain-ndarray view of the same memory: np.memmap's __getitem__ wraps every gather
        # in Python; np.take on the view gathers 300 re-rank rows about 25% faster.
        self._rows = data.view(np.ndarray)
        self.dtype = dtype
        self.scale = scale
        self.low = low
        self._dense_index: Any = None  # faiss index, built on first dense_top_k

    @property
    def n_docs(self) -> int:
        return int(self.data.shape[0])

    @property
    def dim(self) -> int:
        return int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @classmethod
    def build(cls, vectors: np.ndarray, dtype: VectorDtype = "float32",
              bounds: Bounds | None = None) -> VectorStore:
        """vectors: float32 (n, d), expected L2-normalized; ``bounds`` as ``quantize_int8``."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if dtype == "int8":
            codes, scale, low = quantize_int8(vectors, bounds)
            return cls(codes, dtype, scale, low)
        # float32 keeps the caller's matrix: a copy was 1.5 GB of a 1M build's peak.
        return cls(vectors.astype(dtype, copy=False), dtype)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_array(directory / "vectors.npy", self.data)
        if self.dtype == "int8":
            assert self.scale is not None and self.low is not None
            save_array(directory / "scale.npy", self.scale)
            save_array(directory / "low.npy", self.low)
        write_json(directory / "vectors.json", {"dtype": self.dtype, "dim": self.dim})

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> VectorStore:
        meta = read_json(directory / "vectors.json")
        data = load_array(directory / "vectors.npy", mmap)
        if mmap:
            prefault_mapping(data)  # re-rank reads random rows: page faults were its p95
        if meta["dtype"] == "int8":
            scale = load_array(directory / "scale.npy", mmap=False)
            low = load_array(directory / "low.npy", mmap=False)
            return cls(data, "int8", scale, low)
        return cls(data, meta["dtype"])

    def given_query(self, query: Any) -> np.ndarray:
        """A caller's query vector, checked (``check_query``), of finite numbers (a NaN
        scored every hit the same) and of unit length: the documents' are, and a hit's
        vector score is their cosine (a vector 3x as long tripled it, and the relevance
        estimate and min_score with it). Once at the door: the stages after it take the
        float32 vector this returns (``check_query`` again, 2 us less without the scan)."""
        query = self.check_query(query)
        if not np.isfinite(query).all():
            raise InvalidQueryError("query vector holds NaN or infinity; give finite numbers "
                                    "(the encoder's output)")
        norm = float(np.linalg.norm(query))
        if norm == 0.0:
            raise InvalidQueryError("query vector is all zeros: it has no direction to rank "
                                    "by; give the encoder's output")
        return query if abs(norm - 1.0) < UNIT_TOLERANCE else query / np.float32(norm)

    def check_query(self, query: np.ndarray) -> np.ndarray:
        """``query`` as float32 (d,): one vector ((d,), (1, d) or (d, 1)) of real numbers;
        ``InvalidQueryError`` otherwise (a (2, d/2) array was read as one vector),
        ``QueryDimensionError`` for another dimension."""
        if np.iscomplexobj(query):
            raise InvalidQueryError("query vector holds complex numbers; give real ones")
        try:
            query = np.asarray(query, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidQueryError(f"query vector must be numbers ({exc}); give a float32 "
                                    "array of the encoder's dimension") from exc
        if query.ndim > 1 and query.size != max(query.shape):
            raise InvalidQueryError(f"query vector has shape {query.shape}; give one vector "
                                    f"of {self.dim} numbers (one row per query to a batch)")
        query = query.reshape(-1)
        if query.shape[0] != self.dim:
            raise QueryDimensionError(
                f"query vector has dimension {query.shape[0]} but the index holds {self.dim}-"
                "dimensional vectors; use the encoder the index was built with"
            )
        return query

    def scores(self, query: np.ndarray, rows: Any) -> np.ndarray:
        """Inner products (cosines for normalized vectors) of ``query`` (d,) with ``rows``.

        Returns float32 (len(rows),), in the order of ``rows``.
        """
        folded, bias = self._folded(query)
        picked = np.asarray(rows)
        if self.dtype != "float16" and picked.ndim == 1 and picked.dtype in _KERNEL_ROWS and \
                rows_in_range(picked, self.n_docs):
            # Contiguous: a strided view would be another signature, compiled on the request.
            return dot_rows(self._rows, np.ascontiguousarray(picked), folded, bias)
        # Other rows (a float16 store, a list of lists, other integer types, an empty list,
        # rows out of range) as numpy reads them: numpy's values and its own errors.
        block = np.take(self._rows, rows, axis=0)
        return block.astype(np.float32) @ folded + bias

    def scores_all(self, query: np.ndarray, block: int = 16_384) -> np.ndarray:
        """``scores`` of every row, in row order, without gathering a copy of the matrix.

        A float32 store is one BLAS product (it spreads over the cores: at 111k rows 27 ms
        against 52 for the re-rank kernel on one), equal to ``scores`` within float32
        rounding. An int8 store goes through ``scores``' kernel ``block`` rows at a time, to
        the bit (7x faster than widening each block for BLAS)."""
        folded, bias = self._folded(query)
        out = np.empty(self.n_docs, dtype=np.float32)
        if self.dtype != "int8":
            np.matmul(self._rows, folded, out=out)  # one product, nothing copied
            return out
        for start in range(0, self.n_docs, block):
            rows = np.arange(start, min(start + block, self.n_docs), dtype=np.int64)
            out[start:start + rows.size] = dot_rows(self._rows, rows, folded, bias)
        return out

    def _folded(self, query: np.ndarray) -> tuple[np.ndarray, np.float32]:
        """(the query as the rows' codes are dotted with it, contiguous float32; the bias
        added to each product): for an int8 store, (c + 128) * s + low dotted with q is c
        dotted with q * s, plus q dotted with 128 s + low, no floats materialized per code."""
        query = np.ascontiguousarray(self.check_query(query))
        if self.dtype != "int8":
            return query, np.float32(0.0)
        assert self.scale is not None and self.low is not None
        return (np.ascontiguousarray(query * self.scale, dtype=np.float32),
                np.float32(query @ (128.0 * self.scale + self.low)))

    def dense_top_k(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner-product search over all rows with faiss (a baseline, not the request path).

        Returns (rows int64 (k,), scores float32 (k,)), best first.
        """
        import faiss

        query = self.check_query(query)
        if self._dense_index is None:
            index = faiss.IndexFlatIP(self.dim)
            index.add(self.reconstruct_all())
            self._dense_index = index
        scores, rows = self._dense_index.search(query.reshape(1, -1), min(k, self.n_docs))
        return rows[0], scores[0]

    def reconstruct_all(self) -> np.ndarray:
        """All vectors as float32 (n, d) (dequantized for int8)."""
        return self._dequantize(self.data)

    def grid(self) -> Bounds | None:
        """The int8 codes' per-dimension (low, high), None for a float store: quantized on it
        again (``quantize_int8``), dequantized rows get their codes back unchanged."""
        if self.dtype != "int8":
            return None
        assert self.scale is not None and self.low is not None
        return self.low, (self.low + 255.0 * self.scale).astype(np.float32)

    def reconstruct_rows(self, rows: np.ndarray) -> np.ndarray:
        """Vectors of ``rows`` as float32 (len(rows), d)."""
        return self._dequantize(self.data[rows])

    def _dequantize(self, block: np.ndarray) -> np.ndarray:
        if self.dtype == "int8":
            assert self.scale is not None and self.low is not None
            return (block.astype(np.float32) + 128.0) * self.scale + self.low
        return np.ascontiguousarray(block, dtype=np.float32)
