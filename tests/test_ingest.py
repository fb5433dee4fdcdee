"""Bringing your own documents: JSONL with other field names, CSV, Parquet and folders of
Markdown, text and HTML files, each with a wrong mapping refused naming the fields there are;
the same options on ``retrieval build`` and ``retrieval upsert``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexes import Document, FieldMapping, read_corpus
from indexes.errors import CorpusError
from indexes.metadata import MetadataIndex
from retrieval.cli.app import main

ROWS = [{"doc": "a1", "body": "Wing flutter at subsonic speeds", "headline": "Flutter",
         "year": 1962, "dept": "aero", "secret": "x"},
        {"doc": "a2", "body": "Boundary layers on flat plates", "headline": "Layers",
         "year": 1971, "dept": "fluids", "secret": "y"}]
MAPPING = FieldMapping(id_field="doc", text_field="body", title_field="headline",
                       drop=("secret",))


def expected() -> list[tuple[str, str, str, dict]]:
    return [(r["doc"], r["headline"], r["body"], {"year": r["year"], "dept": r["dept"]})
            for r in ROWS]


def as_tuples(path: Path, mapping: FieldMapping) -> list[tuple[str, str, str, dict]]:
    return [(d.id, d.title, d.text, d.metadata) for d in read_corpus(path, mapping)]


def write_jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def write_csv(path: Path) -> Path:
    header = list(ROWS[0])
    path.write_text(",".join(header) + "\n" + "".join(
        ",".join(str(r[h]) for h in header) + "\n" for r in ROWS))
    return path


def write_parquet(path: Path) -> Path:
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


@pytest.mark.parametrize("writer", [write_jsonl, write_csv, write_parquet],
                         ids=["jsonl", "csv", "parquet"])
def test_a_mapped_table_reads_every_record_and_a_wrong_mapping_lists_the_fields(tmp_path,
                                                                             writer):
    path = writer(tmp_path / f"corpus.{writer.__name__.removeprefix('write_')}")
    assert as_tuples(path, MAPPING) == expected()  # years stay numbers in CSV too
    keep = FieldMapping(id_field="doc", text_field="body", keep=("dept",))
    assert [d.metadata for d in read_corpus(path, keep)] == [{"dept": "aero"},
                                                             {"dept": "fluids"}]
    listing = r"no field '_id' \(or 'id'\), 'text'; its fields are 'doc', 'body', 'headline'"
    with pytest.raises(CorpusError, match=listing):
        list(read_corpus(path))  # the default mapping: no id either, no text
    with pytest.raises(CorpusError, match="no field 'bdy'.*--text-field"):
        list(read_corpus(path, FieldMapping(id_field="doc", text_field="bdy")))


def test_csv_ids_that_look_like_numbers_stay_text(tmp_path):
    path = tmp_path / "ids.csv"
    path.write_text("id,text\n00123,first\n7,second\n")
    assert [d.id for d in read_corpus(path)] == ["00123", "7"]
    numbers = tmp_path / "numbers.csv"  # a title and a text of digits stay as written
    numbers.write_text("id,title,text\na,2,10\nb,3.50,007\n")
    assert [(d.title, d.text) for d in read_corpus(numbers)] == [("2", "10"), ("3.50", "007")]
    mapped = tmp_path / "keys.csv"
    mapped.write_text("key,body\n00123,first\n0042,second\n")
    assert [d.id for d in read_corpus(mapped, FieldMapping(id_field="key", text_field="body"))
            ] == ["00123", "0042"]


def test_csv_ids_stay_text_behind_a_byte_order_mark(tmp_path):
    """Excel starts a UTF-8 CSV with a byte-order mark: the first column read "\ufeffid", so
    the id column was typed by pyarrow (00123 became '123', and 001 collided with 1)."""
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbfid,text\n00123,hello\n0042,world\n")
    assert [d.id for d in read_corpus(path)] == ["00123", "0042"]


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    """UnicodeDecodeError came through as a traceback, with no line."""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "fine"}\n'
                     b'{"_id": "c", "text": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl:3: not UTF-8 .*0xe9"):
        list(read_corpus(path))
    table = tmp_path / "latin.csv"
    table.write_bytes(b"id,t\xe9xt\na,first\n")
    with pytest.raises(CorpusError, match="latin.csv: not UTF-8"):
        list(read_corpus(table))


def test_dates_inside_a_parquet_list_or_struct_are_iso_strings(tmp_path):
    """A list<date32> column reached the build as datetime.date objects, a TypeError there
    (docs say a table's dates need nothing)."""
    import datetime

    from indexes import build_index
    from indexes.manifest import EncoderInfo

    path = tmp_path / "dated.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["first"],
                             "days": pa.array([[18292, 18779]], pa.list_(pa.date32())),
                             "span": pa.array([{"from": 18292}],
                                              pa.struct([("from", pa.date32())]))}), path)
    (doc,) = read_corpus(path)
    assert doc.metadata == {"days": ["2020-01-31", "2021-06-01"],
                            "span": {"from": "2020-01-31"}}
    nested = Document("b", "second", metadata={"span": {"from": datetime.date(2020, 1, 31)}})
    info = EncoderInfo(encoder_id="given", model="given", dim=2, vector_dtype="float32")
    with pytest.raises(CorpusError, match="holds a value JSON has no type for"):
        build_index([nested], tmp_path / "root", vectors=np.ones((1, 2), np.float32),
                    encoder_info=info, progress=False)


