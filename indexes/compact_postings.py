"""Compact BM25 postings: about 2.5 bytes a posting instead of 8, scores unchanged.

The plain format stores each posting's row (int32) and impact (float32). This one stores what
the impact is computed from, and computes it when a query reads the posting:

- ``row_bytes.npy`` uint8: each term's rows as LEB128 varints, the first row itself, then the
  gaps to the next (rows ascend within a term); ``row_offsets.npy`` int64 (n_terms + 1,):
  where each term's bytes start;
- ``tf.npy`` uint8 (nnz,): term frequencies; 255 marks one of 255 or more, whose value is in
  ``tf_exceptions.npy`` int64 (m, 2) (posting, tf), sorted by posting;
- ``idf.npy`` float64 (n_terms,) and ``norms.npy`` float64 (n_docs,): the collection's idf and
  each row's ``k1 * (1 - b + b * length / avgdl)`` (a shard's use the whole collection's N, df
  and avgdl, as its plain impacts do);
- ``term_max.npy`` float32 (n_terms,) (MaxScore's bounds) and the terms holding a non-positive
  impact in ``compact.json``.

An impact is ``float32(idf * numerator / (tf + norm))``, the float64 operations of
``analysis_kernels.bm25_impacts`` in the same order: the plain format's impact, bit for bit, so
every score and tie is the same (tests/test_compact_postings.py). A query gathers its terms'
postings into plain arrays (``gather``: varint decoding and one division a posting; a large
query searched alone decodes its terms on every core) and the usual kernels run over them,
numbered by the query's own terms; ``BM25Index.postings_of`` keeps a thread's last gather for
the same search's dense rows. Everything is memory-mapped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from indexes.cpu import usable_cores
from indexes.fan_out import THREADS_FROM_POSTINGS, each_part, fans_out
from indexes.storage import load_array, read_json, save_array, write_json

TF_ESCAPE = 255


@njit(nogil=True, cache=True)
def _varint_sizes(indptr, rows):  # pragma: no cover - compiled
    """Bytes each term's rows take as varints: int64 (n_terms + 1,) offsets."""
    offsets = np.zeros(indptr.shape[0], dtype=np.int64)
    for t in range(indptr.shape[0] - 1):
        previous = 0
        size = 0
        for p in range(indptr[t], indptr[t + 1]):
            gap = rows[p] - previous
            previous = rows[p]
            size += 1
            while gap >= 128:
                gap >>= 7
                size += 1
        offsets[t + 1] = offsets[t] + size
    return offsets


@njit(nogil=True, cache=True)
def _encode_rows(indptr, rows, offsets):  # pragma: no cover - compiled
    out = np.empty(offsets[-1], dtype=np.uint8)
    for t in range(indptr.shape[0] - 1):
        at = offsets[t]
        previous = 0
        for p in range(indptr[t], indptr[t + 1]):
            gap = rows[p] - previous
            previous = rows[p]
            while gap >= 128:
                out[at] = np.uint8((gap & 127) | 128)
                gap >>= 7
                at += 1
            out[at] = np.uint8(gap)
            at += 1
    return out


@njit(nogil=True, cache=True)
def gathered_indptr(indptr, term_ids):  # pragma: no cover - compiled
    """int64 (q + 1,): where each query term's postings start in the gathered arrays."""
    q = term_ids.shape[0]
    out_indptr = np.zeros(q + 1, dtype=np.int64)
    for i in range(q):
        t = term_ids[i]
        out_indptr[i + 1] = out_indptr[i] + indptr[t + 1] - indptr[t]
    return out_indptr


@njit(nogil=True, cache=True)
def gather_terms(row_offsets, row_bytes, indptr, tf, tf_exceptions, idf, norms, k1, okapi,
                 term_ids, which, out_indptr, rows, impacts):  # pragma: no cover - compiled
    """Decode the postings of query terms ``which`` (int64 indices into ``term_ids``) into
    their slices of ``rows`` int32 and ``impacts`` float32 (``out_indptr``'s): terms write
    disjoint slices, so calls for different terms run at once."""
    for i in which:
        t = term_ids[i]
        w = idf[t]
        at = row_offsets[t]
        row = 0
        o = out_indptr[i]
        for p in range(indptr[t], indptr[t + 1]):
            gap = 0
            shift = 0
            while True:
                byte = row_bytes[at]
                at += 1
                gap |= np.int64(byte & 127) << shift
                if byte < 128:
                    break
                shift += 7
            row += gap
            f = np.float64(tf[p])
            if tf[p] == TF_ESCAPE:
                f = np.float64(_exception(tf_exceptions, p))
            numerator = f * (k1 + 1.0) if okapi else f
            rows[o] = row
            impacts[o] = np.float32(w * numerator / (f + norms[row]))
            o += 1


