"""Doc store: external ids, titles, texts and metadata, row-aligned with every other index.

Each text column is one UTF-8 blob plus int64 offsets, so hydrating a hit is two slices of a
memory map, and nothing is pickled.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from indexes.errors import CorpusError, CorruptArtifactError
from indexes.mapping import prefault_mapping
from indexes.storage import load_array, save_array

COLUMNS = ("doc_id", "title", "text", "metadata")
# One encoder for every row: json.dumps with options builds a new one per call, which was
# most of packing a million documents' metadata.
METADATA_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True)
# orjson encodes a row ~8x faster than the standard encoder (2.6 s of a 1M-passage build).
# Subclasses, datetimes and dataclasses are passed to its (absent) default, so they raise and
# go to the standard encoder's rules, as do non-string keys and integers past 64 bits.
ORJSON_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS
                  | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS)


def metadata_json(metadata: dict[str, Any]) -> bytes:
    """A document's metadata as stored: UTF-8 JSON, keys sorted, that ``json.loads`` reads
    back as the standard encoder's output reads (orjson's, spaced tighter, where the two
    agree; the standard encoder's otherwise). One difference is kept: a ``uuid.UUID`` or a
    plain ``enum.Enum`` nested in a list or an object, which the standard encoder refuses, is
    stored as orjson writes it (its string, its value); orjson has no option to refuse them,
    and looking for them in every row would cost what orjson saves. At the top level the
    build refuses them first (``indexes.metadata.JSON_TYPES``), from the field's value types
    it reads anyway."""
    try:
        encoded = orjson.dumps(metadata, option=ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is one
        try:
            return METADATA_JSON.encode(metadata).encode("utf-8")
        except (TypeError, ValueError) as exc:  # nested: the top level was checked
            raise CorpusError(f"metadata {str(metadata)[:80]} holds a value JSON has no type "
                              f"for ({exc}); give strings, numbers, booleans, lists or objects "
                              "(.isoformat() for a date, str(value) for a Decimal)") from exc
    # orjson writes NaN and the infinities as null, where the standard encoder keeps them.
    return METADATA_JSON.encode(metadata).encode("utf-8") if b"null" in encoded else encoded


@dataclass(frozen=True)
class Document:
    """One input document; ``metadata`` values are filterable when strings, numbers, booleans,
    dates (ISO 8601 strings) or lists of strings and booleans (null items skipped)."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def content(self) -> str:
        """The text that is indexed and embedded: title and body."""
        return f"{self.title} {self.text}".strip()


# Strings encoded per chunk when packing a column: the peak is the blob plus one chunk's bytes,
# where encoding every string first held each column twice (the text column is 0.54 GB at 1M
# passages of 100 words).
PACK_CHUNK = 65_536
# Documents whose metadata is encoded at once (``pack_metadata``).
ENCODE_CHUNK = 4_096