def test_an_xhtml_file_with_an_encoding_declaration_is_read(tmp_path):
    """lxml refuses a decoded string that declares an encoding: the whole folder failed."""
    (tmp_path / "page.xhtml.html").write_text(
        "<?xml version='1.0' encoding='utf-8'?>\n<html xmlns='http://www.w3.org/1999/xhtml'>"
        "<head><title>Naïve flow</title></head><body><p>Über laminar flow.</p></body></html>",
        encoding="utf-8")
    (doc,) = read_corpus(tmp_path)
    assert (doc.title, doc.text) == ("Naïve flow", "Über laminar flow.")


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_iso_dates_in_a_table_are_a_date_field(tmp_path, suffix):
    # pyarrow reads an ISO 8601 column as dates or datetimes (Parquet stores them so): they
    # come out as ISO strings, which the build indexes as dates (filterable with < and >).
    path = tmp_path / f"dated.{suffix}"
    if suffix == "csv":
        path.write_text("id,text,day,at\na,first,2020-01-31,2020-01-31T08:00:00Z\n"
                        "b,second,2021-06-01,2021-06-01T12:30:00Z\n")
    else:
        pq.write_table(pa.table({"id": ["a", "b"], "text": ["first", "second"],
                                 "day": pa.array([18292, 18779], pa.date32())}), path)
    docs = list(read_corpus(path))
    assert docs[0].metadata["day"] == "2020-01-31"
    if suffix == "csv":
        assert docs[1].metadata["at"] == "2021-06-01T12:30:00+00:00"
    kinds = MetadataIndex.build([d.metadata for d in docs]).kinds
    assert set(kinds.values()) == {"date"}


