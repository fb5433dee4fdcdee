"""Doc store: external ids, titles, texts and metadata, row-aligned with every other index.

Each text column is one UTF-8 blob plus int64 offsets, so hydrating a hit is two slices of a
memory map, and nothing is pickled.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexes.errors import CorruptArtifactError
from indexes.storage import load_array, save_array

COLUMNS = ("doc_id", "title", "text", "metadata")


@dataclass(frozen=True)
class Document:
    """One input document; ``metadata`` values are filterable when scalar or lists of scalars."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def content(self) -> str:
        """The text that is indexed and embedded: title and body."""
        return f"{self.title} {self.text}".strip()


def _pack(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return blob, offsets


class DocStore:
    """Columns of strings by row; ``get`` is the query verb."""

    def __init__(self, columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self._columns = columns
        self._row_of: dict[str, int] | None = None

    @classmethod
    def build(cls, documents: Sequence[Document]) -> DocStore:
        values = {
            "doc_id": [d.id for d in documents],
            "title": [d.title for d in documents],
            "text": [d.text for d in documents],
            "metadata": [json.dumps(d.metadata, ensure_ascii=False, sort_keys=True)
                         for d in documents],
        }
        return cls({name: _pack(column) for name, column in values.items()})

    def __len__(self) -> int:
        return int(self._columns["doc_id"][1].shape[0] - 1)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, (blob, offsets) in self._columns.items():
            save_array(directory / f"{name}.bin.npy", blob)
            save_array(directory / f"{name}.offsets.npy", offsets)

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> DocStore:
        return cls({
            name: (
                load_array(directory / f"{name}.bin.npy", mmap),
                load_array(directory / f"{name}.offsets.npy", mmap),
            )
            for name in COLUMNS
        })

    def _string(self, column: str, row: int) -> str:
        blob, offsets = self._columns[column]
        start, end = int(offsets[row]), int(offsets[row + 1])
        return bytes(blob[start:end]).decode("utf-8")

    def doc_id(self, row: int) -> str:
        return self._string("doc_id", row)

    def get(self, row: int) -> Document:
        try:
            metadata = json.loads(self._string("metadata", row))
        except ValueError as exc:
            raise CorruptArtifactError(f"doc store metadata for row {row} is unreadable") from exc
        return Document(
            id=self.doc_id(row),
            title=self._string("title", row),
            text=self._string("text", row),
            metadata=metadata,
        )

    def row_of(self, doc_id: str) -> int | None:
        """Row of an external id (the mapping is built on first use)."""
        if self._row_of is None:
            self._row_of = {self.doc_id(r): r for r in range(len(self))}
        return self._row_of.get(doc_id)

    def all_ids(self) -> list[str]:
        return [self.doc_id(r) for r in range(len(self))]
