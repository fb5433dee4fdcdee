"""Integers a number field cannot hold exactly: float64 keeps every integer up to 2**53, past
it neighbours share a value, so a filter on an account number matched the next account's
documents too. A build, a live write and a filter refuse such a value with the fix (store it
as a string); integers float64 does hold exactly, however large, still work."""

from __future__ import annotations

import pytest
from live_index import INFO, unit_vectors

from indexes import Document, build_index
from indexes.errors import CorpusError, InvalidWriteError
from indexes.writer import IndexWriter
from retrieval import FilterTypeError, Retriever

BIG = 2 ** 53 + 1
LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}


def build(root, values) -> None:
    docs = [Document(f"d{i}", f"account statement {i}", metadata={"account": v})
            for i, v in enumerate(values)]
    build_index(docs, root, vectors=unit_vectors(len(docs), 1), encoder_info=INFO,
                progress=False)


def test_a_build_refuses_an_integer_its_number_field_would_round(tmp_path):
    with pytest.raises(CorpusError, match=r"row 1: field 'account': 9007199254740993 is an "
                                          r"integer a number field cannot hold exactly"):
        build(tmp_path, [1, BIG, 3])


@pytest.fixture
def root(tmp_path):
    build(tmp_path, [2 ** 53, 2 ** 60, 7])  # both large ones are exact in float64
    return tmp_path


def test_exact_large_integers_filter_exactly(root):
    with Retriever.load(root, LIVE) as retriever:
        vector = unit_vectors(1, 2)[0]
        for spec, expected in (({"account": 2 ** 60}, ["d1"]), (f"account = {2 ** 53}", ["d0"]),
                               ({"account": {"gt": 2 ** 53}}, ["d1"])):
            hits = retriever.search("account", spec, 5, query_vector=vector).hits
            assert sorted(h.doc_id for h in hits) == expected, spec


@pytest.mark.parametrize("spec", [{"account": BIG}, {"account": {"gt": BIG}},
                                  {"account": {"in": [7, BIG]}}, f"account = {BIG}",
                                  f"account > {-BIG}"])
def test_a_filter_on_an_integer_no_float_holds_is_refused(root, spec):
    with Retriever.load(root, LIVE) as retriever, \
            pytest.raises(FilterTypeError, match="cannot hold exactly"):
        retriever.search("account", spec, 5, query_vector=unit_vectors(1, 2)[0])


def test_a_live_write_refuses_it_and_logs_nothing(root):
    with IndexWriter(root) as writer:
        before = writer.last_seq
        with pytest.raises(InvalidWriteError, match="'account': 9007199254740993 is an"):
            writer.upsert([Document("x", "new statement", metadata={"account": BIG})],
                          vectors=unit_vectors(1, 3))
        assert writer.last_seq == before