def test_a_folder_of_markdown_text_and_html_files(tmp_path):
    (tmp_path / "guides").mkdir()
    (tmp_path / "guides" / "setup.md").write_text("Intro line\n\n# Setting up\n\nInstall it.")
    (tmp_path / "notes.txt").write_text("Plain notes about wind tunnels.")
    (tmp_path / "page.html").write_text(
        "<html><head><title>Flutter  page</title><style>p {color: red}</style></head>"
        "<body><h1>Flutter</h1><p>Wing <b>flutter</b> at speed.</p><script>var x = 1;"
        "</script><p>Second paragraph.</p></body></html>")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")  # not a document: skipped
    docs = {d.id: d for d in read_corpus(tmp_path)}
    assert sorted(docs) == ["guides/setup.md", "notes.txt", "page.html"]
    assert docs["guides/setup.md"].title == "Setting up"
    page = docs["page.html"]
    assert page.title == "Flutter page"
    assert page.text == "Flutter\nWing flutter at speed.\nSecond paragraph."
    assert docs["notes.txt"].metadata == {"format": "text", "folder": "."}
    with pytest.raises(CorpusError, match="no fields to map"):
        list(read_corpus(tmp_path, FieldMapping(text_field="body")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="holds no corpus.jsonl"):
        list(read_corpus(tmp_path / "empty"))


def test_an_empty_file_in_a_folder_is_a_document_with_an_empty_text(tmp_path):
    """An empty file stopped the whole folder's build, while JSONL's "text": "" and a CSV's
    empty cell are built as documents with an empty text."""
    (tmp_path / "blank.md").write_text("")
    (tmp_path / "spaces.txt").write_text("  \n\t\n")
    (tmp_path / "tags.html").write_text("<html><head><title>Only a title</title></head>"
                                        "<body><p> </p></body></html>")
    (tmp_path / "nothing.html").write_text("<!-- a comment, no element -->\n")
    (tmp_path / "full.txt").write_text("Wing flutter.")
    docs = {d.id: (d.text, d.title) for d in read_corpus(tmp_path)}
    assert docs == {"blank.md": ("", ""), "spaces.txt": ("", ""),
                    "tags.html": ("", "Only a title"), "nothing.html": ("", ""),
                    "full.txt": ("Wing flutter.", "")}


def test_build_and_upsert_take_the_mapping_flags(tmp_path, capsys):
    corpus = write_csv(tmp_path / "corpus.csv")
    out = tmp_path / "index"
    flags = ["--id-field", "doc", "--text-field", "body", "--title-field", "headline",
             "--drop-fields", "secret"]
    assert main(["build", "--corpus", str(corpus), "--out", str(out), *flags]) == 0
    assert "dept (keyword), year (number)" in capsys.readouterr().out
    change = tmp_path / "change.csv"
    change.write_text("doc,body,headline,year,dept,secret\na3,Shock waves,Shocks,1980,aero,z\n")
    assert main(["upsert", str(out), "--corpus", str(change), *flags]) == 0
    assert "acknowledged seq 1: 1 documents upserted" in capsys.readouterr().out
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "x")]) == 2
    assert "no field '_id' (or 'id'), 'text'" in capsys.readouterr().err


def test_a_line_nested_too_deeply_names_its_line(tmp_path):
    """json's decoder recurses per level: a line nested 100k deep was a RecursionError
    traceback out of ``retrieval build`` (and out of a queries file)."""
    from indexes.corpus import read_queries

    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "x", "m": ' + deep + "}\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: a JSON value nested too deeply"):
        list(read_corpus(path))
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q", "text": ' + deep + "}\n")
    with pytest.raises(CorpusError, match="queries.jsonl line 1: a JSON value nested too"):
        read_queries(queries)


def test_a_metadata_field_name_holding_a_lone_surrogate_is_refused_before_encoding(tmp_path):
    """JSON's "\\ud800" escape in a key reached the schema's save, a UnicodeEncodeError after
    the whole corpus was encoded; values, ids and titles were refused up front already."""
    from indexes import build_index
    from indexes.manifest import EncoderInfo

    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "a", "text": "wing flutter", "\\ud800": "x"}\n')
    documents = list(read_corpus(path))
    info = EncoderInfo(encoder_id="given", model="given", dim=2, vector_dtype="float32")
    with pytest.raises(CorpusError, match=r"a metadata field name '\\ud800' holding a lone"):
        build_index(documents, tmp_path / "root", vectors=np.ones((1, 2), np.float32),
                    encoder_info=info, progress=False)


