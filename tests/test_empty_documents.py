"""A document's text may be empty: a build (whole, sharded or streamed) and a live write take
the same documents, and refuse the same ones, naming the document. Public corpora hold
documents with no text (two of Cranfield's, one of them judged relevant), and a document
whose vector is given may have nothing else: the live write refused what every build took.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors

from indexes import Document, build_index
from indexes.errors import CorpusError, InvalidWriteError
from indexes.shard_build import GivenRows, build_streamed
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.cli.app import main

NO_CACHE = {"cache": {"backend": "none"}}
WITHOUT_TEXT = [Document("blank", ""), Document("spaces", " \n\t "),
                Document("titled", "", "Wing flutter at subsonic speeds", {"year": 1962})]


@pytest.fixture(scope="module")
def docs(dataset) -> list[Document]:
    return scifact_docs(dataset("scifact"), 20)


def served(root: Path, ids: list[str]) -> list[Document | None]:
    with Retriever.load(root, NO_CACHE) as retriever:
        return retriever.get_documents(ids)


@pytest.mark.parametrize("document", WITHOUT_TEXT, ids=[d.id for d in WITHOUT_TEXT])
def test_a_build_and_a_write_both_take_a_document_without_text(tmp_path, docs, document):
    build_small(tmp_path / "built", [*docs, document])
    assert served(tmp_path / "built", [document.id]) == [document]
    build_small(tmp_path / "live", docs)
    vector = unit_vectors(1, 7)
    with IndexWriter(tmp_path / "live") as writer:
        writer.upsert([document], vectors=vector)
    with Retriever.load(tmp_path / "live", NO_CACHE) as retriever:
        assert retriever.get_documents([document.id]) == [document]
        found = retriever.search("cells", k=5, query_vector=vector[0])  # by its vector
        assert document.id in [hit.doc_id for hit in found.hits]
    with IndexWriter(tmp_path / "live") as writer:
        writer.compact()  # the log's document folds into a build
    assert served(tmp_path / "live", [document.id]) == [document]


@pytest.mark.parametrize("text", [None, 7])
def test_a_text_that_is_no_string_is_refused_by_a_build_and_a_write_naming_the_document(
        tmp_path, docs, text):
    bad = Document("bad", text)  # type: ignore[arg-type]
    with pytest.raises(CorpusError, match=r"document 20 \('bad'\): its text is a"):
        build_small(tmp_path / "built", [*docs, bad])
    build_small(tmp_path / "live", docs)
    with IndexWriter(tmp_path / "live") as writer:
        with pytest.raises(InvalidWriteError, match="document 'bad' has no text: give it a "
                                                    "text string"):
            writer.upsert([bad], vectors=unit_vectors(1, 7))
        assert writer.last_seq == 0


def test_sharded_and_streamed_builds_take_documents_without_text(tmp_path, docs):
    documents = [*docs, *WITHOUT_TEXT]
    vectors = unit_vectors(len(documents), 0)
    build_index(documents, tmp_path / "sharded", vectors=vectors, encoder_info=INFO, shards=2,
                dense="exact", progress=False)
    halves = [GivenRows(documents[:12], vectors[:12]), GivenRows(documents[12:], vectors[12:])]
    build_streamed(halves, tmp_path / "streamed", encoder_info=INFO, dense="exact")
    ids = [d.id for d in WITHOUT_TEXT]
    assert served(tmp_path / "sharded", ids) == WITHOUT_TEXT
    assert served(tmp_path / "streamed", ids) == WITHOUT_TEXT


def test_retrieval_build_stops_at_the_first_bad_line_naming_it_before_any_encoding(
        tmp_path, capsys):
    """The corpus is read whole before the model loads: a bad line deep in it is an error
    naming its line and document, not a traceback after hours of encoding."""
    lines = [{"_id": f"d{i}", "text": f"text {i}"} for i in range(500)]
    lines[321] = {"_id": "d321", "text": None}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "index")]) == 2
    error = capsys.readouterr().err
    assert "corpus.jsonl:322: a document needs an id ('_id') and a text string ('text'); " \
           "got id 'd321', text NoneType" in error
    assert not (tmp_path / "index" / "CURRENT").exists()

