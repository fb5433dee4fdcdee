"""Base build + delta presented through the interfaces of one build's parts: rows
[0, n_base) are the base's, rows from n_base on are the delta's, in its order.

The request pipeline reads a build only through these (``vectors.scores``/``check_query``,
``dense.search``, ``docs.get``, metadata postings and columns), so it searches base and delta
as one collection: candidates from both, one re-rank, one fusion, exact filters over both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from indexes.ann import ExactDense
from indexes.docstore import DocStore, Document
from indexes.errors import InvalidWriteError
from indexes.metadata import MetadataIndex, keyword_items, parse_date, value_kind
from indexes.vectors import VectorStore


class LiveVectors(VectorStore):
    """The base's stored vectors, then the delta's float32 rows."""

    def __init__(self, base: VectorStore, delta: np.ndarray) -> None:
        # Not VectorStore.__init__: the base may be a sharded build's, with no one matrix.
        self.dtype, self.scale, self.low = base.dtype, base.scale, base.low
        self.base = base
        self.delta = np.ascontiguousarray(delta, dtype=np.float32).reshape(-1, base.dim)
        self.n_base = base.n_docs

    @property
    def n_docs(self) -> int:
        return self.n_base + int(self.delta.shape[0])

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + int(self.delta.nbytes)

    def scores(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        query = self.check_query(query)
        rows = np.asarray(rows)
        in_delta = rows >= self.n_base
        if not in_delta.any():
            return self.base.scores(query, rows)
        out = np.empty(rows.size, dtype=np.float32)
        out[~in_delta] = self.base.scores(query, rows[~in_delta])
        out[in_delta] = np.take(self.delta, rows[in_delta] - self.n_base, axis=0) @ query
        return out

    def reconstruct_all(self) -> np.ndarray:
        return np.concatenate([self.base.reconstruct_all(), self.delta])

    def reconstruct_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.stack([self.delta[r - self.n_base] if r >= self.n_base
                         else self.base.reconstruct_rows(np.asarray([r]))[0] for r in rows])


class LiveDense(ExactDense):
    """The base's dense leg over its live rows, plus exact search over the delta rows."""

    def __init__(self, base: ExactDense, vectors: LiveVectors, alive: np.ndarray | None) -> None:
        super().__init__(vectors)
        self.kind = base.kind
        self.base = base
        self.live_vectors = vectors
        self.alive = alive  # bool (n_base,), None when no base row is replaced

    def describe(self) -> dict[str, Any]:
        return {**self.base.describe(), "delta_rows": int(self.live_vectors.delta.shape[0])}

    def search(self, query: np.ndarray, k: int, mask: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        n_base = self.live_vectors.n_base
        base_mask = self.alive if mask is None else (
            mask[:n_base] if self.alive is None else mask[:n_base] & self.alive)
        rows, scores = self.base.search(query, k, base_mask)
        allowed = (np.arange(self.live_vectors.delta.shape[0]) if mask is None
                   else np.flatnonzero(mask[n_base:]))
        if allowed.size == 0:
            return rows, scores
        query = self.live_vectors.check_query(query)
        delta_scores = np.take(self.live_vectors.delta, allowed, axis=0) @ query
        rows = np.concatenate([np.asarray(rows, np.int64), allowed + n_base])
        scores = np.concatenate([np.asarray(scores, np.float32), delta_scores])
        best = np.lexsort((rows, -scores))[:k]
        return rows[best], scores[best]


class LiveDocs(DocStore):
    """The base's doc store, then the delta's documents."""

    def __init__(self, base: DocStore, delta: Sequence[Document]) -> None:
        self.base = base
        self.delta = list(delta)
        self.n_base = len(base)
        self._row_of = None

    def __len__(self) -> int:
        return self.n_base + len(self.delta)

    def _check(self, row: int) -> int:
        row = int(row)
        if not 0 <= row < len(self):
            raise IndexError(f"doc store row {row} out of range (0..{len(self) - 1})")
        return row

    def doc_id(self, row: int) -> str:
        row = self._check(row)
        return self.base.doc_id(row) if row < self.n_base else self.delta[row - self.n_base].id

    def get(self, row: int) -> Document:
        row = self._check(row)
        return self.base.get(row) if row < self.n_base else self.delta[row - self.n_base]

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        """The base's rows in one call (one trip per shard on a remote layout)."""
        rows = [self._check(r) for r in np.asarray(rows, np.int64).tolist()]
        in_base = [r for r in rows if r < self.n_base]
        found = iter(self.base.get_many(in_base) if in_base else [])
        return [next(found) if r < self.n_base else self.delta[r - self.n_base] for r in rows]

    def row_of(self, doc_id: str) -> int | None:
        if self._row_of is None:
            self._row_of = {d.id: self.n_base + i for i, d in enumerate(self.delta)}
        row = self._row_of.get(doc_id)
        return row if row is not None else self.base.row_of(doc_id)

    def all_ids(self) -> list[str]:
        return self.base.all_ids() + [d.id for d in self.delta]


def live_metadata(base: MetadataIndex, alive: np.ndarray, delta: Sequence[Mapping[str, Any]],
                  kinds: Mapping[str, str]) -> MetadataIndex:
    """Metadata of base rows where ``alive`` plus delta rows after them; replaced base rows
    hold no value (so a positive filter never counts them)."""
    n_base = alive.shape[0]
    keywords = {}
    columns = {}
    for field, kind in kinds.items():
        if kind == "keyword":
            keywords[field] = _keyword_postings(base, field, alive, delta)
        else:
            column = (np.array(base.numeric_column(field), dtype=np.float64)
                      if field in base.kinds else np.full(n_base, np.nan))
            column[~alive] = np.nan
            columns[field] = np.concatenate([column, _delta_column(delta, field, kind)])
    metadata = MetadataIndex(n_base + len(delta), dict(kinds), keywords, columns)  # type: ignore[arg-type]
    if not alive.all():
        metadata.live_rows = np.concatenate([alive, np.ones(len(delta), dtype=bool)])
    return metadata


def _keyword_postings(base: MetadataIndex, field: str, alive: np.ndarray,
                      delta: Sequence[Mapping[str, Any]]
                      ) -> tuple[list[str], np.ndarray, np.ndarray]:
    n_base = alive.shape[0]
    added: dict[str, list[int]] = defaultdict(list)
    for i, record in enumerate(delta):
        value = record.get(field)
        if value is None or value_kind(value) is None:
            continue
        for key in sorted(keyword_items(value)):
            added[key].append(n_base + i)
    base_values, offsets, rows = (base.keyword_postings(field) if field in base.kinds
                                  else ([], np.zeros(1, np.int64), np.empty(0, np.int32)))
    values = sorted(set(base_values) | set(added))
    index = {v: i for i, v in enumerate(values)}
    base_ids = np.repeat(np.asarray([index[v] for v in base_values], dtype=np.int64),
                         np.diff(offsets))
    rows = np.asarray(rows)
    keep = alive[rows]
    delta_ids = np.asarray([index[v] for v, rs in added.items() for _ in rs], dtype=np.int64)
    delta_rows = np.asarray([r for rs in added.values() for r in rs], dtype=np.int32)
    all_ids = np.concatenate([base_ids[keep], delta_ids])
    all_rows = np.concatenate([rows[keep], delta_rows])
    counts = np.bincount(all_ids, minlength=len(values))
    held = np.flatnonzero(counts)
    if held.size < len(values):  # values only deleted or replaced rows held: gone, as rebuilt
        renumber = np.zeros(len(values), dtype=np.int64)
        renumber[held] = np.arange(held.size)
        all_ids, values, counts = renumber[all_ids], [values[i] for i in held], counts[held]
    order = np.argsort(all_ids, kind="stable")  # base rows ascending, delta rows after them
    new_offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    return values, new_offsets, all_rows[order].astype(np.int32)


def _delta_column(delta: Sequence[Mapping[str, Any]], field: str, kind: str) -> np.ndarray:
    column = np.full(len(delta), np.nan, dtype=np.float64)
    for i, record in enumerate(delta):
        value = record.get(field)
        if value is not None and value_kind(value) is not None:
            column[i] = _column_value(value, field, kind)
    return column


def _column_value(value: Any, field: str, kind: str) -> float:
    """A logged value as its ``kind``'s column holds it; a value that is no such thing is an
    ``InvalidWriteError`` (the log cannot be applied on this build), not a bare ValueError
    a caller cannot tell from a bug."""
    try:
        return parse_date(value) if kind == "date" else float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidWriteError(
            f"a logged upsert's metadata field {field!r} holds {value!r}, which is no {kind} "
            f"({exc}), and the build served makes {field!r} a {kind} field: the log's pending "
            "writes cannot be applied on it. Publish a build that makes the field a keyword "
            "field, or roll back to the build they were written for") from exc
