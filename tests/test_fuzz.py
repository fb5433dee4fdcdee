"""Hostile input to the public search API: only typed errors, and the retriever keeps serving."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.errors import EncoderMismatchError, QueryDimensionError
from retrieval import InvalidQueryError, LimitExceededError, Retriever, RetrieverConfig

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20,
)
field_names = st.sampled_from(["department", "doc_type", "year", "$and", "$or", "$not", "nope"])
operators = st.sampled_from(["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "between"])
filters = st.one_of(
    st.none(),
    st.text(max_size=200),
    json_values,
    st.dictionaries(field_names, st.one_of(json_values, st.dictionaries(operators, json_values,
                                                                        max_size=3)),
                    max_size=4),
    st.builds(lambda v: {"year": {"gte": v}},
              st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0])),
)
queries = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
    st.sampled_from(["\x00\x01\x02", "\u202e\u200b", " " * 50, "a" * 5000, "\ud800",
                     "cell " * 2000]),
    json_scalars,
)
ks = st.one_of(st.integers(-5, 2000), st.none(), st.floats(), st.text(max_size=3), st.booleans())


@pytest.fixture(scope="module")
def root(dataset, tmp_path_factory, build_subset):
    docs = list(itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 200))
    path = tmp_path_factory.mktemp("fuzz")
    build_subset(docs, path)
    return path


@pytest.fixture(scope="module")
def retriever(root, encoder):
    return Retriever.load(root, RetrieverConfig(), encoder=encoder)


@pytest.mark.parametrize(
    ("limits", "call", "message"),
    [
        ({"max_query_chars": 20}, {"query": "x" * 21}, "max_query_chars"),
        ({"max_query_tokens": 3}, {"query": "cell protein gene tissue"}, "max_query_tokens"),
        ({"max_k": 5}, {"query": "cell", "k": 6}, "max_k"),
        ({"max_candidates": 50}, {"query": "cell", "candidates": 51}, "max_candidates"),
        ({"max_filter_clauses": 2},
         {"query": "cell", "filters": {"year": 1, "department": "x", "doc_type": "y"}}, "clause"),
        ({"max_in_values": 3},
         {"query": "cell", "filters": {"department": {"in": ["a", "b", "c", "d"]}}}, "3"),
    ],
)
def test_each_limit_is_a_typed_error(root, encoder, limits, call, message):
    limited = Retriever.load(root, {"limits": limits, "candidates": 10}, encoder=encoder)
    with pytest.raises(LimitExceededError, match=message):
        limited.search(**call)
    batch = {**call, "queries": ["cell", call["query"]]}
    del batch["query"]
    with pytest.raises(LimitExceededError, match=message) as raised:
        limited.search_batch(**batch)
    # A query's own limit names its position; one on what the queries share (k, candidates,
    # filters) names no query.
    assert ("query 1 of the batch: " in str(raised.value)) == ("query" in message)
    assert limited.search("cell", k=2).hits


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(query=queries, filters=filters, k=ks)
def test_search_raises_only_typed_errors(retriever, query, filters, k):
    try:
        result = retriever.search(query, filters=filters, k=k)
    except InvalidQueryError:
        pass
    else:
        assert len(result.hits) <= (k if isinstance(k, int) else 10)
    assert retriever.search("cell differentiation", k=3).hits  # still serving


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(queries, max_size=4), filters=filters)
def test_search_batch_raises_only_typed_errors(retriever, batch, filters):
    try:
        retriever.search_batch(batch, filters=filters, k=5)
    except InvalidQueryError:
        pass
    assert retriever.search("protein", k=2).hits


def _vector(retriever: Retriever) -> np.ndarray:
    return retriever.snapshot.vectors.reconstruct_rows(np.array([0]))[0]


@pytest.mark.parametrize("bad", ["nan", "inf", "2-D", "complex", "strings", "short", "zeros"])
def test_a_query_vector_that_is_not_one_vector_of_finite_numbers_is_refused(retriever, bad):
    good = _vector(retriever)
    vector = {"nan": np.where(np.arange(good.size) == 3, np.nan, good),
              "inf": np.where(np.arange(good.size) == 0, np.inf, good),
              "2-D": good.reshape(2, -1),
              "complex": good.astype(np.complex64),
              "strings": ["x"] * good.size,
              "short": good[:-1],
              "zeros": np.zeros_like(good)}[bad]
    # Another dimension is bad input like the rest (it was an EncoderMismatchError only, which
    # code catching InvalidQueryError let through); it still is an encoder mismatch too.
    error = QueryDimensionError if bad == "short" else InvalidQueryError
    with pytest.raises(error) as refused:
        retriever.search("cell", k=3, query_vector=vector)
    assert isinstance(refused.value, InvalidQueryError)
    assert isinstance(refused.value, EncoderMismatchError) == (bad == "short")
    with pytest.raises(error, match="query 1 of the batch"):
        retriever.search_batch(["cell", "gene"], k=3, query_vectors=[good, vector])
    # One vector as a row or a column is still one vector.
    assert retriever.search("cell", k=3, query_vector=good.reshape(1, -1)).hits
    assert retriever.search("cell", k=3, query_vector=good.reshape(-1, 1)).hits


def test_a_query_vectors_length_does_not_change_its_scores(retriever):
    """Hits' vector scores are cosines: a vector 3x as long tripled them, and with them the
    relevance estimate and what min_score keeps."""
    good = _vector(retriever)
    good = good / np.linalg.norm(good)
    unit, longer = (retriever.search("cell", k=5, query_vector=v) for v in (good, 3 * good))
    assert [h.doc_id for h in longer.hits] == [h.doc_id for h in unit.hits]
    for scores in (lambda h: h.vector_score, lambda h: h.relevance):
        assert list(map(scores, longer.hits)) == pytest.approx(list(map(scores, unit.hits)))
    assert max(h.vector_score for h in longer.hits) <= 1.0 + 1e-6


def test_a_batch_is_a_list_with_one_vector_per_query(retriever):
    good = _vector(retriever)
    with pytest.raises(InvalidQueryError, match="list of query strings, not a str"):
        retriever.search_batch("cell", k=3)
    with pytest.raises(InvalidQueryError, match="not a generator"):
        retriever.search_batch(q for q in ["cell"])
    with pytest.raises(InvalidQueryError, match="2 rows for 3 queries"):
        retriever.search_batch(["a", "b", "c"], k=3, query_vectors=np.stack([good, good]))
    with pytest.raises(InvalidQueryError, match="one row per query"):
        retriever.search_batch(["a"], k=3, query_vectors=good)
    results = retriever.search_batch(["cell", "gene"], k=3, query_vectors=np.stack([good, good]))
    assert [len(r.hits) for r in results] == [3, 3]


@pytest.mark.parametrize("seq", ["5", 1.5, math.nan, -1, True])
def test_min_seq_is_a_write_seq(retriever, seq):
    with pytest.raises(InvalidQueryError, match="min_seq must be a non-negative integer"):
        retriever.search("cell", k=3, min_seq=seq)
    with pytest.raises(InvalidQueryError, match="min_seq must be a non-negative integer"):
        asyncio.run(retriever.asearch("cell", k=3, min_seq=seq))
    assert retriever.search("cell", k=3, min_seq=0).hits


def test_a_numpy_integer_is_an_integer(retriever):
    good = _vector(retriever)
    assert len(retriever.search("cell", k=np.int64(4), candidates=np.int32(50),
                                query_vector=good).hits) == 4
    limited = Retriever.load(retriever.root, {"limits": {"max_batch_hits": 5}})
    with pytest.raises(LimitExceededError, match="max_batch_hits"):
        limited.search_batch(["a", "b"], k=np.int64(3), query_vectors=np.stack([good, good]))


@pytest.mark.parametrize("invisible", ["\u200b", "\x00", " \u200d\ufeff\t"])
def test_a_query_of_invisible_characters_is_empty(retriever, invisible):
    """What the tokenizers delete (zero-width and control characters) was ranked by the
    vector of an empty text."""
    with pytest.raises(InvalidQueryError, match="query is empty"):
        retriever.search(invisible, k=3)
    assert retriever.search("cell\u200b", k=3).hits  # among visible characters they are fine


def test_a_bad_query_in_a_batch_is_named_by_its_position(retriever):
    with pytest.raises(InvalidQueryError, match="query 1 of the batch: query is empty"):
        retriever.search_batch(["cell", "   ", "gene"], k=3)