def pack_strings(values: Sequence[str], chunk: int = PACK_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """One column as a UTF-8 blob uint8 and int64 offsets (n + 1,): string i is
    ``blob[offsets[i]:offsets[i + 1]]``."""
    # An ASCII string's byte length is its length; isascii() reads a flag, encodes nothing.
    lengths = np.fromiter((len(v) if v.isascii() else len(v.encode("utf-8")) for v in values),
                          dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.empty(int(offsets[-1]), dtype=np.uint8)
    for start in range(0, len(values), chunk):
        stop = min(start + chunk, len(values))
        encoded = "".join(values[start:stop]).encode("utf-8")
        blob[offsets[start]:offsets[stop]] = np.frombuffer(encoded, dtype=np.uint8)
    return blob, offsets


def pack_metadata(documents: Sequence[Document], chunk: int = ENCODE_CHUNK
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The metadata column packed as ``pack_strings`` packs a column: ``metadata_json`` of
    ``chunk`` documents at a time, joined before the next chunk is encoded. orjson's output
    is a bytes object of at least a page that malloc does not give back whole: 1M of them
    held at once touched a new page each (1M page faults, 4-7 s of kernel time at 1M
    passages); joined by chunks, the next chunk's reuse the pages freed."""
    lengths = np.zeros(len(documents), dtype=np.int64)
    blob = bytearray()
    for start in range(0, len(documents), chunk):
        encoded = [metadata_json(d.metadata) for d in documents[start:start + chunk]]
        lengths[start:start + len(encoded)] = np.fromiter(map(len, encoded), dtype=np.int64,
                                                          count=len(encoded))
        blob += b"".join(encoded)
    offsets = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(blob, dtype=np.uint8), offsets


class _Column:
    """One string column read through memoryviews: indexing an int64 memoryview gives a
    Python int and slicing a byte memoryview copies nothing, where numpy (and np.memmap in
    particular) builds an object per scalar and per slice."""

    __slots__ = ("blob", "offsets")

    def __init__(self, blob: np.ndarray, offsets: np.ndarray) -> None:
        self.blob = np.ascontiguousarray(blob, dtype=np.uint8).data.cast("B")
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64).data.cast("B").cast("q")

    def __getitem__(self, row: int) -> str:
        return str(self.blob[self.offsets[row] : self.offsets[row + 1]], "utf-8")


class DocStore:
    """Columns of strings by row; ``get`` is the query verb."""

    def __init__(self, columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self._columns = columns
        self._doc_id, self._title, self._text, self._metadata = (
            _Column(*columns[name]) for name in COLUMNS)
        self._n = len(self._doc_id.offsets) - 1
        self._row_of: dict[str, int] | None = None

    @classmethod
    def build(cls, documents: Sequence[Document]) -> DocStore:
        # Column by column, so one column's strings are alive at a time.
        return cls({
            "doc_id": pack_strings([d.id for d in documents]),
            "title": pack_strings([d.title for d in documents]),
            "text": pack_strings([d.text for d in documents]),
            "metadata": pack_metadata(documents),
        })

    def __len__(self) -> int:
        return self._n

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, (blob, offsets) in self._columns.items():
            save_array(directory / f"{name}.bin.npy", blob)
            save_array(directory / f"{name}.offsets.npy", offsets)

    @classmethod
    def load(cls, directory: Path, mmap: bool = True, prefault: bool = True) -> DocStore:
        """Load the columns; memory-mapped ones are prefaulted unless ``prefault=False``: a
        hit reads ~6 scattered pages, and first-touch faults made hydrating 10 hits at 1M
        documents 0.16-0.69 ms at p95 instead of 0.07 (the prefault costs ~40 ms at load)."""
        columns = {
            name: (
                load_array(directory / f"{name}.bin.npy", mmap),
                load_array(directory / f"{name}.offsets.npy", mmap),
            )
            for name in COLUMNS
        }
        if prefault:
            for blob, offsets in columns.values():
                prefault_mapping(blob)
                prefault_mapping(offsets)
        return cls(columns)

    def _row(self, row: int) -> int:
        # Row n would read offsets[n + 1] past the end, and a negative row would count from
        # the end: refuse both, naming the range.
        row = operator.index(row)
        if not 0 <= row < self._n:
            raise IndexError(f"doc store row {row} out of range (0..{self._n - 1})")
        return row

    def doc_id(self, row: int) -> str:
        return self._doc_id[self._row(row)]

    def get(self, row: int) -> Document:
        row = self._row(row)
        try:
            metadata = json.loads(self._metadata[row])
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            raise CorruptArtifactError(f"doc store metadata for row {row} is unreadable") from exc
        return Document(id=self._doc_id[row], title=self._title[row], text=self._text[row],
                        metadata=metadata)

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        """The documents of ``rows``, in order (one call for a whole hit list)."""
        return [self.get(int(row)) for row in np.asarray(rows).tolist()]

    def row_of(self, doc_id: str) -> int | None:
        """Row of an external id (the mapping is built on first use)."""
        if self._row_of is None:
            self._row_of = {self.doc_id(r): r for r in range(len(self))}
        return self._row_of.get(doc_id)

    def all_ids(self) -> list[str]:
        return [self.doc_id(r) for r in range(len(self))]
