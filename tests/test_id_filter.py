"""The ``id`` filter and fetching by id on a small root, its refusals, and a service without
keys refusing writes unless told its network is trusted."""

from __future__ import annotations

import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors
from starlette.testclient import TestClient

from indexes import Document, build_index
from indexes.errors import CorpusError
from indexes.writer import IndexWriter
from retrieval import FilterTypeError, Retriever, UnknownFieldError
from retrieval.service.app import create_app
from retrieval.service.settings import ServeConfig

LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 30)


def test_id_filters_follow_live_writes(tmp_path, docs):
    build_small(tmp_path, docs)
    vector = unit_vectors(1, 4)[0]
    with Retriever.load(tmp_path, LIVE) as retriever:
        ids = [docs[0].id, docs[5].id]
        hits = retriever.search("cells", {"id": {"in": ids}}, 10, query_vector=vector).hits
        assert sorted(h.doc_id for h in hits) == sorted(ids)
        others = retriever.search("cells", {"id": {"nin": ids}}, 30, query_vector=vector)
        assert others.allowed == len(docs) - 2
        with IndexWriter(tmp_path) as writer:
            writer.delete([docs[0].id])
            writer.upsert([Document(docs[5].id, "rewritten text"), Document("new", "new text")],
                          vectors=unit_vectors(2, 5))
        retriever.refresh()
        result = retriever.search("text", {"id": {"in": [*ids, "new"]}}, 10,
                                  query_vector=vector)
        assert sorted(h.doc_id for h in result.hits) == sorted([docs[5].id, "new"])
        assert result.allowed == 2  # the deleted and the superseded base rows count nowhere
        fetched = retriever.get_documents([docs[0].id, docs[5].id, "new"])
        assert fetched[0] is None and fetched[1].text == "rewritten text"


def test_id_refusals_name_what_to_do(tmp_path, docs):
    build_small(tmp_path, docs)
    with Retriever.load(tmp_path, LIVE) as retriever:
        with pytest.raises(FilterTypeError, match="keyword field"):
            retriever.search("cells", {"id": {"gte": "a"}}, query_vector=unit_vectors(1, 1)[0])
        with pytest.raises(UnknownFieldError, match="did you mean 'id'"):
            retriever.search("cells", {"ids": "x"}, query_vector=unit_vectors(1, 1)[0])
    with pytest.raises(CorpusError, match="'id'.*reserved"):
        build_index([Document("a", "text", metadata={"id": "x"})], tmp_path / "other",
                    vectors=unit_vectors(1, 1), encoder_info=INFO, progress=False)


def test_a_service_without_keys_refuses_writes_unless_open_writes(tmp_path, docs):
    build_small(tmp_path, docs)
    body = {"ids": [docs[1].id]}
    with TestClient(create_app(tmp_path, ServeConfig())) as client:
        refused = client.post("/v1/documents/delete", json=body)
        assert refused.status_code == 403 and "open_writes" in refused.text
    config = ServeConfig.model_validate({"server": {"open_writes": True}})
    with TestClient(create_app(tmp_path, config)) as client:
        assert client.post("/v1/documents/delete", json=body).json() == \
            {"seq": 1, "replayed": False}
        # Writes only: anyone could download the whole root as a snapshot.
        snapshot = client.post("/v1/snapshot")
        assert snapshot.status_code == 403 and "open_writes" not in snapshot.text