def term_parts(lengths: np.ndarray, parts: int) -> list[np.ndarray]:
    """The query terms (indices) split into at most ``parts`` groups of about equal postings:
    longest first, each to the group holding the fewest so far."""
    if parts == 1:  # a query decoded in its thread: no assignment to make
        return [np.arange(lengths.size, dtype=np.int64)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in np.argsort(-lengths, kind="stable").tolist():
        least = loads.index(min(loads))
        groups[least].append(i)
        loads[least] += int(lengths[i])
    return [np.array(sorted(g), dtype=np.int64) for g in groups if g]


@njit(nogil=True, cache=True)
def _exception(tf_exceptions, p):  # pragma: no cover - compiled
    lo, hi = 0, tf_exceptions.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if tf_exceptions[mid, 0] < p:
            lo = mid + 1
        else:
            hi = mid
    return tf_exceptions[lo, 1]


@dataclass(frozen=True)
class CompactPostings:
    """The compact arrays of one index (see the module doc)."""

    row_offsets: np.ndarray
    row_bytes: np.ndarray
    tf: np.ndarray
    tf_exceptions: np.ndarray
    idf: np.ndarray
    norms: np.ndarray
    term_max: np.ndarray
    nonpositive: frozenset[int]
    k1: float
    okapi: bool

    @classmethod
    def encode(cls, indptr: np.ndarray, rows: np.ndarray, tfs: np.ndarray, idf: np.ndarray,
               norms: np.ndarray, term_max: np.ndarray, nonpositive: frozenset[int], k1: float,
               okapi: bool) -> CompactPostings:
        """From plain postings grouped by term (rows int32 ascending within a term, tfs int32
        aligned with them)."""
        offsets = _varint_sizes(indptr, rows)
        wide = np.flatnonzero(tfs >= TF_ESCAPE)
        exceptions = np.stack([wide, tfs[wide].astype(np.int64)], axis=1)
        return cls(offsets, _encode_rows(indptr, rows, offsets),
                   np.minimum(tfs, TF_ESCAPE).astype(np.uint8), exceptions, idf, norms,
                   term_max, nonpositive, k1, okapi)

    def gather(self, indptr: np.ndarray, term_ids: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The postings of ``term_ids`` int64 (q,) as plain arrays: (indptr int64 (q + 1,),
        rows int32, impacts float32), term i of the query being term i of the result. A large
        query searched alone (``indexes.fan_out``) decodes its terms on every core."""
        out_indptr = gathered_indptr(indptr, term_ids)
        total = int(out_indptr[-1])
        rows = np.empty(total, dtype=np.int32)
        impacts = np.empty(total, dtype=np.float32)
        lengths = np.diff(out_indptr)
        parallel = total >= THREADS_FROM_POSTINGS and fans_out()
        parts = term_parts(lengths, usable_cores() if parallel else 1)
        each_part([functools.partial(
            gather_terms, self.row_offsets, self.row_bytes, indptr, self.tf, self.tf_exceptions,
            self.idf, self.norms, self.k1, self.okapi, term_ids, part, out_indptr, rows,
            impacts) for part in parts], parallel)
        return out_indptr, rows, impacts

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.row_offsets, self.row_bytes, self.tf,
                                           self.tf_exceptions, self.idf, self.norms,
                                           self.term_max))

    def save(self, directory: Path) -> None:
        for name in ("row_offsets", "row_bytes", "tf", "tf_exceptions", "idf", "norms",
                     "term_max"):
            save_array(directory / f"{name}.npy", getattr(self, name))
        write_json(directory / "compact.json", {"nonpositive": sorted(self.nonpositive),
                                                "k1": self.k1, "okapi": self.okapi})

    @classmethod
    def load(cls, directory: Path, mmap: bool) -> CompactPostings | None:
        """The compact postings saved in ``directory``; None for the plain format."""
        if not (directory / "compact.json").is_file():
            return None
        meta = read_json(directory / "compact.json")
        arrays = {name: load_array(directory / f"{name}.npy", mmap)
                  for name in ("row_offsets", "row_bytes", "tf", "tf_exceptions", "idf",
                               "norms", "term_max")}
        return cls(**arrays, nonpositive=frozenset(meta["nonpositive"]), k1=meta["k1"],
                   okapi=meta["okapi"])
