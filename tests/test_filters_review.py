"""Filters under adversarial input: the search for the closest value of absent filter values is
bounded per filter, a registered named filter is the caller's spec as registered, the syntax
check of configured filters reads past a number or a range, and other scripts' digits make no
date."""

from __future__ import annotations

import random
import string
from pathlib import Path

import numpy as np
import pytest
from live_index import build_small, unit_vectors

from indexes import Document
from indexes.metadata import MetadataIndex, value_kind
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.errors import LimitExceededError, MalformedFilterError
from retrieval.filters import evaluate, parse_filter
from retrieval.filters.hints import MAX_SUGGESTION_WORK, absent_values, closest_value
from retrieval.filters.named import NamedFilters
from retrieval.filters.parse import check_syntax
from retrieval.service import ServiceConfigError, load_serve_config


def test_closest_value_search_is_bounded_per_filter_not_per_value() -> None:
    """64 absent values in one IN list each searched all 1,000 known values (a filter of 64
    such lists over a field of 20,000 values: minutes of difflib on the request path). Every
    absent value is still warned about; only those searched before the filter's budget ran out
    get their closest value."""
    index = MetadataIndex.build([{"dept": f"department-{i:04d}"} for i in range(1000)])
    typos = [f"departmnt-{i:04d}" for i in range(64)]
    found = absent_values(parse_filter({"dept": {"in": typos}}, index.kinds), index)
    assert sorted(a.value for a in found) == typos
    suggested = [a for a in found if a.closest is not None]
    assert suggested and suggested[0].closest == suggested[0].value.replace("departmnt",
                                                                            "department")
    assert len(suggested) < len(typos)
    assert [a.value for a in suggested] == typos[:len(suggested)]
    assert all(a.closest == a.value.replace("departmnt", "department") for a in suggested)


def _random_values(alphabet: str, count: int, length: int = 100) -> list[str]:
    rng = random.Random(7)
    return sorted("".join(rng.choice(alphabet) for _ in range(length)) for _ in range(count))


def test_the_closest_value_search_counts_the_work_of_values_over_a_few_characters() -> None:
    """The work was foretold as (value + 16) x (known value + 16) character pairs, the same
    for every alphabet; over two characters difflib's matcher visits ~4x the positions it
    does over 26 (each position holding a character, at every level of its recursion), and
    took ~0.7 s where the budget meant ~0.15 s. The steps counted as it runs tell them apart."""
    work: dict[str, int] = {}
    for alphabet in ("ab", string.ascii_lowercase):
        known = _random_values(alphabet, 50)
        work[alphabet] = closest_value(known[0][::-1], known, 10**9)[1]
    assert work["ab"] >= 3 * work[string.ascii_lowercase]
    known = _random_values("ab", 50)
    assert closest_value(known[0][::-1], known, 1000) == (None, 1000)  # stopped at its budget


def test_a_closest_value_past_the_budget_is_withheld_for_values_over_a_few_characters(
) -> None:
    """500 hundred-character values of two characters fit the foretold budget; searching
    them took ~0.6 s. The search now stops at the budget, and the value is still warned
    about, with no closest value."""
    known = _random_values("ab", 500)
    typo = known[0][:50] + {"a": "b", "b": "a"}[known[0][50]] + known[0][51:]
    assert closest_value(typo, known[:20], MAX_SUGGESTION_WORK)[0] == known[0]
    index = MetadataIndex.build([{"code": value} for value in known])
    (found,) = absent_values(parse_filter({"code": typo}, index.kinds), index)
    assert found.value == typo and found.closest is None
    assert "did you mean" not in found.message()


def test_an_absent_value_named_twice_is_warned_about_once() -> None:
    index = MetadataIndex.build([{"dept": "cardiology"}, {"dept": "oncology"}])
    node = parse_filter({"$or": [{"dept": "cardiolgy"}, {"$not": {"dept": "cardiolgy"}}]},
                        index.kinds)
    assert [a.message() for a in absent_values(node, index)] == [
        "no document has dept = 'cardiolgy'; did you mean 'cardiology'?"]