def test_csv_cells_that_read_like_nulls_stay_text(tmp_path):
    """pyarrow's default null list took "NA", "null", "N/A", "NULL" and "NaN" for missing
    values: Namibia's code vanished, a title "null" became "" and an id "NA" was refused as
    no id. A text cell is kept as written, an empty one is missing, and an empty id stays an
    error (an empty text is an empty text, as JSON's "")."""
    path = tmp_path / "nullish.csv"
    path.write_text("_id,text,title,country\nd1,NULL,null,NA\nNA,second,N/A,FR\n"
                    "d3,third,,\n")
    assert [(d.id, d.text, d.title, d.metadata) for d in read_corpus(path)] == [
        ("d1", "NULL", "null", {"country": "NA"}), ("NA", "second", "N/A", {"country": "FR"}),
        ("d3", "third", "", {})]
    (tmp_path / "no_id.csv").write_text("_id,text\n,hello\n")
    with pytest.raises(CorpusError, match=r"row 1: a document needs an id .*got id None"):
        list(read_corpus(tmp_path / "no_id.csv"))
    (tmp_path / "no_text.csv").write_text("_id,text\nd1,\n")
    assert [d.text for d in read_corpus(tmp_path / "no_text.csv")] == [""]
    # In a column of numbers "NA" is still a missing number, as R and pandas write it: the
    # column stays a number field (read as text, ``year >= 2010`` stopped working).
    (tmp_path / "years.csv").write_text("_id,text,year\na,x,2010\nb,y,NA\nc,z,2012\n")
    assert [d.metadata for d in read_corpus(tmp_path / "years.csv")] == [
        {"year": 2010}, {}, {"year": 2012}]


def test_keep_and_drop_name_fields_of_the_nested_metadata_object(tmp_path):
    """The mapping was checked against top-level keys only: the documented
    ``--keep-fields department,year`` on a record with a ``metadata`` object was refused."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(
        {"_id": i, "text": "wing flutter", "metadata": {"department": d, "year": 1962,
                                                        "internal_notes": "x"}}) + "\n"
        for i, d in [("d1", "aero"), ("d2", "fluids")]))
    keep = FieldMapping(keep=("department", "year"))
    assert [d.metadata for d in read_corpus(path, keep)] == [
        {"department": "aero", "year": 1962}, {"department": "fluids", "year": 1962}]
    drop = FieldMapping(drop=("internal_notes",))
    assert [d.metadata for d in read_corpus(path, drop)][0] == {"department": "aero",
                                                                  "year": 1962}
    listing = r"no field 'departmnt'; its fields are .*'metadata' \(in its metadata: 'depa"
    with pytest.raises(CorpusError, match=listing):
        list(read_corpus(path, FieldMapping(keep=("departmnt",))))
    with pytest.raises(CorpusError, match="no field 'department'"):  # a text is top-level
        list(read_corpus(path, FieldMapping(text_field="department")))
    table = tmp_path / "nested.parquet"
    pq.write_table(pa.Table.from_pylist([{"_id": "d1", "text": "wing flutter",
                                          "metadata": {"department": "aero", "year": 1962}}]),
                   table)
    assert [d.metadata for d in read_corpus(table, FieldMapping(keep=("year",)))] == [
        {"year": 1962}]


def test_with_an_id_field_the_other_id_and_metadata_columns_are_fields(tmp_path):
    """With --id-field, columns named "_id" and "id" (and a CSV column named "metadata") were
    dropped even when --keep-fields named them. "id" cannot be metadata (a filter on it means
    the document id): it is refused naming the way out, not dropped."""
    path = tmp_path / "export.csv"
    path.write_text("body_id,body,_id,id,metadata\na,wing flutter,X1,EXT-1,m1\n")
    keep = FieldMapping(id_field="body_id", text_field="body", keep=("_id", "metadata"))
    assert [d.metadata for d in read_corpus(path, keep)] == [{"_id": "X1", "metadata": "m1"}]
    mapped = FieldMapping(id_field="body_id", text_field="body")
    with pytest.raises(CorpusError, match="its field 'id' would be metadata .*--drop-fields id"):
        list(read_corpus(path, mapped))
    with pytest.raises(CorpusError, match="its field 'id' would be metadata"):
        list(read_corpus(path, keep.model_copy(update={"keep": ("id",)})))
    dropped = mapped.model_copy(update={"drop": ("id",)})
    assert [d.metadata for d in read_corpus(path, dropped)] == [{"_id": "X1", "metadata": "m1"}]
    both = tmp_path / "both.jsonl"  # by default "_id" and "id" both name the id
    both.write_text('{"_id": "z1", "id": "z2", "text": "x y"}\n')
    assert [(d.id, d.metadata) for d in read_corpus(both)] == [("z1", {})]


def test_a_blank_first_line_does_not_skip_the_mapping_check(tmp_path):
    """The mapping was checked on line 1 only: after a blank line a misspelt --keep-fields
    silently kept nothing."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('\n{"_id": "a", "text": "x", "dept": "aero"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl \(line 2\): no field 'deptt'"):
        list(read_corpus(path, FieldMapping(keep=("deptt",))))


