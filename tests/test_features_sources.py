"""Offline sources (Parquet, CSV, JSONL, callables) and their schema checks; views; the CLI."""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_features_support import make_store, quality_rows, quality_view

from retrieval.features import (
    CallableSource,
    FeatureConfigError,
    FeatureSchemaError,
    FeatureSourceError,
    FeatureStatus,
    FeatureView,
    LocalStore,
    RedisStore,
    load_view,
    materialize,
    open_source,
)
from retrieval.features.offline.cli import add_features_parser

Rows = list[dict[str, Any]]


def write_parquet(rows: Rows, path: Path) -> Any:
    pq.write_table(pa.Table.from_pylist(rows), path.with_suffix(".parquet"))
    return path.with_suffix(".parquet")


def write_csv(rows: Rows, path: Path) -> Any:
    target = path.with_suffix(".csv")
    names = list(dict.fromkeys(key for row in rows for key in row))
    with target.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
    return target


def write_jsonl(rows: Rows, path: Path) -> Any:
    target = path.with_suffix(".jsonl")
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


def callable_rows(rows: Rows, path: Path) -> Any:
    return lambda: iter(rows)


def callable_columns(rows: Rows, path: Path) -> Any:
    names = list(dict.fromkeys(key for row in rows for key in row))
    return lambda: {name: [row.get(name) for row in rows] for name in names}


FORMATS: dict[str, Callable[[Rows, Path], Any]] = {
    "parquet": write_parquet, "csv": write_csv, "jsonl": write_jsonl,
    "callable-rows": callable_rows, "callable-columns": callable_columns,
}


@pytest.fixture(params=sorted(FORMATS))
def fmt(request: pytest.FixtureRequest) -> Callable[[Rows, Path], Any]:
    return FORMATS[request.param]


def test_every_format_round_trips(fmt: Callable[[Rows, Path], Any], tmp_path: Path) -> None:
    rows = quality_rows(30, event_time=1_700_000_000.0)
    store = LocalStore(tmp_path / "fs")
    report = materialize(quality_view(), fmt(rows, tmp_path / "src"), store, progress=False,
                         batch_rows=7)
    assert report.rows == 30
    batch = store.read("quality", ["doc-29", "doc-3", "missing"], now=1_700_000_000.0)
    assert batch.values["quality"].tolist() == [29, 3, -1]
    assert batch.values["clicks"].tolist() == [290, 30, 0]
    assert batch.values["spam"].tolist() == [False, True, False]
    assert batch.event_time[:2].tolist() == [1_700_000_000.0] * 2


def test_wrong_typed_column_is_named(fmt: Callable[[Rows, Path], Any], tmp_path: Path) -> None:
    rows = quality_rows(10)
    for row in rows:
        row["quality"] = "high"
    with pytest.raises(FeatureSchemaError, match="'quality'.*float32") as caught:
        materialize(quality_view(), fmt(rows, tmp_path / "src"), LocalStore(tmp_path / "fs"),
                    progress=False)
    assert caught.value.column == "quality"


def test_missing_column_is_named(fmt: Callable[[Rows, Path], Any], tmp_path: Path) -> None:
    rows = quality_rows(10)
    for row in rows:
        del row["clicks"]
    with pytest.raises(FeatureSchemaError, match="no column 'clicks'.*int64") as caught:
        materialize(quality_view(), fmt(rows, tmp_path / "src"), LocalStore(tmp_path / "fs"),
                    progress=False)
    assert caught.value.column == "clicks"


@pytest.mark.parametrize(("column", "value", "message"), [
    ("clicks", 1.5, "'clicks'.*int64"),
    ("spam", 1.0, "'spam'.*bool"),
    ("quality", True, "'quality'"),
    ("quality", math.nan, "'quality' row 4.*not finite"),
    ("authority", 1e300, None),  # fits float64
    ("quality", 1e300, "'quality' row 4.*not finite"),  # overflows float32
    ("doc_id", None, "'doc_id' row 4"),
])
def test_bad_values_are_named(column: str, value: Any, message: str | None, tmp_path: Path
                              ) -> None:
    rows = quality_rows(10)
    rows[4][column] = value
    store = LocalStore(tmp_path / "fs")
    if message is None:
        materialize(quality_view(), lambda: rows, store, progress=False)
        return
    with pytest.raises(FeatureSchemaError, match=message) as caught:
        materialize(quality_view(), lambda: rows, store, progress=False)
    assert caught.value.column == column