def test_a_named_filter_keeps_the_spec_it_was_registered_with() -> None:
    """The registry kept the caller's list: appending to it changed the filter at the next
    bind, and a value of the wrong type made every bind fail."""
    build = MetadataIndex.build([{"tenant": f"t{i % 5}"} for i in range(50)])
    named = NamedFilters()
    tenants = ["t1"]
    assert named.register("acme", {"tenant": {"in": tenants}}, None, build).get("acme").allowed \
        == 10
    tenants.append("t2")
    assert named.bind(build).get("acme").allowed == 10
    tenants.append(3)
    rebound = named.bind(build)
    np.testing.assert_array_equal(rebound.get("acme").mask,
                                  evaluate(parse_filter({"tenant": "t1"}, build.kinds), build))


def test_a_live_write_is_served_after_the_caller_changed_a_registered_spec(
        tmp_path: Path) -> None:
    """Each live write binds the named filters again: the caller's changed list was read
    there, and one holding a number stopped every later write from being served."""
    docs = [Document(f"d{i}", f"wings {i}", metadata={"tenant": f"t{i % 4}"}) for i in range(20)]
    build_small(tmp_path, docs)
    config = {"cache": {"backend": "none"}, "live_lag_seconds": None, "vector_weight": 0.0}
    tenants = ["t1"]
    with Retriever.load(tmp_path, config) as retriever, IndexWriter(tmp_path) as writer:
        assert retriever.register_filter("acme", {"tenant": {"in": tenants}}) == 5
        tenants += ["t2", 7]
        writer.upsert([Document("n1", "wings", metadata={"tenant": "t1"})],
                      vectors=unit_vectors(1, 3))
        assert retriever.refresh()
        assert retriever.named_filters() == {"acme": 6}
        hits = retriever.search("wings", {"$named": "acme"}, k=20,
                                query_vector=unit_vectors(1, 4)[0]).hits
        assert {hit.doc_id for hit in hits} == {"d1", "d5", "d9", "d13", "d17", "n1"}


@pytest.mark.parametrize(("spec", "error", "fixed"), [
    ("year >= 2010 AND department = = x", MalformedFilterError,
     "year >= 2010 AND department = 'x' AND tags CONTAINS 3"),
    ("year >= 2010 AND (department = 'x'", MalformedFilterError,
     "year >= 2010 AND (department = 'x')"),
    ({"year": 2001, "department": {"in": "cardiology"}}, MalformedFilterError,
     {"year": 2001, "department": {"in": ["cardiology"]}, "tags": {"all": ["a", 1]}}),
    ({"year": {"gte": 2010}, "department": {"bogus": "x"}}, MalformedFilterError,
     {"year": {"in": [1, 2.5]}, "published": {"lt": "2020-01-01"},
      "$not": {"reviewer": {"exists": True}}}),
    ({"$or": [{"year": {"gte": 2010}}, *({"tenant": f"t{i}"} for i in range(70))]},
     LimitExceededError, {"$or": [{"year": {"gte": 2010}}, {"tenant": {"in": ["t1", "t2"]}}]}),
])
def test_the_syntax_check_reads_past_a_number_or_a_range(spec: object, error: type,
                                                         fixed: object) -> None:
    """Every field was taken for a keyword field, so a range or a number on one was a type
    error, which the check passes (the build's to judge): what followed went unchecked. The
    fields' kinds and values are still left to the build."""
    with pytest.raises(error):
        check_syntax(spec)
    check_syntax(fixed)


def test_a_configured_filter_with_a_range_and_a_syntax_error_stops_start_up(
        tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[named_filters]\ntenant = 'year >= 2010 AND department = = x'\n")
    with pytest.raises(ServiceConfigError, match="filter syntax error at position 30"):
        load_serve_config(path, {})


@pytest.mark.parametrize("text", ["２０２０-０１-３１", "٢٠٢٠-٠١-٣١", "2020-01-31T１２:00"])
def test_other_scripts_digits_make_a_keyword_not_a_date(text: str) -> None:
    """``\\d`` matched them: the build refused the field as dates that do not convert."""
    assert value_kind(text) == "keyword"
    index = MetadataIndex.build([{"code": text}, {"code": "2020-01-31"}])
    assert index.kinds == {"code": "keyword"}
    mask = evaluate(parse_filter({"code": text}, index.kinds), index)
    assert mask.tolist() == [True, False]
    assert MetadataIndex.build([{"code": "2020-01-31"}]).kinds == {"code": "date"}