def test_a_jsonl_file_behind_a_byte_order_mark_is_read(tmp_path):
    """A CSV's byte-order mark was skipped, a JSONL file's refused as invalid JSON."""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\n')
    assert [d.id for d in read_corpus(path)] == ["a", "b"]


@pytest.mark.parametrize(("record", "message"), [
    ({"_id": [1], "text": "x"}, r"the id \('_id'\) is list '\[1\]'; give a string or whole number"),
    ({"_id": True, "text": "x"}, r"the id \('_id'\) is bool 'True'"),
    ({"_id": "a", "text": "x", "title": {"t": 1}}, r"the title \('title'\) is dict"),
    ({"_id": "a", "text": "x", "dept": "aero", "metadata": {"dept": "bio"}},
     r"'dept' is both a field and a key of its metadata object"),
])
def test_values_a_document_cannot_hold_as_given_are_refused(tmp_path, record, message):
    """A list or boolean id was stored as its Python repr ("[1]", "True"), an object title
    too, and a top-level field silently replaced its metadata object's key of that name."""
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(CorpusError, match=message):
        list(read_corpus(path))


def test_a_title_of_zero_is_kept_and_a_number_id_is_its_digits(tmp_path):
    """``title or ""`` turned a title of 0 into no title."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": 7, "text": "x", "title": 0}\n{"_id": "b", "text": "y"}\n')
    assert [(d.id, d.title) for d in read_corpus(path)] == [("7", "0"), ("b", "")]


def test_time_decimal_and_duration_columns_are_read_as_json_holds_them(tmp_path):
    """A CSV's "09:00:00" (read by pyarrow as a time), a Parquet decimal and a duration were
    refused with advice for Python callers ("`.isoformat()` for a date")."""
    import decimal
    from datetime import timedelta

    csv = tmp_path / "corpus.csv"
    csv.write_text("_id,text,opens\na,x,09:00:00\nb,y,17:30:00\n")
    assert [d.metadata for d in read_corpus(csv)] == [{"opens": "09:00:00"},
                                                      {"opens": "17:30:00"}]
    table = pa.table({"_id": ["a"], "text": ["x"],
                      "price": pa.array([decimal.Decimal("12.50")], pa.decimal128(6, 2)),
                      "took": pa.array([timedelta(seconds=90)], pa.duration("s"))})
    pq.write_table(table, tmp_path / "corpus.parquet")
    assert [d.metadata for d in read_corpus(tmp_path / "corpus.parquet")] == [
        {"price": 12.5, "took": 90.0}]


def test_a_field_named_id_is_refused_in_any_record_when_another_field_is_the_id(tmp_path):
    """Checked on the first record only: a later record's ``id`` was stored as a metadata
    field that no filter reaches (a filter on ``id`` means the document id)."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"doc_id": "a", "text": "x"}\n{"doc_id": "b", "text": "y", "id": "z"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: its field 'id' would be metadata"):
        list(read_corpus(path, FieldMapping(id_field="doc_id")))


