"""Input files as a new user writes them: the documented samples work, and bad corpora are
reported with file, line and document id before anything expensive runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from benchmarks.synthetic import random_unit_vectors
from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.docstore import Document
from indexes.manifest import EncoderInfo
from indexes.metadata import MetadataIndex
from retrieval import CorpusError
from retrieval.cli.formats import CORPUS_FORMAT, FEATURE_FORMATS
from retrieval.features import FeatureView, LocalStore, materialize


def _json_sample(text: str) -> dict:
    """The first ``{...}`` block of a help text, which spans several indented lines."""
    start = text.index("{")
    depth = 0
    for end, char in enumerate(text[start:], start=start):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return json.loads(text[start:end + 1])
    raise AssertionError("unbalanced sample")


def _lines(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_documented_corpus_sample_reads_with_the_documented_types(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    _lines(corpus, [_json_sample(CORPUS_FORMAT)])
    (doc,) = read_corpus(corpus)
    assert (doc.id, doc.title) == ("d1", "Wing flutter")
    kinds = MetadataIndex.build([doc.metadata]).kinds
    assert kinds == {"department": "keyword", "tags": "keyword", "year": "number",
                     "published": "date", "reviewed": "keyword"}
    for field, kind in kinds.items():  # the help text names each type it infers
        assert re.search(rf"\b{kind}\b", CORPUS_FORMAT), field


def test_documented_feature_samples_materialize_and_read_back(tmp_path):
    view = FeatureView.model_validate(_json_sample(FEATURE_FORMATS))
    csv_text = FEATURE_FORMATS[FEATURE_FORMATS.index("doc_id,clicks"):].strip()
    source = tmp_path / "popularity.csv"
    source.write_text("\n".join(line.strip() for line in csv_text.splitlines()) + "\n")
    store = LocalStore(tmp_path / "features")
    report = materialize(view, source, store, progress=False)
    assert report.rows == 2
    batch = store.read("popularity", ["d1", "d3"])
    assert batch.values["clicks"][0] == 1520 and bool(batch.values["editor_pick"][0])
    assert batch.values["clicks"][1] == 0  # d3 has no row: the view's default


def test_missing_corpus_is_reported_when_the_reader_is_created(tmp_path):
    with pytest.raises(CorpusError, match="nope.jsonl does not exist"):
        read_corpus(tmp_path / "nope.jsonl")  # not iterated: the check is not lazy
    with pytest.raises(CorpusError, match="holds no corpus.jsonl and no .md"):
        read_corpus(tmp_path)  # a folder without corpus.jsonl


def test_duplicate_id_names_file_both_lines_and_the_id(tmp_path):
    corpus = tmp_path / "c.jsonl"
    _lines(corpus, [{"_id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"_id": "a", "text": "z"}])
    with pytest.raises(CorpusError) as caught:
        list(read_corpus(corpus))
    assert str(caught.value).startswith(f"{corpus}:3: duplicate document id 'a' (first at line 1)")


def test_mixed_type_field_names_file_lines_and_documents(tmp_path):
    corpus = tmp_path / "c.jsonl"
    _lines(corpus, [{"_id": "a", "text": "x", "metadata": {"year": 1962}},
                    {"_id": "b", "text": "y", "metadata": {"year": 1963}},
                    {"_id": "c", "text": "z", "year": "1964"}])
    with pytest.raises(CorpusError) as caught:
        list(read_corpus(corpus))
    message = str(caught.value)
    assert message.startswith(f"{corpus}:3: document 'c': metadata field 'year' is a keyword here "
                              "but a number at line 1 (document 'a')")
    assert "same type" in message


def test_dates_and_other_strings_in_one_field_are_a_keyword_field_not_an_error(tmp_path):
    corpus = tmp_path / "c.jsonl"
    _lines(corpus, [{"_id": "a", "text": "x", "when": "2020-01-31"},
                    {"_id": "b", "text": "y", "when": "soon"}])
    docs = list(read_corpus(corpus))
    assert MetadataIndex.build([d.metadata for d in docs]).kinds == {"when": "keyword"}


def test_mixed_types_from_python_documents_name_the_documents(tmp_path):
    docs = [Document("a", "x", metadata={"year": 2001}), Document("b", "y", metadata={"year": 2})]
    docs.append(Document("c", "z", metadata={"year": "soon"}))
    with pytest.raises(CorpusError, match=r"year.*keyword in document 'c', number in document 'a'"):
        build_index(docs, tmp_path, vectors=random_unit_vectors(3, 8), progress=False,
                    encoder_info=EncoderInfo(encoder_id="random:none:fp32:8", model="random",
                                             dim=8, vector_dtype="float32"))


@pytest.mark.parametrize(("change", "message"), [
    ({"id": 1}, r"document 1 \(1\): its id is a int"),
    ({"text": None}, "its text is a NoneType"),
    ({"title": None}, "its title is a NoneType"),
    ({"metadata": None}, "its metadata is a NoneType"),
    ({"id": ""}, r"document 1 has a blank id \(''\)"),
    ({"id": "  "}, "has a blank id"),
    ({"metadata": {1: "x"}}, r"field name 1 in document 'b' is a int"),
])
def test_a_document_part_of_the_wrong_type_is_a_corpus_error_naming_it(tmp_path, change,
                                                                       message):
    from dataclasses import replace

    docs = [Document("a", "x", metadata={"k": "v"}),
            replace(Document("b", "y", metadata={"k": "w"}), **change)]
    with pytest.raises(CorpusError, match=message):
        build_index(docs, tmp_path / "index", vectors=random_unit_vectors(2, 8), progress=False,
                    encoder_info=EncoderInfo(encoder_id="random:none:fp32:8", model="random",
                                             dim=8, vector_dtype="float32"))


def test_a_uuid_in_metadata_stops_the_build_before_it_writes(tmp_path):
    import uuid

    docs = [Document("a", "x", metadata={"tenant": "t1"}),
            Document("b", "y", metadata={"tenant": uuid.UUID(int=7)})]
    with pytest.raises(CorpusError,
                       match=r"'tenant' holds a UUID .* in document 'b'.*str\(value\)"):
        build_index(docs, tmp_path / "index", vectors=random_unit_vectors(2, 8), progress=False,
                    encoder_info=EncoderInfo(encoder_id="random:none:fp32:8", model="random",
                                             dim=8, vector_dtype="float32"))
    assert not (tmp_path / "index" / "CURRENT").exists()


def test_build_report_says_precomputed_vectors_were_given_not_encoded(tmp_path):
    docs = [Document(f"d{i}", f"text {i}") for i in range(5)]
    info = EncoderInfo(encoder_id="random:none:fp32:8", model="random", dim=8,
                       vector_dtype="float32")
    report = build_index(docs, tmp_path, vectors=random_unit_vectors(5, 8), encoder_info=info,
                         progress=False)
    assert (report.vectors_given, report.vectors_encoded, report.vectors_reused) == (5, 0, 0)
    assert report.describe_vectors() == "5 vectors given precomputed"
    assert "encoded" not in report.describe_vectors()
    assert np.isfinite(list(report.seconds.values())).all()
    on_disk = sum(p.stat().st_size for p in report.path.rglob("*") if p.is_file())
    assert report.size_bytes == on_disk > 0
    assert report.peak_rss_bytes > 10 * 2**20  # this process, numpy and faiss loaded
