"""A cache hit written as JSON from its entry's shared pieces: the same bytes as pydantic's."""

from __future__ import annotations

import pickle

import pytest
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from retrieval import Retriever
from retrieval.models import SearchResult
from retrieval.result_json import SharedFields, result_json

FILTER = {"year": {"gte": 1990}}


@pytest.fixture(scope="module")
def retriever(index, query_encoder):
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=query_encoder) as r:
        yield r


@pytest.mark.parametrize("filters", [None, FILTER])
def test_hits_write_the_bytes_pydantic_writes(retriever, filters) -> None:
    for query in QUERIES:
        miss = retriever.search(query, filters, k=7)
        assert miss.cache.result == "miss"
        assert result_json(miss) == miss.model_dump_json().encode()
        for _ in range(2):  # the first hit dumps the shared pieces, the second reuses them
            hit = retriever.search(query + "  ", filters, k=7)  # same key, its own query text
            assert hit.cache.result == "hit"
            assert isinstance(hit._shared, SharedFields)
            assert result_json(hit) == hit.model_dump_json().encode()
            assert SearchResult.model_validate_json(result_json(hit)).query == query + "  "


def test_passage_hits_grouped_with_context(passage_roots, encoder) -> None:
    with Retriever.load(passage_roots("passages"), encoder=encoder) as retriever:
        for _ in range(2):
            hit = retriever.search("cell differentiation", k=5, group_by="document", context=1)
    assert hit.cache.result == "hit" and hit.hits[0].context is not None
    assert result_json(hit) == hit.model_dump_json().encode()


def test_a_hit_whose_shared_fields_changed_is_dumped_whole(retriever) -> None:
    query = QUERIES[1]
    retriever.search(query, k=6)
    hit = retriever.search(query, k=6)
    assert hit.cache.result == "hit" and len(hit.hits) > 2
    hit.hits.reverse()  # the caller's own list: the shared entry must not leak into it
    assert result_json(hit) == hit.model_dump_json().encode()
    fewer = hit.model_copy(update={"hits": hit.hits[:2], "build_id": "elsewhere"})
    assert result_json(fewer) == fewer.model_dump_json().encode()
    assert b"elsewhere" in result_json(fewer)
    again = retriever.search(query, k=6)  # the entry itself is untouched
    assert [h.doc_id for h in again.hits] == [h.doc_id for h in reversed(hit.hits)]
    assert result_json(again) == again.model_dump_json().encode()


def test_the_mark_changes_neither_equality_nor_pickling(retriever) -> None:
    retriever.search(QUERIES[2], k=4)
    hit = retriever.search(QUERIES[2], k=4)
    assert isinstance(hit._shared, SharedFields)
    parsed = SearchResult.model_validate_json(hit.model_dump_json())
    assert parsed._shared is None
    assert parsed == hit and hit == parsed
    unpickled = pickle.loads(pickle.dumps(hit))
    assert unpickled._shared is None and unpickled == hit
    assert result_json(unpickled) == hit.model_dump_json().encode()