def write_repeated(path: Path, names: list[str], row: list[str]) -> Path:
    """A one-row table whose column ``names`` may repeat."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_arrays([pa.array([v]) for v in row], names=names), path)
    else:
        sep = "\t" if path.suffix == ".tsv" else ","
        path.write_text(sep.join(names) + "\n" + sep.join(row) + "\n")
    return path


@pytest.mark.parametrize("suffix", ["csv", "tsv", "parquet"])
def test_columns_sharing_a_name_are_refused_naming_them(tmp_path, suffix):
    """Of two CSV columns named alike the last was kept, the other lost silently (a Parquet
    file's was an Arrow error about "multiple matches for FieldRef")."""
    path = write_repeated(tmp_path / f"corpus.{suffix}", ["_id", "text", "title", "text"],
                          ["a", "the abstract", "Flutter", "a note"])
    with pytest.raises(CorpusError, match=r"columns 2 and 4 are named 'text', and a row keeps "
                       r"one value per name .*: rename the columns so each name is distinct$"):
        list(read_corpus(path))


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_a_repeated_metadata_column_may_be_dropped_and_is_then_not_read(tmp_path, suffix):
    path = write_repeated(tmp_path / f"corpus.{suffix}", ["_id", "text", "tag", "year", "tag"],
                          ["a", "the abstract", "x", "1962", "y"])
    with pytest.raises(CorpusError, match=r"columns 3 and 5 are named 'tag'.* leave both out "
                       r"with --drop-fields tag; FieldMapping\(drop=...\) in Python\)"):
        list(read_corpus(path))
    for mapping in (FieldMapping(drop=("tag",)), FieldMapping(keep=("year",))):
        (document,) = read_corpus(path, mapping)
        assert (document.text, set(document.metadata)) == ("the abstract", {"year"})


def test_a_parquet_struct_naming_a_field_twice_is_refused(tmp_path):
    """pyarrow cannot make such a row a record: a bare ValueError out of ``retrieval build``."""
    inner = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    nested = pa.StructArray.from_arrays([pa.array(["aero"]), inner], names=["dept", "stats"])
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"_id": ["a"], "text": ["t"], "metadata": nested}), path)
    with pytest.raises(CorpusError, match=r"the struct 'metadata.stats' holds two fields "
                                          r"named 'x'; rename one"):
        list(read_corpus(path))


@pytest.mark.parametrize("line", ['{"_id": "b", "text": "first", "text": "second"}',
                                  '{"_id": "b", "text": "x", "metadata": {"t": 1, "t": 2}}'])
def test_a_key_repeated_in_a_json_object_is_refused_naming_its_line(tmp_path, line):
    """json keeps the last value of a repeated key: the first was lost silently."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "a", "text": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: the key '(text|t)' appears twice "
                                          "in one object"):
        list(read_corpus(path))


def test_parts_cut_at_any_byte_check_every_line_once_and_name_it_in_the_file(tmp_path):
    """A JSONL file is checked in parts of a few bytes up to the whole, the bad line at each
    place in turn (a blank line and a byte-order mark among the good ones): exactly one part
    refuses it, and checked numbered it names the line of the whole file."""
    from indexes.corpus import check_lines

    good = ['\ufeff{"_id": "a", "text": "x"}', "", *(f'{{"_id": "d{i}", "text": "t{i}"}}'
                                                    for i in range(6))]
    for bad_at in range(1, len(good)):
        lines = [*good[:bad_at], '{"_id": "b", "text": "1", "text": "2"}', *good[bad_at:]]
        path = tmp_path / "corpus.jsonl"
        path.write_text("\n".join(lines) + "\n")
        size = path.stat().st_size
        for part in (1, 7, 29, 64, size):
            refused = []
            for start in range(0, size, part):
                try:
                    check_lines(path, start, start + part, numbered=False)
                except CorpusError:
                    refused.append(start)
            assert len(refused) == 1, (bad_at, part, refused)
            with pytest.raises(CorpusError, match=rf"corpus.jsonl:{bad_at + 1}: the key 'text'"):
                check_lines(path, refused[0], refused[0] + part)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_an_empty_text_cell_is_an_empty_text_as_in_json(tmp_path, suffix):
    """A CSV writes "" as an empty cell, which was refused as no text at all, while the same
    document in JSONL was built."""
    rows = [{"_id": "a", "text": "", "title": "Flutter"}, {"_id": "b", "text": "x", "title": ""}]
    path = tmp_path / f"corpus.{suffix}"
    if suffix == "csv":
        path.write_text("_id,text,title\na,,Flutter\nb,x,\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    assert [(d.id, d.text, d.title) for d in read_corpus(path)] == [("a", "", "Flutter"),
                                                                     ("b", "x", "")]
