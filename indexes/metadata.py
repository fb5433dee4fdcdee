"""Metadata index: keyword postings per field value, float64 columns for numbers and dates.

Field kinds are inferred at build time from the values seen:

- ``keyword``: strings, booleans (stored as ``"true"``/``"false"``) or lists of them;
  each value maps to the sorted rows holding it.
- ``number``: ints and floats; one float64 column, NaN where a document has no value.
- ``date``: ISO 8601 strings (``2020-01-31`` or a datetime); a float64 column of epoch seconds
  (UTC; naive datetimes are read as UTC).

Nested objects are kept in the doc store but not indexed for filtering.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexes.doc_ids import ID_FIELD, IdRows
from indexes.errors import CorpusError
from indexes.mapping import prefault_mapping
from indexes.mask_cache import MaskCache, scatter_postings
from indexes.packed_strings import StringTable, pack, pack_joined, warm
from indexes.storage import load_array, read_json, save_array, write_json

FieldKind = Literal["keyword", "number", "date"]
# A keyword field with this many values gets a compiled lookup table (``packed_strings``),
# used for IN lists of at least PACKED_LOOKUP values; smaller ones take the dict.
TABLE_FROM_VALUES = 1024
PACKED_LOOKUP = 64
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ][\d:.]+(Z|[+-]\d{2}:?\d{2})?)?$")


def parse_date(value: str) -> float:
    """ISO 8601 date or datetime -> epoch seconds (UTC). Raises ValueError if not ISO."""
    if not _DATE.match(value):
        raise ValueError(f"not an ISO 8601 date: {value!r}")
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(parsed, date) and not isinstance(parsed, datetime):  # pragma: no cover
        parsed = datetime(parsed.year, parsed.month, parsed.day)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def keyword_value(value: Any) -> str:
    """The indexed form of a keyword value (booleans become ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def value_kind(value: Any) -> FieldKind | None:
    """The kind a single value implies; None for values that are stored but not indexed."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "keyword"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "date" if _DATE.match(value) else "keyword"
    if isinstance(value, list) and all(isinstance(v, str | bool) for v in value):
        return "keyword"
    return None  # nested objects and mixed lists: stored, not indexed


def merge_kinds(seen: set[FieldKind]) -> FieldKind | None:
    """The one kind of a field whose values implied ``seen``; None when they conflict."""
    if seen == {"date", "keyword"}:
        return "keyword"  # some strings are not dates: the field is a keyword field
    return next(iter(seen)) if len(seen) == 1 else None


def infer_kinds(records: Sequence[Mapping[str, Any]],
                ids: Sequence[str] | None = None) -> dict[str, FieldKind]:
    """One kind per field; a field holding two kinds is a CorpusError naming it and, when
    ``ids`` (one per record) are given, the first document of each kind."""
    kinds: dict[str, dict[FieldKind, int]] = defaultdict(dict)
    for row, record in enumerate(records):
        if ID_FIELD in record:
            where = f" (document {ids[row]!r})" if ids is not None else ""
            raise CorpusError(f"metadata field {ID_FIELD!r}{where} is reserved: filters on "
                              f"{ID_FIELD!r} match document ids; rename the field")
        for field, value in record.items():
            kind = value_kind(value)
            if kind is not None:
                kinds[field].setdefault(kind, row)
    result: dict[str, FieldKind] = {}
    for field, seen in sorted(kinds.items()):
        merged = merge_kinds(set(seen))
        if merged is None:
            where = ""
            if ids is not None:
                where = " (" + ", ".join(f"{kind} in document {ids[row]!r}"
                                          for kind, row in sorted(seen.items())) + ")"
            raise CorpusError(
                f"metadata field {field!r} mixes {sorted(seen)} values{where}; give every "
                "document the same type for this field (or leave it out)"
            )
        result[field] = merged
    return result


class MetadataIndex:
    """Filterable metadata; ``keyword_rows`` and ``numeric_column`` are the query verbs, and
    ``masks`` remembers evaluated filter masks (``retrieval.filters.evaluate`` fills it)."""

    def __init__(
        self,
        n_docs: int,
        kinds: dict[str, FieldKind],
        keywords: dict[str, tuple[list[str], np.ndarray, np.ndarray]],
        columns: dict[str, np.ndarray],
    ) -> None:
        self.n_docs = n_docs
        self.kinds = kinds
        self._keywords = {f: (values, np.asarray(offsets), np.asarray(rows))
                          for f, (values, offsets, rows) in keywords.items()}
        self._lookup = {
            f: {v: i for i, v in enumerate(vals)} for f, (vals, _, _) in keywords.items()
        }
        # Built (and their kernels loaded) with the index, not on the first large IN list
        # (30-60 ms at 200,000 values).
        self._tables = {f: _table(vals) for f, (vals, _, _) in keywords.items()
                        if len(vals) >= TABLE_FROM_VALUES}
        # Plain ndarray views: numpy ufuncs on an np.memmap pay subclass overhead per call.
        self._columns = {f: np.asarray(c) for f, c in columns.items()}
        # Evaluated filter masks of this build only (the index object is per build).
        self.masks = MaskCache()
        # Rows of each document id (the ``id`` filter), set by the snapshot that owns this.
        self.ids: IdRows | None = None

    @classmethod
    def build(cls, records: Sequence[Mapping[str, Any]],
              ids: Sequence[str] | None = None) -> MetadataIndex:
        kinds = infer_kinds(records, ids)
        keywords = {f: _keyword_postings(records, f) for f, k in kinds.items() if k == "keyword"}
        columns = {f: _column(records, f, k) for f, k in kinds.items() if k != "keyword"}
        return cls(len(records), kinds, keywords, columns)

    def keyword_rows(self, field: str, value: str) -> np.ndarray:
        """Sorted int32 rows whose ``field`` holds ``value`` (empty when none)."""
        values, offsets, rows = self._keywords[field]
        i = self._lookup[field].get(value)
        if i is None:
            return np.empty(0, dtype=np.int32)
        return rows[offsets[i] : offsets[i + 1]]

    def keyword_ids(self, field: str, values: Sequence[str], joined: str | None = None
                    ) -> np.ndarray:
        """int64 (len(values),): each value's index in ``keyword_values(field)``, -1 if absent.
        ``joined``: the values joined by NUL, when the caller has it (it saves a pass over them).

        Many values on a field with many: compiled lookups in the field's ``StringTable`` (~50
        ns a value). Otherwise one C-level pass of dict lookups, ~50 ns a value when the dict is
        in cache but ~500 ns over 200,000 values on a busy machine (the keys are scattered).
        """
        table = self._tables.get(field)
        if table is not None and len(values) >= PACKED_LOOKUP:
            packed = pack(values) if joined is None else pack_joined(joined, len(values))
            if packed is not None:  # else a value holds NUL
                return table.ids(packed)
        lookup = self._lookup[field]
        return np.fromiter(map(lookup.get, values, repeat(-1)), dtype=np.int64,
                           count=len(values))

    def keyword_mask(self, field: str, values: Sequence[str], joined: str | None = None
                     ) -> np.ndarray:
        """bool (n_docs,): rows whose ``field`` holds any of ``values`` (indexed strings;
        ``joined`` as in ``keyword_ids``).

        Linear in the values plus their postings: one lookup per value and one compiled
        scatter of all their posting lists.
        """
        _, offsets, rows = self._keywords[field]
        mask = np.zeros(self.n_docs, dtype=bool)
        scatter_postings(mask, rows, offsets, self.keyword_ids(field, values, joined))
        return mask

    def keyword_postings(self, field: str) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(sorted values, int64 offsets (n_values + 1,), int32 rows): a field's postings."""
        return self._keywords[field]

    def keyword_values(self, field: str) -> list[str]:
        return self._keywords[field][0]

    def value_counts(self, field: str) -> list[tuple[str, int]]:
        """(value, documents holding it) of a keyword field, most common first."""
        values, offsets, _ = self._keywords[field]
        counts = np.diff(offsets)
        order = sorted(range(len(values)), key=lambda i: (-int(counts[i]), values[i]))
        return [(values[i], int(counts[i])) for i in order]

    def numeric_column(self, field: str) -> np.ndarray:
        """float64 column of length n_docs; NaN where the document has no value."""
        return self._columns[field]

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        fields = sorted(self.kinds)
        write_json(directory / "schema.json", {"n_docs": self.n_docs, "fields": {
            f: {"kind": self.kinds[f], "file": f"field{i}"} for i, f in enumerate(fields)}})
        for i, field in enumerate(fields):
            stem = f"field{i}"
            if self.kinds[field] == "keyword":
                values, offsets, rows = self._keywords[field]
                write_json(directory / f"{stem}.values.json", values)
                save_array(directory / f"{stem}.offsets.npy", offsets)
                save_array(directory / f"{stem}.rows.npy", rows)
            else:
                save_array(directory / f"{stem}.column.npy", self._columns[field])

    @classmethod
    def load(cls, directory: Path, mmap: bool = True, prefault: bool = True) -> MetadataIndex:
        """Load a saved index; memory-mapped arrays are prefaulted (``indexes.mapping``) unless
        ``prefault=False``: a filter reads whole columns, so a first-touch fault per page on
        the request path would be paid by the first filters on each field."""
        schema = read_json(directory / "schema.json")
        kinds: dict[str, FieldKind] = {}
        keywords: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = {}
        columns: dict[str, np.ndarray] = {}
        for field, spec in schema["fields"].items():
            kinds[field] = spec["kind"]
            stem = spec["file"]
            if spec["kind"] == "keyword":
                keywords[field] = (
                    read_json(directory / f"{stem}.values.json"),
                    load_array(directory / f"{stem}.offsets.npy", mmap),
                    load_array(directory / f"{stem}.rows.npy", mmap),
                )
            else:
                columns[field] = load_array(directory / f"{stem}.column.npy", mmap)
        if prefault:
            for array in [*columns.values(), *(rows for _, _, rows in keywords.values())]:
                prefault_mapping(array)
        return cls(int(schema["n_docs"]), kinds, keywords, columns)