def test_nulls_get_defaults_and_ints_feed_floats(tmp_path: Path) -> None:
    rows = quality_rows(5)
    rows[2]["quality"] = None
    rows[3]["authority"] = 7  # an int in a float64 column
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), write_parquet(rows, tmp_path / "src"), store, progress=False)
    batch = store.read("quality", ["doc-2", "doc-3"])
    assert batch.values["quality"].tolist() == [-1, 3]
    assert batch.values["authority"].tolist() == [0.4, 7.0]
    assert batch.status.tolist() == [FeatureStatus.PRESENT] * 2


@pytest.mark.parametrize("writer", [write_csv, write_jsonl])
def test_iso_timestamps_and_integer_ids(writer: Callable[[Rows, Path], Any], tmp_path: Path
                                        ) -> None:
    rows = [{"doc_id": 100 + i, "quality": i, "clicks": i, "authority": 0.1, "spam": False,
             "event_time": "2024-01-02T00:00:00Z" if i else "2024-01-01T00:00:00+01:00"}
            for i in range(3)]
    store = LocalStore(tmp_path / "fs")
    view = FeatureView.model_validate({**quality_view().model_dump(), "max_age_seconds": 86400})
    materialize(view, writer(rows, tmp_path / "src"), store, progress=False)
    now = 1704153600.0 + 3600  # 2024-01-02T01:00:00Z
    batch = store.read("quality", ["101", "100"], now=now)
    assert batch.event_time.tolist() == [1704153600.0, 1704063600.0]
    assert batch.status.tolist() == [FeatureStatus.PRESENT, FeatureStatus.STALE]


def test_nanosecond_and_fractional_timestamps_are_read(tmp_path: Path) -> None:
    """Nanoseconds since 1970 pass 2**53, and a safe cast to float refused them: every
    Parquet file pandas writes (timestamp[ns]) and CSV times with fractions of a second."""
    stamps = pa.array([1704067200_000_000_000, 1704153600_500_000_000], pa.timestamp("ns"))
    table = pa.table({"doc_id": ["a", "b"], "quality": [1.0, 2.0], "clicks": [1, 2],
                      "authority": [0.1, 0.2], "spam": [False, True], "event_time": stamps})
    pq.write_table(table, tmp_path / "ns.parquet")
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), tmp_path / "ns.parquet", store, progress=False)
    assert store.read("quality", ["a", "b"], now=1.8e9).event_time.tolist() == \
        [1704067200.0, 1704153600.5]
    rows = [{"doc_id": "c", "quality": 1, "clicks": 1, "authority": 0.1, "spam": False,
             "event_time": "2024-01-01T00:00:00.123456789Z"}]
    materialize(quality_view(), write_csv(rows, tmp_path / "frac"), store, progress=False)
    assert store.read("quality", ["c"], now=1.8e9).event_time[0] == pytest.approx(1704067200.123)


def test_csv_nulls_are_empty_fields_only_and_a_bom_is_read(tmp_path: Path) -> None:
    """pyarrow's other null spellings gave NaN (which the store refuses) its default, and
    made an id "NA" no id at all; Excel's UTF-8 BOM hid the header's first column."""
    source = tmp_path / "bom.csv"
    source.write_text("\ufeffdoc_id,quality,clicks,authority,spam\nNA,1.5,,0.2,false\n",
                      encoding="utf-8")
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), source, store, progress=False)
    batch = store.read("quality", ["NA"], now=1.8e9)
    assert batch.values["quality"].tolist() == [1.5] and batch.values["clicks"].tolist() == [0]
    source.write_text("doc_id,quality,clicks,authority,spam\na,NaN,1,0.2,false\n")
    with pytest.raises(FeatureSchemaError, match="'quality'.*not finite"):
        materialize(quality_view(), source, store, progress=False)


