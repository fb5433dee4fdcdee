"""Live writes on a passage build: refused with a typed error and nothing written, by the
writer, by compaction and by a serving process, because the log does not split documents
into passages yet and a write by id would leave a document's other passages serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors

from indexes import BuildConfig, Document, PassageConfig, build_index, default_model_path
from indexes.errors import InvalidWriteError
from indexes.long_documents import split_documents
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.passages import TokenCounter
from indexes.wal import IndexWriter, read_all, segments
from retrieval import Retriever

PASSAGES = PassageConfig(max_tokens=64, overlap_tokens=8)


@pytest.fixture(scope="module")
def docs(dataset) -> list[Document]:
    return scifact_docs(dataset("scifact"), 20)


def build_passages(root: Path, docs: list[Document]) -> int:
    """A passage build of ``docs`` under ``root`` (random vectors); returns its row count."""
    rows, *_ = split_documents(docs, TokenCounter.for_model(default_model_path()), PASSAGES)
    build_index(docs, root, vectors=unit_vectors(len(rows), 1), encoder_info=INFO,
                config=BuildConfig(passages=PASSAGES), progress=False)
    return len(rows)


def log_size(root: Path) -> int:
    return sum(path.stat().st_size for _, path in segments(root))


def test_writes_to_a_passage_build_are_refused_and_nothing_is_written(tmp_path, docs):
    n_rows = build_passages(tmp_path, docs)
    assert n_rows > len(docs)  # documents really are split: a write by id would be partial
    with IndexWriter(tmp_path) as writer:
        with pytest.raises(InvalidWriteError, match="passage build.*rebuild"):
            writer.upsert([{"id": docs[0].id, "text": "a new text"}],
                          vectors=unit_vectors(1, 2))
        with pytest.raises(InvalidWriteError, match="passage build.*rebuild"):
            writer.delete([docs[1].id])
        assert writer.last_seq == 0
    assert log_size(tmp_path) == 0 and read_all(tmp_path) == []


def test_records_left_under_a_passage_build_are_neither_folded_nor_served(tmp_path, docs):
    """A root written to while unsplit, then rebuilt with passages (the log position is
    carried forward): its pending records are refused by compaction and by serving."""
    build_small(tmp_path, docs)
    with IndexWriter(tmp_path) as writer:
        writer.delete([docs[0].id])
    build_passages(tmp_path, docs)
    assert read_manifest(resolve_build_dir(tmp_path)).log_seq == 0
    with IndexWriter(tmp_path) as writer, pytest.raises(InvalidWriteError,
                                                        match="passage build"):
        writer.compact()
    assert len(read_all(tmp_path)) == 1  # the record is kept, not dropped
    with pytest.raises(InvalidWriteError, match="apply the write-ahead log"):
        Retriever.load(tmp_path, {"live_lag_seconds": None})
    # the build itself is intact and searchable without the log
    build = resolve_build_dir(tmp_path)
    with Retriever.load(build) as retriever:
        hits = retriever.search(docs[0].title, k=3, query_vector=unit_vectors(1, 3)[0],
                                group_by="document").hits
        assert len({hit.doc_id for hit in hits}) == 3 and np.isfinite(hits[0].score)
