"""Metadata index: keyword postings per field value, float64 columns for numbers and dates.

Field kinds are inferred at build time from the values seen:

- ``keyword``: strings, booleans (stored as ``"true"``/``"false"``) or lists of them;
  each value maps to the sorted rows holding it.
- ``number``: ints and floats; one float64 column, NaN where a document has no value.
- ``date``: ISO 8601 strings (``2020-01-31`` or a datetime); a float64 column of epoch seconds
  (UTC; naive datetimes are read as UTC).

Nested objects, and lists holding anything but strings and booleans, are kept in the doc
store but not indexed for filtering, in a field of any kind (NaN in a column).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, repeat
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
# What a top-level metadata value may be: JSON's types (bool is an int) and their subclasses,
# which the JSON encoders write as their base. The build refuses anything else, as a live
# write does: a UUID or a plain Enum was stored by orjson as a string nothing could filter on,
# a datetime or a Decimal refused by the standard encoder mid-build.
JSON_TYPES = (str, int, float, list, tuple, dict, type(None))
# ASCII digits (``\d`` matches any script's: a build refused "２０２０-０１-３１", no ISO 8601 date,
# as a date that does not convert, and a write as a new date field); \Z: not "...\n".
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9:.]+(Z|[+-][0-9]{2}:?[0-9]{2})?)?\Z")


def parse_date(value: str) -> float:
    """ISO 8601 date or datetime -> epoch seconds (UTC). Raises ValueError if not ISO."""
    if not _DATE.match(value):
        raise ValueError(f"not an ISO 8601 date: {value!r}")
    return date_seconds(value)


def date_seconds(value: str) -> float:
    """``parse_date`` of a string known to match the date pattern (a date field's values,
    each matched once when the field's kind was inferred); naive datetimes are UTC."""
    parsed = datetime.fromisoformat(value)  # "Z" included, from Python 3.11
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


EXACT_INTEGERS = 2 ** 53  # float64 holds every integer up to this exactly, not all past it


def inexact_number(value: Any) -> str | None:
    """Why a number field cannot hold ``value`` exactly (an integer float64 rounds, so a
    filter on it would match its neighbours; an infinity no filter can name), or None."""
    if isinstance(value, float) and math.isinf(value):
        return (f"{value} is no number a filter can compare (filters take finite numbers, "
                "and a range would match it); give a finite number or leave the field out")
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or \
            -EXACT_INTEGERS <= value <= EXACT_INTEGERS:
        return None
    try:
        if int(float(value)) == int(value):
            return None
    except OverflowError:
        pass  # past any float: refused for that elsewhere
    return (f"{int(value)} is an integer a number field cannot hold exactly (past 2**53 "
            f"float64 rounds it, and a filter on it would match its neighbours); store it as "
            f"a string to filter on it exactly")


def keyword_value(value: Any) -> str:
    """The indexed form of a keyword value (booleans become ``true``/``false``): a string's
    own characters, as JSON stores it, also for a subclass whose ``str()`` says otherwise
    (``class C(str, Enum)`` gives ``"C.RED"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str.__str__(value) if isinstance(value, str) else str(value)


def refuse_surrogates(texts: Sequence[str], what: str) -> None:
    """``CorpusError`` when a text holds a lone surrogate (half of a UTF-16 pair: JSON's
    "\\ud800" escape reads as one), which no file can store as UTF-8. One join, one encode."""
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise CorpusError(f"{what} {text[:40]!r} holding a lone surrogate "
                                  f"({text[exc.start]!r} at {exc.start}), which is no text; "
                                  "fix the source's escapes") from exc


def keyword_items(value: Any) -> set[str]:
    """The indexed values of one row's keyword value: a list's distinct items (null items
    skipped; ``True`` and ``"true"`` are one value), or the value itself."""
    items = value if isinstance(value, list | tuple) else (value,)
    return {keyword_value(item) for item in items if item is not None}


def value_kind(value: Any) -> FieldKind | None:
    """The kind a single value implies; None for values that are stored but not indexed."""
    if isinstance(value, str):
        return "date" if _DATE.match(value) else "keyword"
    if empty_list(value):  # no value: a date or number field may hold one too
        return None
    if isinstance(value, list | tuple):  # JSON stores a tuple as a list; null items skipped
        return "keyword" if all(isinstance(v, str | bool) or v is None for v in value) else None
    return type_kind(type(value))


def empty_list(value: Any) -> bool:
    """A list that holds no value (empty, or only nulls)."""
    return isinstance(value, list | tuple) and all(item is None for item in value)


def type_kind(value_type: type) -> FieldKind | None:
    """The kind every value of ``value_type`` implies, for types other than ``str`` and
    ``list`` (whose values decide): None for None, nested objects and other types."""
    if issubclass(value_type, bool):
        return "keyword"
    if issubclass(value_type, int | float):
        return "number"
    return None


def merge_kinds(seen: set[FieldKind]) -> FieldKind | None:
    """The one kind of a field whose values implied ``seen``; None when they conflict."""
    if seen == {"date", "keyword"}:
        return "keyword"  # some strings are not dates: the field is a keyword field
    return next(iter(seen)) if len(seen) == 1 else None


def infer_kinds(records: Sequence[Mapping[str, Any]],
                ids: Sequence[str] | None = None) -> dict[str, FieldKind]:
    """One kind per field; a field holding two kinds is a CorpusError naming it and, when
    ``ids`` (one per record) are given, the first document of each kind."""
    columns = field_columns(records)
    kinds = kinds_of(columns, records, ids)
    return {**kinds, **dict.fromkeys(listed_only(columns, kinds), "keyword")}


def field_columns(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Each field's values, one per record (None where a record lacks it): the build reads a
    field's values column by column, not record by record."""
    fields = dict.fromkeys(chain.from_iterable(records))
    return {field: [record.get(field) for record in records] for field in fields}


def kinds_of(columns: Mapping[str, list[Any]], records: Sequence[Mapping[str, Any]],
             ids: Sequence[str] | None) -> dict[str, FieldKind]:
    """``infer_kinds`` of the records whose ``field_columns`` are ``columns``."""
    if ID_FIELD in columns:
        row = next(i for i, record in enumerate(records) if ID_FIELD in record)
        where = f" (document {ids[row]!r})" if ids is not None else ""
        raise CorpusError(f"metadata field {ID_FIELD!r}{where} is reserved: filters on "
                          f"{ID_FIELD!r} match document ids; rename the field")
    named = next((f for f in columns if not isinstance(f, str)), None)
    if named is not None:
        row = next(i for i, record in enumerate(records) if named in record)
        where = f" in document {ids[row]!r}" if ids is not None else ""
        raise CorpusError(f"metadata field name {named!r}{where} is a "
                          f"{type(named).__name__}; name every field with a string")
    result: dict[str, FieldKind] = {}
    for field in sorted(columns):
        types = set(map(type, columns[field]))
        if not all(issubclass(value_type, JSON_TYPES) for value_type in types):
            raise not_json(field, columns[field], ids)
        seen = column_kinds(columns[field], types)
        if not seen:
            continue
        merged = merge_kinds(seen)
        if merged is None:
            raise mixed_kinds(field, columns[field], ids)
        result[field] = merged
    return result


def column_kinds(column: list[Any], types: set[type]) -> set[FieldKind]:
    """The kinds a field's values (of ``types``) imply: by type, except strings (dates if
    every distinct one matches the date pattern, else keywords: the match stops at the first
    that does not) and lists (each one looked at; an empty one implies none: ``listed_only``)."""
    kinds: set[FieldKind | None] = set()
    for value_type in types:
        if issubclass(value_type, str):
            strings = {v for v in column if type(v) is value_type}
            kinds.add("date" if all(map(_DATE.match, strings)) else "keyword")
        elif issubclass(value_type, list | tuple):
            kinds.update(value_kind(v) for v in column if type(v) is value_type)
        else:
            kinds.add(type_kind(value_type))
    return {kind for kind in kinds if kind is not None}


def listed_only(columns: Mapping[str, list[Any]], kinds: Mapping[str, str]) -> list[str]:
    """Fields of no kind that hold an empty list: keyword fields (of tags yet to come), once
    nothing else gives them a kind (a kept kind, or in a streamed build another shard's)."""
    return [field for field, column in columns.items()
            if field not in kinds and any(map(empty_list, column))]


def kept_kinds(inferred: Mapping[str, FieldKind], kept: Mapping[str, str]
               ) -> dict[str, FieldKind]:
    """``inferred`` with the ``kept`` kinds over it: a field whose values are all gone keeps
    its kind, and one of dates whose other strings are gone stays a keyword field. Refuses a
    field whose values a kept kind cannot hold (a number in a keyword field)."""
    kinds = dict(inferred)
    for field, kind in kept.items():
        seen = inferred.get(field)
        if seen is not None and merge_kinds({seen, kind}) != kind:  # type: ignore[arg-type]
            raise CorpusError(f"metadata field {field!r} is a {kind} field, and its values "
                              f"are {seen} values; give {kind} values (or rebuild the index "
                              "from its source to change the field's type)")
        kinds[field] = kind  # type: ignore[assignment]
    return kinds


def not_json(field: str, column: list[Any], ids: Sequence[str] | None) -> CorpusError:
    """The error for a field holding a value JSON has no type for, naming the first one."""
    row, value = next((row, v) for row, v in enumerate(column)
                      if not isinstance(v, JSON_TYPES))
    where = f" in document {ids[row]!r}" if ids is not None else ""
    return CorpusError(f"metadata field {field!r} holds a {type(value).__name__} ({value!r})"
                       f"{where}, which JSON has no type for; give strings, numbers, booleans, "
                       "lists or objects (str(value) for a UUID, .value for an Enum, .isoformat() "
                       "for a date, .item() for a numpy scalar)")


def mixed_kinds(field: str, column: list[Any], ids: Sequence[str] | None) -> CorpusError:
    """The error for a field whose values imply kinds that do not merge, naming the first
    document of each kind."""
    first: dict[FieldKind, int] = {}
    for row, value in enumerate(column):
        kind = value_kind(value)
        if kind is not None:
            first.setdefault(kind, row)
    where = ""
    if ids is not None:
        where = " (" + ", ".join(f"{kind} in document {ids[row]!r}"
                                  for kind, row in sorted(first.items())) + ")"
    return CorpusError(f"metadata field {field!r} mixes {sorted(first)} values{where}; give "
                       "every document the same type for this field (or leave it out)")


@dataclass(frozen=True)
class CollectionFields:
    """A collection's metadata fields, for its shards built apart (``indexes.shard_build``):
    each field's kind and each keyword field's sorted values."""

    kinds: dict[str, FieldKind]
    values: dict[str, list[str]]


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
        # Rows that serve (a live snapshot's replaced base rows do not; None: every row), so
        # a negation (ne, nin, exists: false) never counts a row that holds no value because
        # it is gone.
        self.live_rows: np.ndarray | None = None

    @classmethod
    def build(cls, records: Sequence[Mapping[str, Any]], ids: Sequence[str] | None = None,
              collection: CollectionFields | None = None,
              kept: Mapping[str, str] | None = None) -> MetadataIndex:
        """The index of ``records``; with ``collection`` (a shard of a streamed build), the
        collection's fields and keyword values, as ``indexes.sharding.slice_metadata`` keeps
        them: a field the records lack is all missing, a value they lack has no rows.
        ``kept``: field kinds that stay whatever the records' values imply alone (a
        compaction keeps the schema it served), each one their kind merges into."""
        values = field_columns(records)
        kinds = kinds_of(values, records, ids)
        if collection is None:  # a streamed shard's fields are its collection's
            kinds = kept_kinds(kinds, kept or {})
            kinds.update(dict.fromkeys(listed_only(values, kinds), "keyword"))
            collection = CollectionFields(kinds, {})
        kinds = dict(collection.kinds)
        values = {f: values.get(f) or [None] * len(records) for f in kinds}
        known = collection.values
        keywords = {f: _keyword_postings(values[f], known.get(f))
                    for f, k in kinds.items() if k == "keyword"}
        for field, (distinct, _, _) in keywords.items():
            refuse_surrogates(distinct, f"metadata field {field!r} holds a value")
        columns = {f: _column(values[f], f, k) for f, k in kinds.items() if k != "keyword"}
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

    @property
    def n_live(self) -> int:
        """Documents a search can find: ``n_docs`` less a live view's deleted and replaced
        rows (``live_rows``)."""
        return self.n_docs if self.live_rows is None else int(np.count_nonzero(self.live_rows))

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


def keyword_pairs(column: list[Any]) -> tuple[list[int], list[str]]:
    """(row, indexed value) of every value of a keyword field's ``column``, in row order (a
    list's repeated items once)."""
    if set(map(type, column)) == {str}:  # one string a row: the column is its own pairs
        return list(range(len(column))), column
    rows: list[int] = []
    keys: list[str] = []
    for row, value in enumerate(column):
        if type(value) is str:  # the common case, and its own indexed form
            rows.append(row)
            keys.append(value)
        elif value is not None and value_kind(value) is not None:
            for key in keyword_items(value):
                rows.append(row)
                keys.append(key)
    return rows, keys


def _keyword_postings(column: list[Any], values: list[str] | None = None
                      ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(sorted values, offsets, int32 rows in row order per value) of a keyword field's
    ``column``: every (row, value) pair listed, then ordered by value with one stable sort.
    ``values``: the sorted values to number by (default: the column's own)."""
    rows, keys = keyword_pairs(column)
    values = sorted(set(keys)) if values is None else values
    number = {value: i for i, value in enumerate(values)}
    ids = np.fromiter(map(number.__getitem__, keys), dtype=np.int64, count=len(keys))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.bincount(ids, minlength=len(values)), out=offsets[1:])
    ordered = np.asarray(rows, dtype=np.int32)[np.argsort(ids, kind="stable")]
    return values, offsets, ordered


def _column(column: list[Any], field: str, kind: FieldKind) -> np.ndarray:
    """A number or date field's float64 column; NaN where a row has no value, or one of no
    filterable kind (a nested object, a list holding non-strings): stored, not indexed, as a
    keyword field and a live write's delta treat it."""
    fast = date_seconds if kind == "date" else float
    try:
        values = np.array([np.nan if value is None else fast(value) for value in column],
                          dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        if any(value is not None and value_kind(value) is None for value in column):
            return _column([None if value_kind(value) is None else value for value in column],
                           field, kind)
    else:
        if kind == "number":
            for at in np.flatnonzero(np.abs(values) >= EXACT_INTEGERS):  # rare: checked alone
                why = inexact_number(column[at])
                if why is not None:
                    raise CorpusError(f"document row {at}: field {field!r}: {why}")
        return values
    convert = parse_date if kind == "date" else float
    for row, value in enumerate(column):  # name the first value that does not convert
        try:
            if value is not None:
                convert(value)
        except (TypeError, ValueError, OverflowError) as exc:  # 10**400 has no float
            raise CorpusError(f"document row {row}: field {field!r}: {exc}") from exc
    raise AssertionError("unreachable: a value failed to convert once")  # pragma: no cover