@pytest.mark.parametrize("writer", [write_jsonl, callable_rows])
def test_a_column_left_out_of_the_first_rows_is_not_missing(
        writer: Callable[[Rows, Path], Any], tmp_path: Path) -> None:
    """A writer that drops null fields (Spark's JSON) left a feature out of the first row:
    the file was refused as lacking the column that later rows hold (and a callable's
    later chunk without it was refused too)."""
    rows = quality_rows(6)
    del rows[0]["clicks"], rows[4]["clicks"], rows[5]["clicks"]
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), writer(rows, tmp_path / "src"), store, progress=False,
                batch_rows=4)
    batch = store.read("quality", ["doc-0", "doc-1", "doc-5"], now=1.8e9)
    assert batch.values["clicks"].tolist() == [0, 10, 0]


def test_source_errors(tmp_path: Path) -> None:
    with pytest.raises(FeatureSourceError, match="suffix"):
        open_source(tmp_path / "features.xlsx")
    with pytest.raises(FeatureSourceError, match="does not exist"):
        materialize(quality_view(), tmp_path / "absent.parquet", LocalStore(tmp_path / "fs"),
                    progress=False)
    with pytest.raises(FeatureSourceError, match="no rows"):
        materialize(quality_view(), lambda: [], LocalStore(tmp_path / "fs"), progress=False)
    with pytest.raises(FeatureSourceError, match="returned int"):
        materialize(quality_view(), CallableSource(lambda: 3), LocalStore(tmp_path / "fs"),
                    progress=False)
    assert LocalStore(tmp_path / "fs").snapshot_ids("quality") == []  # nothing half-written


def test_a_column_named_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """pyarrow read the first of two CSV columns named "clicks" (a Parquet file's last): the
    other's values were lost silently. A repeated column the view does not read is left
    alone, as a corpus's dropped field is."""
    header = "doc_id,clicks,quality,authority,spam,note,clicks,note"
    path = tmp_path / "twice.csv"
    path.write_text(f"{header}\ndoc-1,10,0.5,0.1,false,a,99,b\n")
    store = LocalStore(tmp_path / "fs")
    with pytest.raises(FeatureSchemaError, match=r"twice.csv': columns 2 and 7 are named "
                                                 r"'clicks', .* rename the columns so each "
                                                 "name is distinct") as caught:
        materialize(quality_view(), path, store, progress=False)
    assert caught.value.column == "clicks"
    assert store.snapshot_ids("quality") == []  # refused before any snapshot was begun
    path.write_text(f"{header.replace(',clicks,note', ',extra,note')}\n"
                    "doc-1,10,0.5,0.1,false,a,99,b\n")
    materialize(quality_view(), path, store, progress=False)
    assert store.read("quality", ["doc-1"]).values["clicks"].tolist() == [10]


def test_callable_may_return_an_arrow_table(tmp_path: Path) -> None:
    table = pa.Table.from_pylist(quality_rows(4))
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), lambda: table, store, progress=False)
    assert store.read("quality", ["doc-3"]).values["clicks"].tolist() == [30]


# -- views -----------------------------------------------------------------------------------


def test_view_loads_from_json_and_rejects_typos(tmp_path: Path) -> None:
    path = tmp_path / "view.json"
    path.write_text(quality_view(max_age_seconds=3600).model_dump_json())
    assert load_view(path) == quality_view(max_age_seconds=3600)
    payload = json.loads(path.read_text())
    payload["max_age_second"] = 5
    path.write_text(json.dumps(payload))
    with pytest.raises(FeatureConfigError, match="max_age_second"):
        load_view(path)
    with pytest.raises(FeatureConfigError, match="cannot read"):
        load_view(tmp_path / "absent.json")


