"""A column or key named twice in a feature source: the same ``FeatureSchemaError`` naming it,
whether the source is a file or a Python callable."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from test_features_support import quality_rows, quality_view

from retrieval.features import FeatureSchemaError, LocalStore, materialize
from retrieval.features.offline.sources import SURVEYED_ROWS


def with_column(table: pa.Table, name: str, values: list[object]) -> pa.Table:
    return pa.Table.from_arrays([*table.columns, pa.array(values)],
                                names=[*table.column_names, name])


@pytest.mark.parametrize("kind", ["table", "record batch"])
def test_a_callable_table_naming_a_column_twice_is_refused_as_a_file_is(
        kind: str, tmp_path: Path) -> None:
    """pyarrow's ``Table.column`` raised a bare KeyError ("Column clicks does not exist in
    schema") for a table holding two columns named "clicks". A repeated column the view does
    not read is left alone, as a file's is."""
    table = pa.Table.from_pylist(quality_rows(3))
    store = LocalStore(tmp_path / "fs")
    twice = with_column(table, "clicks", [99, 98, 97])
    produced = twice if kind == "table" else twice.to_batches()[0]
    with pytest.raises(FeatureSchemaError, match=r"columns 3 and 6 are named 'clicks', .* "
                                                 "rename the columns") as caught:
        materialize(quality_view(), lambda: produced, store, progress=False)
    assert caught.value.column == "clicks"
    assert store.snapshot_ids("quality") == []
    unread = with_column(with_column(table, "note", ["a"] * 3), "note", ["b"] * 3)
    materialize(quality_view(), lambda: unread, store, progress=False)
    assert store.read("quality", ["doc-2"]).values["clicks"].tolist() == [20]


def jsonl_lines(n: int) -> list[str]:
    return [json.dumps(row) for row in quality_rows(n)]


def repeat_clicks(line: str) -> str:
    """The row with a second "clicks" key (99) at its end."""
    return line[:-1] + ', "clicks": 99}'


def test_a_key_repeated_in_a_jsonl_object_names_the_line_and_the_key(tmp_path: Path) -> None:
    """pyarrow's error read "column 'clicks' holds a value that is not integers for int64:
    JSON parse error: Column(/clicks) was specified twice in row 1", with no line."""
    lines = jsonl_lines(4)
    lines[2] = repeat_clicks(lines[2])
    path = tmp_path / "twice.jsonl"
    path.write_text("\n".join([lines[0], "", *lines[1:]]) + "\n")  # a blank line counts
    store = LocalStore(tmp_path / "fs")
    with pytest.raises(FeatureSchemaError, match=r"twice.jsonl:4: the key 'clicks' appears "
                                                 "twice in one object") as caught:
        materialize(quality_view(), path, store, progress=False)
    assert (caught.value.column, caught.value.row) == ("clicks", 2)
    assert store.snapshot_ids("quality") == []  # refused before a snapshot was begun


def test_a_key_repeated_in_a_nested_jsonl_object_is_refused(tmp_path: Path) -> None:
    """A key the view does not read: pyarrow refuses the row all the same."""
    row = json.loads(jsonl_lines(1)[0])
    path = tmp_path / "nested.jsonl"
    path.write_text(json.dumps(row)[:-1] + ', "extra": {"a": 1, "a": 2}}\n')
    with pytest.raises(FeatureSchemaError, match=r"nested.jsonl:1: the key 'a' appears twice"):
        materialize(quality_view(), path, LocalStore(tmp_path / "fs"), progress=False)


def test_a_key_repeated_past_the_surveyed_rows_names_its_line(tmp_path: Path) -> None:
    """Past the rows read for the columns pyarrow finds the key, and its error counts the row
    within a block of the file (1 MiB by default), not from the file's start."""
    lines = jsonl_lines(SURVEYED_ROWS + 2000)
    late = SURVEYED_ROWS + 1500
    lines[late] = repeat_clicks(lines[late])
    path = tmp_path / "late.jsonl"
    path.write_text("\n".join(lines) + "\n")
    store = LocalStore(tmp_path / "fs")
    with pytest.raises(FeatureSchemaError, match=rf"late.jsonl:{late + 1}: the key 'clicks' "
                                                 "appears twice") as caught:
        materialize(quality_view(), path, store, progress=False, batch_rows=500)
    assert (caught.value.column, caught.value.row) == ("clicks", late)
