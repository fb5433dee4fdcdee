"""Filter values and fields a build and a live write agree on: a boolean is no document id
(whatever a keyword field makes of one), and a field holding nothing but empty lists is a
keyword field after a build, after a live write and after its compaction."""

from __future__ import annotations

from pathlib import Path

import pytest
from live_index import build_small, scifact_docs, unit_vectors

from indexes import Document
from indexes.errors import SchemaMismatchError
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.wal import read_all
from indexes.writer import IndexWriter
from retrieval import FilterTypeError, Retriever
from retrieval.filters import Eq, evaluate

LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}
# On a field no document holds a value of: none holds "x", every one lacks a value.
EMPTY_FIELD_SPECS = [{"labels": "x"}, {"labels": {"in": ["x", "y"]}}, "NOT labels = 'x'",
                     {"labels": {"exists": False}}, {"labels": {"exists": True}},
                     {"labels": {"all": ["x"]}}]


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 12)


def test_a_boolean_is_no_document_id(tmp_path: Path, docs: list[Document]) -> None:
    """``{"id": True}`` was coerced as a keyword field's value is, to "true", and matched the
    document whose id is that string. A boolean (or a number) is a FilterTypeError saying to
    quote the id; the strings still match, and a hand-built filter is checked alike
    (``str(True)`` is "True")."""
    build_small(tmp_path, [Document("true", docs[0].text), Document("false", docs[1].text),
                           *docs[2:]])
    vector = unit_vectors(1, 1)[0]
    with Retriever.load(tmp_path, LIVE) as retriever:
        for spec in ({"id": True}, {"id": {"in": ["false", True]}}, {"id": {"nin": [False]}},
                     "id = true", "id IN ('true', false)"):
            with pytest.raises(FilterTypeError, match="'id' is the document id, a string"):
                retriever.search("cells", spec, 5, query_vector=vector)
        with pytest.raises(FilterTypeError, match=r"quote the id: \{'id': '7'\}"):
            retriever.search("cells", {"id": 7}, 5, query_vector=vector)
        hits = retriever.search("cells", {"id": {"in": ["true", "false"]}}, 5,
                                query_vector=vector).hits
        assert sorted(hit.doc_id for hit in hits) == ["false", "true"]
        with pytest.raises(FilterTypeError, match="not bool True"):
            evaluate(Eq("id", True), retriever.snapshot.metadata)


def _filtered(root: Path) -> list[list[str]]:
    """Each of ``EMPTY_FIELD_SPECS``'s hits (every allowed document: k is past them all)."""
    vector = unit_vectors(1, 1)[0]
    with Retriever.load(root, LIVE) as retriever:
        assert retriever.snapshot.metadata.kinds["labels"] == "keyword"
        return [sorted(hit.doc_id for hit in retriever.search(
            "cells", spec, 50, query_vector=vector).hits) for spec in EMPTY_FIELD_SPECS]


def test_a_field_of_only_empty_lists_filters_alike_after_a_build_and_a_live_write(
        tmp_path: Path, docs: list[Document]) -> None:
    """A build makes a field holding nothing but empty lists a keyword field (of labels yet
    to come); a live write adding one made no field, and every filter on it was an
    UnknownFieldError until a compaction made it the build's keyword field."""
    labelled = [Document(d.id, d.text, d.title, {**d.metadata, "labels": []}) for d in docs[8:]]
    build_small(tmp_path / "built", docs[:8] + labelled)
    build_small(tmp_path / "live", docs[:8], allow_new_fields=True)
    with IndexWriter(tmp_path / "live") as writer:
        writer.upsert(labelled, vectors=unit_vectors(len(labelled), 2))
        assert writer.kinds["labels"] == "keyword"
    built = _filtered(tmp_path / "built")
    everyone = sorted(d.id for d in docs)
    assert built == [[], [], everyone, everyone, [], []]
    assert _filtered(tmp_path / "live") == built
    with IndexWriter(tmp_path / "live") as writer:  # a reopened writer decides it from the log
        assert writer.kinds["labels"] == "keyword"
        writer.compact()
    assert read_manifest(resolve_build_dir(tmp_path / "live")).metadata_fields["labels"] == \
        "keyword"
    assert _filtered(tmp_path / "live") == built


def test_an_empty_list_on_a_fixed_schema_is_no_value_and_adds_no_field(
        tmp_path: Path, docs: list[Document]) -> None:
    """Where the schema takes no new fields, an empty list is no value: refusing it refused a
    write clearing a field the build stores unindexed (lists of numbers), and making a field
    of it let a typo given ``[]`` add one, which then took values. A nested object is stored
    and makes none either."""
    corpus = [Document(d.id, d.text, d.title, {**d.metadata, "scores": [1, 2]})
              for d in docs[:8]]
    build_small(tmp_path, corpus)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("n1", "text", metadata={"labels": [], "scores": []})],
                      vectors=unit_vectors(1, 1))
        writer.upsert([Document("n2", "text", metadata={"notes": {"free": "form"}})],
                      vectors=unit_vectors(1, 1))
        assert not {"labels", "scores", "notes"} & set(writer.kinds)
        with pytest.raises(SchemaMismatchError, match="'labels' is not in the index's schema"):
            writer.upsert([Document("n3", "text", metadata={"labels": ["a"]})],
                          vectors=unit_vectors(1, 1))
    with IndexWriter(tmp_path) as reopened:  # the kinds read back from the log agree
        assert not {"labels", "scores", "notes"} & set(reopened.kinds)
    assert [record.seq for record in read_all(tmp_path)] == [1, 2]


@pytest.mark.parametrize("spec", [{"id": None}, {"id": {"in": ["a", None]}}])
def test_a_null_id_is_told_every_document_has_one(spec: object) -> None:
    """A null id got the message of any keyword field ("give a keyword value"), though no
    document lacks an id and the id is a string."""
    from retrieval.filters import parse_filter

    with pytest.raises(FilterTypeError, match=r"every document has an id; give one as a "
                                              r"string, e\.g\. \{'id': 'doc-1'\}"):
        parse_filter(spec, {"lang": "keyword"})


def test_a_null_value_points_to_exists_for_documents_without_one() -> None:
    from retrieval.filters import parse_filter

    with pytest.raises(FilterTypeError, match=r"give a keyword value, or "
                                              r"\{'lang': \{'exists': False\}\} for documents"):
        parse_filter({"lang": None}, {"lang": "keyword"})
