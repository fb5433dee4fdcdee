"""Rows of document ids in one searchable snapshot: what the ``id`` filter and fetching
documents by id look up.

A build's map is made on first use from its doc store (one pass over the ids; passages of a
document are contiguous rows, kept as one range), so builds that are never filtered by id
pay nothing. A live snapshot (base build plus log delta) asks its base for the rows still
alive and adds the delta's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from indexes.docstore import DocStore

ID_FIELD = "id"  # the filter field that means the document id (never a metadata field)


class IdRows(Protocol):
    def rows(self, doc_id: str) -> Sequence[int]: ...


class BuildIds:
    """id -> its rows in a build, as (start, stop) of contiguous rows."""

    def __init__(self, docs: DocStore) -> None:
        self._docs = docs
        self._ranges: dict[str, tuple[int, int]] | None = None
        self._lock = threading.Lock()

    def rows(self, doc_id: str) -> Sequence[int]:
        found = self._map().get(doc_id)
        return range(*found) if found is not None else ()

    def _map(self) -> dict[str, tuple[int, int]]:
        if self._ranges is None:
            with self._lock:
                if self._ranges is None:
                    self._ranges = _ranges(self._docs.all_ids())
        return self._ranges


class LiveIds:
    """id -> rows of a live snapshot: the base's rows still alive, then the delta's."""

    def __init__(self, base: IdRows, alive: np.ndarray, delta_ids: Sequence[str]) -> None:
        self._base, self._alive = base, alive
        n_base = alive.shape[0]
        self._delta = {doc_id: range(n_base + start, n_base + stop)
                       for doc_id, (start, stop) in _ranges(delta_ids).items()}

    def rows(self, doc_id: str) -> Sequence[int]:
        delta = self._delta.get(doc_id)
        if delta is not None:
            return delta
        return [row for row in self._base.rows(doc_id) if self._alive[row]]


def id_mask(ids: IdRows, values: Iterable[str], n_rows: int) -> np.ndarray:
    """bool (n_rows,): the rows of any of ``values``."""
    mask = np.zeros(n_rows, dtype=bool)
    for value in values:
        rows = ids.rows(value)
        if isinstance(rows, range):
            mask[rows.start:rows.stop] = True
        elif rows:
            mask[list(rows)] = True
    return mask


def _ranges(ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    start = 0
    for row in range(1, len(ids) + 1):
        if row == len(ids) or ids[row] != ids[start]:
            out[ids[start]] = (start, row)
            start = row
    return out
