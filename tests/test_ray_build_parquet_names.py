"""A Parquet corpus naming a column twice is refused by the Ray build as by the local reader:
a ``CorpusError`` naming the file and the column, from the files' footers, before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexes.corpus import read_corpus
from indexes.errors import CorpusError

ray = pytest.importorskip("ray", reason="needs the ray extra")


def write_table(path: Path, names: list[str], columns: list[list[str]]) -> Path:
    pq.write_table(pa.Table.from_arrays([pa.array(c) for c in columns], names=names), path)
    return path


def test_a_parquet_column_named_twice_is_refused_before_ray_reads(tmp_path: Path) -> None:
    """Ray Data's reader failed in a Ray task with pyarrow's "Multiple matches for
    FieldRef.Name(text)" wrapped in Ray's task error, after starting a cluster to read."""
    from indexes.ray_build import read_documents

    parts = tmp_path / "parts"
    parts.mkdir()
    write_table(parts / "a.parquet", ["_id", "text"], [["a"], ["fine"]])
    twice = write_table(parts / "b.parquet", ["_id", "text", "title", "text"],
                        [["b"], ["first"], ["t"], ["second"]])
    message = r"b.parquet: columns 2 and 4 are named 'text', .* rename the columns"
    with pytest.raises(CorpusError, match=message):
        list(read_corpus(twice))  # the local reader, as it was
    with pytest.raises(CorpusError, match=message) as caught:
        read_documents(parts)
    assert type(caught.value) is CorpusError  # not Ray's task error wrapping pyarrow's
    assert not ray.is_initialized()  # the footers were read here, no cluster started
    (parts / "b.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(CorpusError, match=r"cannot read .*b.parquet"):
        read_documents(parts)
    assert not ray.is_initialized()


def test_a_parquet_struct_naming_a_field_twice_is_refused_before_ray_reads(
        tmp_path: Path) -> None:
    """The local reader refuses it (pyarrow cannot make such a row a record); the Ray build
    started a cluster, read the rows, then failed with pyarrow's bare ValueError."""
    from indexes.ray_build import read_documents

    parts = tmp_path / "parts"
    parts.mkdir()
    inner = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    nested = pa.StructArray.from_arrays([pa.array(["aero"]), inner], names=["dept", "stats"])
    pq.write_table(pa.table({"_id": ["a"], "text": ["t"], "metadata": nested}),
                   parts / "a.parquet")
    message = r"a.parquet: the struct 'metadata.stats' holds two fields named 'x'; rename one"
    with pytest.raises(CorpusError, match=message):
        list(read_corpus(parts / "a.parquet"))  # the local reader, as it was
    with pytest.raises(CorpusError, match=message):
        read_documents(parts)
    assert not ray.is_initialized()  # the footers were read here, no cluster started
