"""Check an Arrow chunk against a view and turn it into ``FeatureColumns``.

Every source (Parquet, CSV, JSONL, a Python callable) ends up as Arrow tables, so one set of
rules applies to all of them and every error names the column and says what was expected.

Rules: the entity column holds strings (integers are accepted and written as decimal text);
float features accept integer and float columns; int64 features only integers; bool features
only booleans. A null value gets the feature's default (an explicit "unknown"), while NaN or an
infinite value is an error: it would silently poison every ranking score it touches. The
timestamp column may hold epoch seconds, timestamps, dates or ISO-8601 text; a null timestamp
means "as of the materialization".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retrieval.features.errors import FeatureSchemaError
from retrieval.features.reads import FeatureColumns
from retrieval.features.view import Feature, FeatureView

ARROW_TYPES: dict[str, pa.DataType] = {
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
}
EXPECTED = {
    "float32": "numbers (float or integer) for float32",
    "float64": "numbers (float or integer) for float64",
    "int64": "integers for int64",
    "bool": "booleans for bool",
}
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def compatible(dtype: str, arrow_type: pa.DataType) -> bool:
    """May a column of ``arrow_type`` feed a feature of ``dtype``? (all-null always may)"""
    if pa.types.is_null(arrow_type):
        return True
    if pa.types.is_dictionary(arrow_type):
        return compatible(dtype, arrow_type.value_type)
    if dtype == "bool":
        return bool(pa.types.is_boolean(arrow_type))
    if dtype == "int64":
        return bool(pa.types.is_integer(arrow_type))
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
                or pa.types.is_decimal(arrow_type))


def check_schema(view: FeatureView, schema: pa.Schema, source: str) -> None:
    """Raise ``FeatureSchemaError`` for the first missing or mistyped column."""
    names = set(schema.names)
    for column in [view.entity_key, *view.feature_names]:
        if column not in names:
            raise FeatureSchemaError(
                f"source {source} has no column {column!r} "
                f"({_role(view, column)} of view {view.name!r}); it has {sorted(names)}",
                column,
            )
    key_type = _value_type(schema.field(view.entity_key).type)
    if not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)
            or pa.types.is_integer(key_type)):
        raise FeatureSchemaError(
            f"source {source}: entity column {view.entity_key!r} holds {key_type}, expected "
            "strings (document ids)",
            view.entity_key,
        )
    for feature in view.features:
        found = schema.field(feature.name).type
        if not compatible(feature.dtype, found):
            raise FeatureSchemaError(
                f"source {source}: column {feature.name!r} holds {found}, expected "
                f"{EXPECTED[feature.dtype]} (feature of view {view.name!r})",
                feature.name,
            )


def to_columns(
    view: FeatureView,
    table: pa.Table,
    source: str,
    first_row: int,
    with_event_time: bool,
    created_at: float,
) -> FeatureColumns:
    """Validate ``table`` (source rows ``first_row...``) and convert it to numpy columns.

    With ``with_event_time``, null timestamps (and a chunk without the column) become
    ``created_at``, the materialization time.
    """
    check_schema(view, table.schema, source)
    ids = entity_ids(table.column(view.entity_key), view.entity_key, source, first_row)
    values = {
        feature.name: feature_values(feature, table.column(feature.name), source, first_row)
        for feature in view.features
    }
    times = None
    if with_event_time:
        if view.timestamp_field in table.schema.names:
            times = event_times(table.column(view.timestamp_field), view.timestamp_field, source)
            times = np.where(np.isnan(times), created_at, times)
            check_times(times, created_at, view.timestamp_field, source, first_row)
        else:
            times = np.full(table.num_rows, created_at)
    return FeatureColumns(entity_ids=ids, values=values, event_time=times)


FUTURE_SLACK_SECONDS = 86_400.0  # clocks of the source and this job may disagree a little


def check_times(times: np.ndarray, created_at: float, name: str, source: str,
                first_row: int) -> None:
    """Event times must be finite and not after this materialization (a day of slack): a
    future one is never stale, so ``max_age_seconds`` would never apply to its row."""
    bad = np.flatnonzero(~np.isfinite(times) | (times > created_at + FUTURE_SLACK_SECONDS))
    if not bad.size:
        return
    row, value = first_row + int(bad[0]), float(times[bad[0]])
    if not np.isfinite(value):
        raise FeatureSchemaError(f"source {source}: timestamp column {name!r} row {row} is "
                                 "infinite", name, row)
    unit = " (milliseconds? give seconds since the epoch, or datetimes)" \
        if value > 1e11 else ""
    raise FeatureSchemaError(
        f"source {source}: timestamp column {name!r} row {row} is {value:.0f}, after this "
        f"materialization ({created_at:.0f}){unit}; an event time in the future would never "
        "go stale", name, row)


def entity_ids(column: pa.ChunkedArray, name: str, source: str, first_row: int) -> list[str]:
    """Document ids as str; null, empty or NUL-containing ids are errors (they cannot be keys)."""
    column = _decode(column)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.string())
    ids: list[str] = column.to_pylist()
    for offset, value in enumerate(ids):
        if not value or "\x00" in value:
            raise FeatureSchemaError(
                f"source {source}: column {name!r} row {first_row + offset}: entity id "
                f"{value!r} is null, empty or contains NUL; every row needs a document id",
                name,
                first_row + offset,
            )
    return ids


def feature_values(
    feature: Feature, column: pa.ChunkedArray, source: str, first_row: int
) -> np.ndarray:
    """The column cast to the feature dtype, nulls replaced by the default, finite checked."""
    target = ARROW_TYPES[feature.dtype]
    column = _decode(column)
    # An integer column into a float feature rounds past the float's mantissa (2**24 for
    # float32): a feature is a weight, so that is not an error. Every other cast stays safe.
    lossy_ok = pa.types.is_integer(column.type) and pa.types.is_floating(target)
    try:
        cast = column.cast(target, safe=not lossy_ok)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise FeatureSchemaError(
            f"source {source}: column {feature.name!r} cannot be converted to {feature.dtype}: "
            f"{exc}",
            feature.name,
        ) from exc
    filled = pc.fill_null(cast, pa.scalar(feature.default, type=target))
    values = np.asarray(filled.to_numpy(), dtype=feature.numpy_dtype)
    if values.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = first_row + int(bad[0])
            raise FeatureSchemaError(
                f"source {source}: column {feature.name!r} row {row}: value {values[bad[0]]} is "
                "not finite (NaN/inf would poison ranking scores); write null for unknown "
                "values, they get the default",
                feature.name,
                row,
            )
    return values


def event_times(column: pa.ChunkedArray, name: str, source: str) -> np.ndarray:
    """Epoch seconds (float64, NaN for null) from numbers, timestamps, dates or ISO text."""
    column = _decode(column)
    kind = column.type
    try:
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column = _parse_timestamps(column)
            kind = column.type
        if pa.types.is_timestamp(kind):
            scale = _UNIT_SECONDS[kind.unit]
            # Unsafe: nanoseconds since 1970 pass 2**53, and a float64 keeps them to 256 ns.
            seconds = column.cast(pa.int64()).cast(pa.float64(), safe=False)
            return np.asarray(seconds.to_numpy(zero_copy_only=False), dtype=np.float64) * scale
        if pa.types.is_date(kind):
            days = column.cast(pa.date32()).cast(pa.int32()).cast(pa.float64())
            return np.asarray(days.to_numpy(zero_copy_only=False), dtype=np.float64) * 86400.0
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
            seconds = column.cast(pa.float64())
            return np.asarray(seconds.to_numpy(zero_copy_only=False), dtype=np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise FeatureSchemaError(
            f"source {source}: timestamp column {name!r} cannot be read: {exc}", name
        ) from exc
    raise FeatureSchemaError(
        f"source {source}: timestamp column {name!r} holds {kind}, expected epoch seconds, "
        "timestamps, dates or ISO-8601 text",
        name,
    )


def _parse_timestamps(column: pa.ChunkedArray) -> pa.ChunkedArray:
    # Text with a zone offset ("...Z", "+02:00") parses as UTC; text without one is taken as UTC.
    try:
        return column.cast(pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid:
        return column.cast(pa.timestamp("us"))


def _decode(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Dictionary-encoded columns (common in Parquet) as plain values."""
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array([chunk.dictionary_decode() for chunk in column.chunks],
                                type=column.type.value_type)
    return column


def _value_type(arrow_type: pa.DataType) -> pa.DataType:
    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


def _role(view: FeatureView, column: str) -> str:
    if column == view.entity_key:
        return "the entity key, document ids as strings"
    return f"feature, {EXPECTED[view.feature(column).dtype]}"
