"""Offline feature sources: Parquet, CSV, JSONL files and Python callables.

Every source yields Arrow tables of at most ``batch_rows`` rows, so a nightly table larger than
memory streams through ``materialize``. Column checks happen before any data is written (the
first chunk is checked before a snapshot is begun) and again for every chunk, because text
formats and Python rows can change type half-way.
"""

from __future__ import annotations

import csv
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from indexes.corpus import RepeatedKey, distinct_keys
from retrieval.features.errors import FeatureSchemaError, FeatureSourceError
from retrieval.features.offline.convert import ARROW_TYPES, EXPECTED, check_schema
from retrieval.features.view import FeatureView

# Rows of a JSONL file whose keys together name its columns (a file is not read twice whole).
SURVEYED_ROWS = 1000
_CSV_COLUMN = re.compile(r"CSV column #(\d+)")
_JSON_COLUMN = re.compile(r"Column\(/([^)]*)\)")
_JSON_REPEATED = "was specified twice"  # pyarrow's words for a key repeated in a row
_DISTINCT_KEYS = json.JSONDecoder(object_pairs_hook=distinct_keys)


class FeatureSource(ABC):
    """A table of rows with an entity column, feature columns and an optional timestamp."""

    name: str = "source"

    def num_rows(self) -> int | None:
        """Row count when cheap to know (progress bars), else None."""
        return None

    @abstractmethod
    def tables(self, view: FeatureView, batch_rows: int) -> Iterator[pa.Table]:
        """Chunks of the view's columns (extra columns may be present)."""


def _columns(view: FeatureView, available: Iterable[str], source: str) -> list[str]:
    """The columns to read: entity, features, and the timestamp when the source has it;
    ``source`` names the source in the error for a missing or a repeated column."""
    names = list(available)
    present = set(names)
    wanted = [view.entity_key, *view.feature_names]
    missing = [column for column in wanted if column not in present]
    if missing:  # check_schema words the error; reuse it with a schema of the names present
        check_schema(view, pa.schema([(name, pa.null()) for name in present]), source)
    if view.timestamp_field in present:
        wanted.append(view.timestamp_field)
    _check_distinct(wanted, names, source)
    return wanted


def _check_distinct(wanted: Iterable[str], names: list[str], source: str) -> None:
    """No column the view reads is named twice: pyarrow reads one of them (a CSV's first, a
    Parquet file's last) and the other's values were lost silently. A repeated column the view
    does not read is left alone, as the corpus readers leave a dropped one."""
    for column in wanted:
        positions = [str(i) for i, name in enumerate(names, start=1) if name == column]
        if len(positions) > 1:
            raise FeatureSchemaError(
                f"source {source}: columns {', '.join(positions[:-1])} and {positions[-1]} are "
                f"named {column!r}, and only one of them would be read: rename the columns so "
                "each name is distinct",
                column,
            )


def _missing_file(path: Path) -> FeatureSourceError:
    return FeatureSourceError(f"feature source {str(path)!r} does not exist or is not a file")


class ParquetSource(FeatureSource):
    """A Parquet file read in row batches (only the needed columns)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"{str(self.path)!r}"

    def _file(self) -> pq.ParquetFile:
        if not self.path.is_file():
            raise _missing_file(self.path)
        try:
            return pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            raise FeatureSourceError(f"cannot read Parquet file {self.name}: {exc}") from exc

    def num_rows(self) -> int | None:
        try:
            return int(self._file().metadata.num_rows)
        except FeatureSourceError:
            return None

    def tables(self, view: FeatureView, batch_rows: int) -> Iterator[pa.Table]:
        parquet = self._file()
        columns = _columns(view, parquet.schema_arrow.names, self.name)
        check_schema(view, parquet.schema_arrow, self.name)  # types are known before any read
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            yield pa.Table.from_batches([batch])


class CsvSource(FeatureSource):
    """A CSV file with a header row, streamed by pyarrow with the view's column types."""

    def __init__(self, path: str | Path, delimiter: str = ",") -> None:
        self.path = Path(path)
        self.delimiter = delimiter
        self.name = f"{str(self.path)!r}"

    def _header(self) -> list[str]:
        if not self.path.is_file():
            raise _missing_file(self.path)
        with self.path.open(newline="", encoding="utf-8-sig") as handle:  # Excel's BOM too
            header = next(csv.reader(handle, delimiter=self.delimiter), None)
        if not header:
            raise FeatureSourceError(f"CSV file {self.name} is empty (no header row)")
        return header

    def tables(self, view: FeatureView, batch_rows: int) -> Iterator[pa.Table]:
        header = self._header()
        columns = _columns(view, header, self.name)
        # Declared types: text cannot tell an int column from a float one that happens to hold
        # whole numbers in its first block, and ids like "00123" must stay text.
        types = {view.entity_key: pa.string()}
        types.update({f.name: ARROW_TYPES[f.dtype] for f in view.features})
        # Only an empty field is null (its default): pyarrow's other null spellings made "NaN"
        # a default instead of the refused NaN it is, and an id "NA" or "null" no id at all.
        convert = pa_csv.ConvertOptions(column_types=types, include_columns=columns,
                                        null_values=[""])
        parse = pa_csv.ParseOptions(delimiter=self.delimiter)
        try:
            reader = pa_csv.open_csv(self.path, parse_options=parse, convert_options=convert)
            yield from _rebatch(reader, batch_rows)
        except pa.ArrowInvalid as exc:
            raise _named(exc, self.name, view, _csv_column(exc, header)) from exc