@pytest.mark.parametrize("feature", [
    {"name": "x", "dtype": "int64", "default": 0.5},
    {"name": "x", "dtype": "bool", "default": 1},
    {"name": "x", "dtype": "float32", "default": "nan"},
    {"name": "x,y", "dtype": "float32"},
])
def test_view_rejects_bad_features(feature: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FeatureView.model_validate({"name": "v", "features": [feature]})
    with pytest.raises(ValueError, match="duplicate"):
        FeatureView.model_validate({"name": "v", "features": [{"name": "a"}, {"name": "a"}]})


# -- CLI ---------------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    root = argparse.ArgumentParser(prog="retrieval")
    add_features_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize("kind", ["local", "redis"])
def test_cli_materialize(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
                         capsys: pytest.CaptureFixture[str]) -> None:
    view_file = tmp_path / "view.json"
    view_file.write_text(quality_view().model_dump_json())
    source = write_parquet(quality_rows(25), tmp_path / "src")
    store = make_store(kind, tmp_path, request)
    if isinstance(store, RedisStore):
        location, extra = store.url, ["--namespace", store.namespace]
    else:
        assert isinstance(store, LocalStore)
        location, extra = str(store.directory), []
    common = ["--source", str(source), "--store", location, "--no-progress", *extra]
    assert run_cli(["features", "materialize", "--view-file", str(view_file), *common]) == 0
    first = capsys.readouterr().out
    assert "25 rows" in first and "rows/s" in first
    # --view NAME reuses the schema stored with the live snapshot
    assert run_cli(["features", "materialize", "--view", "quality", *common]) == 0
    assert "25 rows" in capsys.readouterr().out
    assert store.read("quality", ["doc-24"]).values["clicks"].tolist() == [240]
    with pytest.raises(FeatureConfigError, match="--view-file"):
        run_cli(["features", "materialize", "--view", "other", *common])
    store.close()


def test_make_store_validates_location() -> None:
    from retrieval.features import FeatureStoreConfig

    with pytest.raises(ValueError, match="cluster"):
        FeatureStoreConfig(location="/tmp/x", cluster=True)
    with pytest.raises(ValueError, match="db 0"):
        FeatureStoreConfig(location="redis://h:1/3", cluster=True)
    assert "***" in FeatureStoreConfig(location="redis://u:secret@h:1/0").describe()
    assert np.isfinite(FeatureStoreConfig(location="/tmp/x").grace_seconds)


def test_large_integer_columns_fill_float_features(tmp_path: Path) -> None:
    """A click count past 2**24 into a float32 feature rounds (it is a weight): the nightly
    job failed on it. Floats into an integer feature still refuse to truncate."""
    rows = [{"doc_id": "a", "quality": 20_000_001, "clicks": 1, "authority": 2 ** 53 + 1,
             "spam": False}]
    store = LocalStore(tmp_path / "fs")
    materialize(quality_view(), write_parquet(rows, tmp_path / "big"), store, progress=False)
    batch = store.read("quality", ["a"])
    assert batch.values["quality"].tolist() == [20_000_000.0]
    assert batch.values["authority"].tolist() == [float(2 ** 53)]
    with pytest.raises(FeatureSchemaError, match="'clicks' holds double, expected integers"):
        materialize(quality_view(), CallableSource(lambda: [{**rows[0], "clicks": 1.5}]),
                    LocalStore(tmp_path / "fs2"), progress=False)


@pytest.mark.parametrize(("stamp", "says"), [(1795000000000, "milliseconds?"),
                                              ("2099-01-01T00:00:00Z", "after this materializ")])
def test_event_times_in_the_future_are_refused(tmp_path: Path, stamp: Any, says: str) -> None:
    """A future event time is never stale: max_age_seconds would never apply to its row."""
    rows = [{**row, "event_time": stamp} for row in quality_rows(2)]
    with pytest.raises(FeatureSchemaError, match=says):
        materialize(quality_view(max_age_seconds=60), CallableSource(lambda: rows),
                    LocalStore(tmp_path / "fs"), progress=False)