def _table(values: list[str]) -> StringTable | None:
    try:
        table = StringTable(values)
    except ValueError:  # a value holds NUL: the dict serves this field
        return None
    warm(table)
    return table


def _keyword_postings(
    records: Sequence[Mapping[str, Any]], field: str
) -> tuple[list[str], np.ndarray, np.ndarray]:
    postings: dict[str, list[int]] = defaultdict(list)
    for row, record in enumerate(records):
        value = record.get(field)
        if value is None or value_kind(value) is None:
            continue
        for item in set(value if isinstance(value, list) else [value]):
            postings[keyword_value(item)].append(row)
    values = sorted(postings)
    sizes = np.array([len(postings[v]) for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    rows = np.fromiter((r for v in values for r in postings[v]), dtype=np.int32,
                       count=int(offsets[-1]))
    return values, offsets, rows


def _column(records: Sequence[Mapping[str, Any]], field: str, kind: FieldKind) -> np.ndarray:
    column = np.full(len(records), np.nan, dtype=np.float64)
    for row, record in enumerate(records):
        value = record.get(field)
        if value is None:
            continue
        try:
            column[row] = parse_date(value) if kind == "date" else float(value)
        except (TypeError, ValueError) as exc:
            raise CorpusError(f"document row {row}: field {field!r}: {exc}") from exc
    return column
