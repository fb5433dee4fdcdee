"""Named filters: registered once, masks computed once per build (at bind time), replaced by
registering again, recomputed for a new build."""

from __future__ import annotations

import numpy as np
import pytest

from indexes.metadata import MetadataIndex
from retrieval.errors import InvalidQueryError, UnknownFieldError
from retrieval.filters import evaluate, parse_filter
from retrieval.filters.named import NamedFilters, UnknownNamedFilterError

RECORDS = [{"tenant": f"t{i % 7}", "year": 2000 + i % 20} for i in range(200)]


def test_register_get_replace_and_rebind_to_a_new_build() -> None:
    build1 = MetadataIndex.build(RECORDS)
    named = NamedFilters()
    spec = {"tenant": {"in": ["t1", "t3"]}}
    bound = named.register("acme", spec, None, build1)
    entry = bound.get("acme")
    np.testing.assert_array_equal(entry.mask, evaluate(parse_filter(spec, build1.kinds), build1))
    assert entry.allowed == int(entry.mask.sum()) and not entry.mask.flags.writeable
    assert bound.get("acme") is entry  # no work per request: a dict lookup
    bound = named.register("acme", {"year": {"gte": 2015}}, bound, build1)  # replaces
    assert bound.get("acme").allowed == 50
    bound = named.register("other", "tenant = 't0'", bound, build1)
    assert bound.get("acme").allowed == 50  # untouched by another registration
    build2 = MetadataIndex.build([{**r, "year": 2019} for r in RECORDS])
    rebound = named.bind(build2)  # at swap time: every mask for the new build
    assert rebound.get("acme").allowed == 200 and rebound.get("other").allowed == 29
    assert bound.get("acme").allowed == 50  # the old build's table is unchanged
    assert named.names() == ["acme", "other"]
    bound = named.unregister("other", rebound)
    with pytest.raises(UnknownNamedFilterError, match="other"):
        bound.get("other")


def test_bad_specs_and_names_are_refused_and_not_registered() -> None:
    build = MetadataIndex.build(RECORDS)
    named = NamedFilters(max_in_values=3)
    with pytest.raises(UnknownFieldError):
        named.register("x", {"nope": 1}, None, build)
    with pytest.raises(InvalidQueryError, match="max_in_values"):
        named.register("x", {"tenant": {"in": ["a", "b", "c", "d"]}}, None, build)
    with pytest.raises(InvalidQueryError, match="non-empty"):
        named.register("", {"year": 2001}, None, build)
    assert named.names() == []
    named.register("y", {"year": 2001}, None, build)
    with pytest.raises(UnknownFieldError):  # the new build lacks the field: the swap must not
        named.bind(MetadataIndex.build([{"tenant": "t1"}]))
    assert named.register("all", {}, None, build).get("all").mask is None  # empty: no filter
