"""Hostile input to the public search API: only typed errors, and the retriever keeps serving."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
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