class JsonlSource(FeatureSource):
    """Newline-delimited JSON objects (one row per line), streamed by pyarrow."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"{str(self.path)!r}"

    def _first_keys(self) -> set[str]:
        """The keys of the first ``SURVEYED_ROWS`` rows together: a writer that leaves null
        fields out (Spark's does) drops a column from some rows, the first among them."""
        keys: set[str] = set()
        rows = 0
        for row in self._rows():
            keys.update(row)
            rows += 1
            if rows == SURVEYED_ROWS:
                break
        if not rows:
            raise FeatureSourceError(f"JSONL file {self.name} has no rows")
        return keys

    def _rows(self) -> Iterator[dict[str, Any]]:
        """The file's rows in order, each checked as the corpus reader checks a record: a key
        repeated in one object (pyarrow refuses it, naming neither file nor line) is a
        ``FeatureSchemaError`` naming the line and the key."""
        if not self.path.is_file():
            raise _missing_file(self.path)
        row = 0
        with self.path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    parsed = _DISTINCT_KEYS.decode(line)
                except RepeatedKey as exc:
                    raise FeatureSchemaError(
                        f"source {self.path}:{number}: the key {exc.key!r} appears twice in one "
                        "object (a row holds one value per key): rename or remove one",
                        exc.key,
                        row,
                    ) from exc
                except json.JSONDecodeError as exc:
                    raise FeatureSourceError(f"JSONL file {self.name}: {exc}") from exc
                if not isinstance(parsed, dict):
                    raise FeatureSourceError(f"JSONL file {self.name}: rows must be objects")
                yield parsed
                row += 1

    def _find_repeated_key(self) -> None:
        """Raise the error naming the line of a key repeated past the surveyed rows: pyarrow's
        error counts its row within a block of the file, so the file is parsed again (only
        once pyarrow has refused it)."""
        for _ in self._rows():
            pass

    def tables(self, view: FeatureView, batch_rows: int) -> Iterator[pa.Table]:
        _columns(view, self._first_keys(), self.name)
        schema = pa.schema([(f.name, ARROW_TYPES[f.dtype]) for f in view.features])
        parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
        try:
            reader = pa_json.open_json(self.path, parse_options=parse)
            yield from _rebatch(reader, batch_rows)
        except pa.ArrowInvalid as exc:
            if _JSON_REPEATED in str(exc):
                self._find_repeated_key()
            match = _JSON_COLUMN.search(str(exc))
            raise _named(exc, self.name, view, match.group(1) if match else None) from exc


class CallableSource(FeatureSource):
    """A Python function returning rows or columns.

    ``fn()`` may return a ``pyarrow.Table``, a mapping of column name to sequence/array (one
    chunk), or an iterable of row mappings (a generator streams: rows are taken ``batch_rows``
    at a time).
    """

    def __init__(self, fn: Callable[[], Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or f"callable {getattr(fn, '__qualname__', repr(fn))}"

    def tables(self, view: FeatureView, batch_rows: int) -> Iterator[pa.Table]:
        produced = self.fn()
        if isinstance(produced, pa.Table | pa.RecordBatch):
            table = produced if isinstance(produced, pa.Table) else pa.table(produced)
            # A repeated or missing column refused as a file's is (pyarrow raised KeyError)
            _columns(view, table.column_names, self.name)
            yield from (pa.Table.from_batches([b]) for b in table.to_batches(batch_rows))
        elif isinstance(produced, Mapping):
            yield self._from_columns(view, produced)
        elif isinstance(produced, Iterable) and not isinstance(produced, str | bytes):
            yield from self._from_rows(view, iter(produced), batch_rows)
        else:
            raise FeatureSourceError(
                f"{self.name} returned {type(produced).__name__}; return a pyarrow.Table, a "
                "dict of columns, or an iterable of row dicts"
            )

    def _from_columns(self, view: FeatureView, columns: Mapping[str, Any]) -> pa.Table:
        wanted = _columns(view, columns.keys(), self.name)
        arrays = {name: _to_array(list(columns[name]), name, self.name, view, 0) for name in wanted}
        lengths = {name: len(array) for name, array in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise FeatureSourceError(f"{self.name}: columns differ in length: {lengths}")
        return pa.table(arrays)

    def _from_rows(self, view: FeatureView, rows: Iterator[Any], batch_rows: int
                   ) -> Iterator[pa.Table]:
        first_row = 0
        wanted: list[str] | None = None  # the first chunk's columns: a later chunk lacking
        while chunk := list(islice(rows, batch_rows)):  # one has nulls there (defaults)
            for offset, row in enumerate(chunk):
                if not isinstance(row, Mapping):
                    raise FeatureSourceError(
                        f"{self.name}: row {first_row + offset} is {type(row).__name__}, "
                        "expected a mapping of column name to value"
                    )
            if wanted is None:
                wanted = _columns(view, {key for row in chunk for key in row}, self.name)
            arrays = {
                name: _to_array([row.get(name) for row in chunk], name, self.name, view, first_row)
                for name in wanted
            }
            yield pa.table(arrays)
            first_row += len(chunk)


def _to_array(values: list[Any], column: str, source: str, view: FeatureView, first_row: int
              ) -> pa.Array:
    """Arrow array with inferred type; mixed types name the column and the first odd row."""
    try:
        array = pa.array(values)
        # pyarrow reads True as 1 in a numeric column; a bool among numbers is a wrong type.
        if (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)) and any(
                value is True or value is False for value in values):
            raise TypeError("booleans mixed with numbers")
        return array
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        row = _first_odd_row(values)
        expected = EXPECTED.get(view.feature(column).dtype) if column in view.feature_names else (
            "document ids" if column == view.entity_key else "timestamps")
        raise FeatureSchemaError(
            f"source {source}: column {column!r} row {first_row + row}: value "
            f"{values[row]!r} ({type(values[row]).__name__}) does not fit the column; expected "
            f"{expected}",
            column,
            first_row + row,
        ) from exc


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _first_odd_row(values: list[Any]) -> int:
    """Index of the first value whose kind differs from the first non-null value's."""
    kinds = [(_kind(v), i) for i, v in enumerate(values) if v is not None]
    if not kinds:
        return 0
    first = kinds[0][0]
    return next((i for kind, i in kinds if kind != first), kinds[0][1])


def _rebatch(reader: Any, batch_rows: int) -> Iterator[pa.Table]:
    """Tables of at most ``batch_rows`` rows from a pyarrow streaming reader."""
    for batch in reader:
        for offset in range(0, batch.num_rows, batch_rows):
            yield pa.Table.from_batches([batch.slice(offset, batch_rows)])


def _csv_column(exc: Exception, header: list[str]) -> str | None:
    match = _CSV_COLUMN.search(str(exc))
    if match and int(match.group(1)) < len(header):
        return header[int(match.group(1))]
    return None


def _named(exc: Exception, source: str, view: FeatureView, column: str | None
           ) -> FeatureSchemaError:
    """A pyarrow parse error as a ``FeatureSchemaError`` that names the column."""
    if column is None:
        return FeatureSchemaError(f"source {source} cannot be parsed: {exc}", "<unknown>")
    expected = (EXPECTED[view.feature(column).dtype] if column in view.feature_names
                else "a value of the declared type")
    return FeatureSchemaError(
        f"source {source}: column {column!r} holds a value that is not {expected}: {exc}",
        column,
    )


def open_source(path: str | Path) -> FeatureSource:
    """A source for ``path`` chosen by suffix: .parquet/.pq, .csv, .jsonl/.ndjson/.json."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return ParquetSource(file)
    if suffix == ".csv":
        return CsvSource(file)
    if suffix in (".jsonl", ".ndjson", ".json"):
        return JsonlSource(file)
    raise FeatureSourceError(
        f"cannot tell the format of {str(file)!r} from its suffix {suffix!r}; "
        "use .parquet, .csv or .jsonl"
    )
