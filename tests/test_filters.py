"""Filter language: numpy evaluation vs a naive evaluator, dict/DSL equivalence, errors, fuzzing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes.mask_cache import footprint
from indexes.metadata import MetadataIndex
from retrieval.errors import (
    FilterTypeError,
    InvalidQueryError,
    LimitExceededError,
    MalformedFilterError,
    UnknownFieldError,
)
from retrieval.filters import (
    And,
    Eq,
    In,
    Not,
    Or,
    Range,
    canonical,
    evaluate,
    evaluate_counted,
    parse_filter,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEPTS = ["cardiology", "oncology", "neurology"]
TAGS = ["a", "b", "c"]
DATES = ["2019-12-31", "2020-01-01", "2020-01-01T12:00:00Z", "2021-06-15T08:30:00+02:00"]
SCORES = [-1.5, 0.0, 0.5, 2.0, 3.25]
KEYWORD_FIELDS = {"dept", "tags", "retracted"}

FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "dept": st.sampled_from(DEPTS),
    "tags": st.lists(st.sampled_from(TAGS), max_size=3),
    "retracted": st.booleans(),
    "year": st.integers(2015, 2020),
    "score": st.sampled_from(SCORES),
    "published": st.sampled_from(DATES),
}
# Every field of the first record is set, so every kind is inferred; later ones miss fields.
FULL_RECORD = st.fixed_dictionaries(FIELD_VALUES)
RECORD = st.fixed_dictionaries(
    {}, optional={f: st.none() | s if f in ("dept", "year") else s for f, s in FIELD_VALUES.items()}
)
FILTER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "dept": st.sampled_from([*DEPTS, "other"]),
    "tags": st.sampled_from([*TAGS, "z"]),
    "retracted": st.booleans() | st.sampled_from(["true", "false"]),
    "year": st.integers(2014, 2021) | st.floats(2014, 2021),
    "score": st.sampled_from(SCORES) | st.floats(-2, 4),
    "published": st.sampled_from(
        [*DATES, "2020-06-01", date(2020, 1, 1), datetime(2019, 12, 31),
         datetime(2020, 1, 1, 12, tzinfo=UTC)]
    ),
}
SAMPLE_RECORDS = [
    {"dept": "cardiology", "tags": ["a", "b"], "retracted": False, "year": 2012,
     "score": 1.5, "published": "2020-01-01", "doc_type": "review"},
    {"dept": "oncology", "tags": ["c"], "retracted": True, "year": 2018, "score": 0.5,
     "published": "2021-06-15T08:30:00Z", "doc_type": "trial"},
    {"dept": "oncology", "year": 2005, "doc_type": "trial"},
    {"dept": "neurology", "retracted": False, "doc_type": "case"},
    {},
]
SAMPLE = MetadataIndex.build(SAMPLE_RECORDS)
KINDS = SAMPLE.kinds


# --- strategies for filter specs in the dict language ---


def leaf_specs(field: str, kind: str) -> st.SearchStrategy[dict[str, Any]]:
    value = FILTER_VALUES[field]
    forms = [
        value.map(lambda v: {field: v}),
        st.tuples(st.sampled_from(["eq", "ne"]), value).map(lambda p: {field: {p[0]: p[1]}}),
        st.tuples(st.sampled_from(["in", "nin"]), st.lists(value, max_size=4)).map(
            lambda p: {field: {p[0]: p[1]}}
        ),
    ]
    if kind != "keyword":
        ops = st.dictionaries(st.sampled_from(["gt", "gte", "lt", "lte", "ne"]), value,
                              min_size=1, max_size=3)
        forms.append(ops.map(lambda o: {field: o}))
    return st.one_of(forms)


def merge(pair: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    a, b = pair
    return {**a, **b} if not a.keys() & b.keys() else {"$and": [a, b]}


def filter_specs(kinds: Mapping[str, str]) -> st.SearchStrategy[dict[str, Any]]:
    leaves = st.one_of([leaf_specs(f, k) for f, k in sorted(kinds.items())])
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, min_size=1, max_size=3).map(lambda cs: {"$and": cs}),
            st.lists(kids, min_size=1, max_size=3).map(lambda cs: {"$or": cs}),
            kids.map(lambda c: {"$not": c}),
            st.tuples(kids, kids).map(merge),
        ),
        max_leaves=8,
    )


# --- an independent, obviously-correct evaluator over the dict spec ---


def keyword(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


def epoch(value: Any) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    elif not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def naive(spec: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(naive_key(key, value, record) for key, value in spec.items())


def naive_key(key: str, value: Any, record: dict[str, Any]) -> bool:
    if key == "$and":
        return all(naive(child, record) for child in value)
    if key == "$or":
        return any(naive(child, record) for child in value)
    if key == "$not":
        return not naive(value, record)
    ops = value if isinstance(value, dict) else {"eq": value}
    return all(naive_op(key, op, arg, record) for op, arg in ops.items())


def naive_op(field: str, op: str, arg: Any, record: dict[str, Any]) -> bool:
    if op in ("ne", "nin"):
        return not naive_op(field, op[1:] if op == "nin" else "eq", arg, record)
    if op == "in":
        return any(naive_op(field, "eq", a, record) for a in arg)
    raw = record.get(field)
    if raw is None:
        return False
    if field in KEYWORD_FIELDS:
        return keyword(arg) in {keyword(v) for v in (raw if isinstance(raw, list) else [raw])}
    x, y = (epoch(raw), epoch(arg)) if field == "published" else (float(raw), float(arg))
    return {"eq": x == y, "gt": x > y, "gte": x >= y, "lt": x < y, "lte": x <= y}[op]


# --- renderers: the same spec as a DSL string, and with every order reversed ---

SYMBOLS = {"eq": "=", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, date):
        return json.dumps(value.isoformat())
    return json.dumps(value, ensure_ascii=False)


def to_dsl(spec: dict[str, Any]) -> str:
    return " AND ".join(dsl_term(key, value) for key, value in spec.items())


def dsl_term(key: str, value: Any) -> str:
    if key == "$and":
        return " AND ".join(to_dsl(child) for child in value)
    if key == "$or":  # AND binds tighter than OR: children need no parentheses of their own
        return "(" + " OR ".join(to_dsl(child) for child in value) + ")"
    if key == "$not":
        return f"NOT ({to_dsl(value)})"
    ops = value if isinstance(value, dict) else {"eq": value}
    terms = []
    for op, arg in ops.items():
        if op in ("in", "nin"):
            listed = ", ".join(literal(v) for v in arg)
            terms.append(f"{key} {'IN' if op == 'in' else 'NOT IN'} ({listed})")
        else:
            terms.append(f"{key} {SYMBOLS[op]} {literal(arg)}")
    return " AND ".join(terms)


def reversed_spec(spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: reversed_spec(v) for k, v in reversed(spec.items())}
    if isinstance(spec, list):
        return [reversed_spec(v) for v in reversed(spec)]
    return spec


# --- (1) + (2) properties ---


@SETTINGS
@given(FULL_RECORD, st.lists(RECORD, max_size=25), st.data())
def test_evaluate_matches_naive_and_forms_agree(
    first: dict[str, Any], rest: list[dict[str, Any]], data: st.DataObject
) -> None:
    records = [first, *rest]
    index = MetadataIndex.build(records)
    spec = data.draw(filter_specs(index.kinds), label="spec")
    parsed = parse_filter(spec, index.kinds)
    assert parsed is not None
    expected = np.array([naive(spec, r) for r in records], dtype=bool)
    mask = evaluate(parsed, index)
    assert mask.dtype == np.bool_ and mask.shape == (len(records),)
    np.testing.assert_array_equal(mask, expected)

    reordered = parse_filter(reversed_spec(spec), index.kinds)
    assert reordered is not None and canonical(reordered) == canonical(parsed)
    dsl = to_dsl(spec)
    from_dsl = parse_filter(dsl, index.kinds)
    assert from_dsl is not None, dsl
    assert canonical(from_dsl) == canonical(parsed), dsl
    np.testing.assert_array_equal(evaluate(from_dsl, index), expected)


def test_brief_example_dsl_equals_dict() -> None:
    dsl = ('year >= 2010 AND (dept = "cardiology" OR dept = \'oncology\') AND '
           'doc_type IN ("review", "trial") AND NOT retracted = true')
    spec = {"retracted": {"ne": True}, "doc_type": {"in": ["trial", "review", "trial"]},
            "$or": [{"dept": "oncology"}, {"dept": {"eq": "cardiology"}}], "year": {"gte": 2010}}
    a, b = parse_filter(dsl, KINDS), parse_filter(spec, KINDS)
    assert a is not None and b is not None
    assert canonical(a) == canonical(b)
    np.testing.assert_array_equal(evaluate(a, SAMPLE), [True, False, False, False, False])
    np.testing.assert_array_equal(evaluate(b, SAMPLE), evaluate(a, SAMPLE))


@pytest.mark.parametrize("literal", ["1e-400", "-2.5E-330", "0." + "0" * 400 + "1"])
def test_a_dsl_number_too_small_for_a_float_is_refused(literal: str) -> None:
    """``float()`` read it as 0: ``year >= 1e-400`` allowed a year of 0."""
    with pytest.raises(MalformedFilterError, match="too small for a float"):
        parse_filter(f"year >= {literal}", KINDS)
    assert parse_filter("year >= 0.000e-400", KINDS) is not None  # a zero written so is 0


def test_dsl_keywords_case_insensitive_and_literals() -> None:
    lower = parse_filter("NOT dept = 'x' and (year < 3 or year > 5.5e1) AND tags not in ('a')",
                         KINDS)
    upper = parse_filter('not dept="x" AND (year<3 Or year>55.0) and tags NoT In ("a")', KINDS)
    assert lower is not None and upper is not None
    assert canonical(lower) == canonical(upper)
    escaped = parse_filter(r"""dept = "a\"b\\c\n\u00e9\ud83d\ude00" OR `dept` = 'it\'s'""", KINDS)
    assert escaped == Or((Eq("dept", 'a"b\\c\né\U0001F600'), Eq("dept", "it's")))


@SETTINGS
@given(st.text())
def test_dsl_string_literals_round_trip_json_escapes(text: str) -> None:
    for ensure_ascii in (True, False):
        parsed = parse_filter(f"dept = {json.dumps(text, ensure_ascii=ensure_ascii)}", KINDS)
        assert parsed == Eq("dept", text)


def key(spec: Any) -> str:
    parsed = parse_filter(spec, KINDS)
    assert parsed is not None
    return canonical(parsed)


def test_canonical_normalizes_order_duplicates_dates_and_nesting() -> None:
    assert key({"year": {"gte": 1, "lt": 5}, "dept": "a"}) == key(
        {"dept": "a", "year": {"lt": 5, "gte": 1}})
    assert key({"dept": {"in": ["b", "a", "b"]}}) == key({"dept": {"in": ["a", "b"]}})
    assert key({"dept": {"in": ["a"]}}) == key({"dept": "a"})
    assert key({"published": "2020-01-01"}) == key({"published": date(2020, 1, 1)}) == key(
        {"published": "2020-01-01T02:00:00+02:00"}) == key("published = '2020-01-01T00:00:00Z'")
    assert key({"$and": [{"$and": [{"dept": "a"}, {"year": 1}]}, {"year": 1}]}) == key(
        "year = 1 AND dept = 'a'")
    assert key({"$not": {"$not": {"year": 1}}}) == key("year = 1") == key({"year": 1.0})
    assert key("year > 1 AND year >= 1 AND year < 9 AND year <= 7") == key(
        {"year": {"gt": 1, "lte": 7}})
    hand_built = And((Range("year", lte=7), Range("year", gt=1), Or((Eq("retracted", True),))))
    assert canonical(hand_built) == key({"year": {"gt": 1, "lte": 7}, "retracted": True})


def test_different_filters_give_different_keys() -> None:
    specs: list[Any] = [
        {"dept": "a"}, {"dept": "b"}, {"dept": {"ne": "a"}}, {"dept": {"in": ["a", "b"]}},
        {"dept": {"nin": ["a", "b"]}}, {"tags": "a"}, {"retracted": True}, {"retracted": False},
        {"year": 1}, {"year": {"gt": 1}}, {"year": {"gte": 1}}, {"year": {"lt": 1}},
        {"year": {"lte": 1}}, {"score": 1}, {"published": "2020-01-01"},
        {"published": "2020-01-02"}, {"dept": "a", "year": 1},
        {"$or": [{"dept": "a"}, {"year": 1}]},
        {"$not": {"dept": "a", "year": 1}}, {"$not": {"$or": [{"dept": "a"}, {"year": 1}]}},
        {"dept": "1"}, {"dept": {"in": []}}, {"dept": {"nin": []}},
    ]
    keys = [key(s) for s in specs]
    assert len(set(keys)) == len(keys)


def test_evaluate_semantics_not_includes_missing_and_nan_never_matches() -> None:
    def mask(spec: Any) -> list[bool]:
        parsed = parse_filter(spec, KINDS)
        assert parsed is not None
        return evaluate(parsed, SAMPLE).tolist()

    assert mask({"year": {"gte": 2010}}) == [True, True, False, False, False]
    assert mask({"year": {"ne": 2012}}) == [False, True, True, True, True]
    assert mask("tags IN ('b', 'c')") == [True, True, False, False, False]
    assert mask("tags NOT IN ('b', 'c')") == [False, False, True, True, True]
    assert mask({"retracted": "false"}) == mask({"retracted": False}) == [True, False, False,
                                                                         True, False]
    assert mask({"published": {"lt": datetime(2021, 1, 1)}}) == [True, False, False, False, False]
    assert mask("dept IN ()") == [False] * 5 and mask("dept NOT IN ()") == [True] * 5
    assert evaluate(In("year", (2005.0, 2018.0)), SAMPLE).tolist() == [False, True, True, False,
                                                                       False]
    assert evaluate(Not(Range("score")), SAMPLE).tolist() == [False, False, True, True, True]


def test_empty_specs_mean_no_filter() -> None:
    assert parse_filter(None, KINDS) is None
    assert parse_filter({}, KINDS) is None
    assert parse_filter("  \n", KINDS) is None


# --- (3) one case per error ---


def _nested_not(depth: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"dept": "a"}
    for _ in range(depth):
        spec = {"$not": spec}
    return spec


ERROR_CASES: list[tuple[str, Any, type[InvalidQueryError], list[str]]] = [
    ("unknown-field-dict", {"yaer": 1}, UnknownFieldError, ["yaer", "year", "dept"]),
    ("unknown-field-dsl", "depth = 'x'", UnknownFieldError, ["depth", "dept"]),
    ("keyword-given-number", {"dept": 5}, FilterTypeError, ["dept", "keyword"]),
    ("number-given-bool", {"year": True}, FilterTypeError, ["year", "number"]),
    ("number-given-bool-dsl", "year = true", FilterTypeError, ["year", "number", "bool True"]),
    ("date-given-bool", {"published": False}, FilterTypeError,
     ["published", "date", "bool False"]),
    ("date-given-bool-dsl", "published >= true", FilterTypeError, ["published", "bool True"]),
    ("id-given-bool", {"id": True}, FilterTypeError,
     ["'id' is the document id", "not bool True", "{'id': 'true'}"]),
    ("id-given-bool-dsl", "id = false", FilterTypeError,
     ["'id' is the document id", "not bool False", "id = 'false'"]),
    ("id-ne-given-bool", {"id": {"ne": True}}, FilterTypeError, ["'id'", "bool True"]),
    ("id-in-given-bool", {"id": {"in": ["d1", True]}}, FilterTypeError, ["'id'", "bool True"]),
    ("id-in-given-bool-dsl", "id NOT IN ('d1', true)", FilterTypeError, ["'id'", "bool True"]),
    ("id-given-number-dsl", "id = 42", FilterTypeError,
     ["'id' is the document id", "float 42.0", "id = '42'"]),
    ("number-given-string", "year = '2010'", FilterTypeError, ["year", "number"]),
    ("number-given-nan", {"year": float("nan")}, FilterTypeError, ["year", "finite"]),
    ("number-given-inf", {"score": {"lt": float("inf")}}, FilterTypeError, ["score", "finite"]),
    ("number-literal-overflow", "year < 1e999", FilterTypeError, ["year", "finite"]),
    ("date-given-garbage", {"published": "yesterday"}, FilterTypeError, ["published", "ISO"]),
    ("date-given-bad-day", "published >= '2020-02-31'", FilterTypeError, ["published"]),
    ("date-given-number", {"published": 1577836800}, FilterTypeError, ["published", "date"]),
    ("null-value", {"dept": None}, FilterTypeError, ["dept", "null"]),
    ("range-on-keyword-dict", {"dept": {"gt": "a"}}, FilterTypeError, ["dept", "gt"]),
    ("range-on-keyword-dsl", "dept <= 'a'", FilterTypeError, ["dept", "lte"]),
    ("list-value", {"dept": ["a", "b"]}, MalformedFilterError, ["dept", "'in'"]),
    ("eq-given-list", {"dept": {"eq": ["a"]}}, MalformedFilterError, ["dept", "eq", "'in'"]),
    ("unknown-operator", {"year": {"between": [1, 2]}}, MalformedFilterError,
     ["year", "between"]),
    ("mongo-style-operator", {"year": {"$gte": 1}}, MalformedFilterError, ["$gte", "without"]),
    ("unknown-combinator", {"$xor": []}, MalformedFilterError, ["$xor", "$and"]),
    ("empty-and", {"$and": []}, MalformedFilterError, ["$and", "non-empty"]),
    ("empty-or", {"$or": []}, MalformedFilterError, ["$or", "non-empty"]),
    ("and-not-list", {"$and": {"dept": "a"}}, MalformedFilterError, ["$and", "list"]),
    ("or-child-not-dict", {"$or": ["dept = 'a'"]}, MalformedFilterError, ["$or"]),
    ("not-not-dict", {"$not": [{"dept": "a"}]}, MalformedFilterError, ["$not"]),
    ("empty-child", {"$not": {}}, MalformedFilterError, ["empty"]),
    ("empty-operator-dict", {"year": {}}, MalformedFilterError, ["year", "empty"]),
    ("in-not-list", {"dept": {"in": "a"}}, MalformedFilterError, ["dept", "'in'", "list"]),
    ("non-str-key", {1: "a"}, MalformedFilterError, ["1"]),
    ("spec-is-list", [{"dept": "a"}], MalformedFilterError, ["list", "dict"]),
    ("spec-is-int", 7, MalformedFilterError, ["int"]),
    ("dsl-missing-value", "year >= ", MalformedFilterError, ["position 8", "expected a value"]),
    ("dsl-bare-word-value", "dept = cardiology", MalformedFilterError,
     ["position 7", "cardiology", "quote"]),
    ("dsl-missing-operator", "year 2010", MalformedFilterError, ["position 5", "operator"]),
    ("dsl-unclosed-paren", "(year = 1", MalformedFilterError, ["position 9", "')'"]),
    ("dsl-stray-paren", "year = 1)", MalformedFilterError, ["position 8", "AND, OR"]),
    ("dsl-unterminated-string", "dept = 'abc", MalformedFilterError,
     ["position 7", "unterminated"]),
    ("dsl-bad-character", "dept = 'a' & year = 1", MalformedFilterError,
     ["position 11", "'&'"]),
    ("dsl-double-equals", "dept == 'a'", MalformedFilterError,
     ["position 5", "'=='", "use '='"]),
    ("dsl-c-and", "dept = 'a' && year = 1", MalformedFilterError,
     ["position 11", "'&&'", "use 'AND'"]),
    ("dsl-c-or", "dept = 'a' || year = 1", MalformedFilterError,
     ["position 11", "'||'", "use 'OR'"]),
    ("dsl-bad-escape", r"dept = 'a\qb'", MalformedFilterError, ["position 9", "escape"]),
    ("dsl-short-unicode-escape", r"dept = '\u00'", MalformedFilterError, ["position 8", r"\u"]),
    ("dsl-not-without-in", "dept NOT 'a'", MalformedFilterError, ["position 9", "IN"]),
    ("dsl-trailing-comma", "dept IN ('a',)", MalformedFilterError, ["position 13", "value"]),
    ("too-many-clauses-dict", {"$or": [{"year": i} for i in range(65)]}, LimitExceededError,
     ["64", "max_clauses"]),
    ("too-many-clauses-dsl", " OR ".join(f"year = {i}" for i in range(65)), LimitExceededError,
     ["64"]),
    ("too-many-in-values", {"dept": {"in": [str(i) for i in range(1025)]}}, LimitExceededError,
     ["dept", "1024"]),
    ("too-many-in-values-dsl", "dept IN (" + ",".join("'x'" for _ in range(1025)) + ")",
     LimitExceededError, ["dept", "1024"]),
    ("too-many-all-values", {"tags": {"all": [str(i) for i in range(65)]}},
     LimitExceededError, ["64", "each value of an ALL list is one"]),
    ("id-exists", {"id": {"exists": True}}, MalformedFilterError, ["document id", "= or IN"]),
    ("too-deep-dict", _nested_not(10_000), LimitExceededError, ["32", "deeper"]),
    ("too-deep-and", {"$and": [_nested_not(40)]}, LimitExceededError, ["32"]),
    ("too-deep-parens", "(" * 100_000 + "year = 1" + ")" * 100_000, LimitExceededError, ["32"]),
    ("too-deep-not-chain", "NOT " * 100_000 + "year = 1", LimitExceededError, ["32"]),
]


@pytest.mark.parametrize(("spec", "error", "fragments"), [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_errors_are_typed_and_name_the_problem(
    spec: Any, error: type[InvalidQueryError], fragments: list[str]
) -> None:
    with pytest.raises(error) as caught:
        parse_filter(spec, KINDS)
    assert type(caught.value) is error
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_limits_are_configurable() -> None:
    assert parse_filter("year = 1 OR year = 2", KINDS, max_clauses=2) is not None
    with pytest.raises(LimitExceededError):
        parse_filter("year = 1 OR year = 2", KINDS, max_clauses=1)
    with pytest.raises(LimitExceededError):
        parse_filter({"dept": {"nin": ["a", "b"]}}, KINDS, max_in_values=1)
    assert parse_filter(_nested_not(32), KINDS) == Eq("dept", "a")


def test_evaluate_rejects_fields_and_types_the_index_lacks() -> None:
    with pytest.raises(UnknownFieldError, match="nope"):
        evaluate(Eq("nope", "a"), SAMPLE)
    with pytest.raises(FilterTypeError, match="dept"):
        evaluate(Range("dept", gt=1.0), SAMPLE)


def test_huge_inputs_fail_fast_or_parse() -> None:
    long_value = "x" * 1_000_000
    assert parse_filter(f"dept = '{long_value}'", KINDS) == Eq("dept", long_value)
    with pytest.raises(UnknownFieldError):
        parse_filter("a" * 1_000_000 + " = 1", KINDS)
    with pytest.raises(LimitExceededError):
        parse_filter("year = 1 AND " * 200_000 + "year = 1", KINDS)


# --- (4) fuzzing: only InvalidQueryError subclasses, and successes evaluate ---

KEYS = st.sampled_from(["$and", "$or", "$not", "$xor", "dept", "tags", "year", "score",
                        "published", "retracted", "eq", "ne", "in", "nin", "gt", "gte", "lt",
                        "lte"]) | st.text(max_size=8)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.sampled_from(DATES),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=4),
    max_leaves=20,
)
TOKENS = st.sampled_from(["dept", "year", "published", "tags", "AND", "or", "NOT", "IN", "(",
                          ")", ",", "=", "!=", "<", ">=", "'a'", '"b', "\\", "2010", "-1.5e3",
                          "true", "`x`", "'2020-01-01'", "\x00", "\u202e", "é"])
DSL_SOUP = st.lists(TOKENS, max_size=15).map(" ".join)
ESCAPE_SOUP = st.text(alphabet="\\u0dDaF8c'\"` n", max_size=20).map(lambda t: f"dept = '{t}'")


def _accepts(spec: Any) -> None:
    try:
        parsed = parse_filter(spec, KINDS, max_clauses=16, max_in_values=8)
    except InvalidQueryError:
        return
    if parsed is not None:
        assert isinstance(canonical(parsed), str)
        assert evaluate(parsed, SAMPLE).shape == (SAMPLE.n_docs,)


@SETTINGS
@given(JSONISH)
def test_fuzz_json_like_specs(spec: Any) -> None:
    _accepts(spec)


@SETTINGS
@given(st.text() | DSL_SOUP | ESCAPE_SOUP | st.binary().map(lambda b: b.decode("latin-1")))
def test_fuzz_dsl_text(text: str) -> None:
    _accepts(text)


# --- the per-build mask cache: shared masks never change an answer ---


@SETTINGS
@given(FULL_RECORD, st.lists(RECORD, max_size=25), st.data())
def test_cached_masks_match_naive_across_filters_sharing_leaves(
    first: dict[str, Any], rest: list[dict[str, Any]], data: st.DataObject
) -> None:
    records = [first, *rest]
    index = MetadataIndex.build(records)
    index.masks.max_bytes = data.draw(st.sampled_from([0, 3 * len(records), 1 << 20]))
    specs = data.draw(st.lists(filter_specs(index.kinds), min_size=1, max_size=4), label="specs")
    for spec in specs * 2:  # the second round reads what the first one cached
        parsed = parse_filter(spec, index.kinds)
        assert parsed is not None
        mask = evaluate(parsed, index)
        assert not mask.flags.writeable
        expected = np.array([naive(spec, r) for r in records], dtype=bool)
        np.testing.assert_array_equal(mask, expected)
    assert index.masks.nbytes <= index.masks.max_bytes


def test_mask_cache_hits_counts_and_stays_per_build() -> None:
    spec = {"dept": "oncology", "year": {"gte": 2010}}
    parsed = parse_filter(spec, KINDS)
    assert parsed is not None
    index = MetadataIndex.build(SAMPLE_RECORDS)
    first = evaluate(parsed, index)
    assert evaluate(parse_filter(dict(reversed(spec.items())), KINDS), index).tolist() == \
        first.tolist() == [False, True, False, False, False]
    assert evaluate(parsed, index) is first  # a dict lookup, not a re-evaluation
    with pytest.raises(ValueError):
        first[0] = True  # shared: read-only
    mask, count = evaluate_counted(parsed, index)
    assert mask is first and count == 1 and evaluate_counted(parsed, index)[1] == 1
    other = MetadataIndex.build([{**r, "dept": "oncology"} for r in SAMPLE_RECORDS])
    assert evaluate(parsed, other).tolist() == [True, True, False, False, False]


def test_mask_cache_is_bounded_in_bytes_and_entries() -> None:
    index = MetadataIndex.build([{"n": i} for i in range(1000)])
    index.masks.max_bytes = 10_000  # masks of 1,000 bytes, each with its key's bytes
    for i in range(50):
        parsed = parse_filter({"n": {"gte": i}}, index.kinds)
        assert parsed is not None
        assert int(evaluate(parsed, index).sum()) == 1000 - i
    entry = 1000 + footprint(parsed)
    assert len(index.masks) == 10_000 // entry and index.masks.nbytes <= 10_000
    index.masks.max_entries = 3
    evaluate(Eq("n", 5.0), index)
    assert len(index.masks) == 3


def test_hand_built_values_of_other_types_are_never_served_from_the_cache() -> None:
    index = MetadataIndex.build(SAMPLE_RECORDS)
    assert evaluate(Eq("year", 1.0), index).tolist() == [False] * 5
    with pytest.raises(FilterTypeError):
        evaluate(Eq("year", True), index)  # == Eq("year", 1.0) in Python, but invalid
    assert evaluate(Eq("year", 2012), index).tolist() == [True, False, False, False, False]
    assert evaluate(And(()), index).all() and not evaluate(Or(()), index).any()


def test_corrupt_keyword_posting_raises_instead_of_writing_out_of_bounds() -> None:
    index = MetadataIndex.build(SAMPLE_RECORDS)
    values, offsets, rows = index._keywords["dept"]
    index._keywords["dept"] = (values, offsets, np.full_like(rows, len(SAMPLE_RECORDS)))
    with pytest.raises(IndexError, match="rebuild"):
        evaluate(Eq("dept", "oncology"), index)


def test_absent_keyword_values_are_found_with_the_closest_value() -> None:
    from retrieval.filters.hints import absent_values

    index = MetadataIndex.build([{"dept": "cardiology", "year": 2001},
                                 {"dept": "oncology", "year": 2002}])
    kinds = index.kinds
    node = parse_filter("(dept = 'cardiolgy' OR dept IN ('Oncology', 'oncology', 'zzz')) "
                        "AND NOT dept = 'neuro' AND year > 2000", kinds)
    found = {(a.field, a.value, a.closest) for a in absent_values(node, index)}
    assert found == {("dept", "cardiolgy", "cardiology"), ("dept", "Oncology", "oncology"),
                     ("dept", "zzz", None), ("dept", "neuro", None)}
    assert absent_values(parse_filter({"dept": "oncology"}, kinds), index) == []
    assert absent_values(None, index) == []
    message = absent_values(parse_filter("dept = 'cardiolgy'", kinds), index)[0].message()
    assert message == "no document has dept = 'cardiolgy'; did you mean 'cardiology'?"


def test_foreign_operators_inside_strings_are_plain_values() -> None:
    node = parse_filter("dept = '==' OR dept = '&&'", {"dept": "keyword"})
    assert canonical(node) == canonical(parse_filter({"$or": [{"dept": "=="}, {"dept": "&&"}]},
                                                     {"dept": "keyword"}))


def test_field_summaries_name_dates_a_datetime_cannot_hold() -> None:
    """Year 1 at +01:00 is year 0 in UTC: the summary (describe, the console) named the
    range with a ValueError."""
    from indexes.field_summary import summarize_fields
    from indexes.metadata import MetadataIndex

    metadata = MetadataIndex.build([{"when": "0001-01-01T00:00:00+01:00"},
                                    {"when": "9999-12-31T23:59:59-01:00"},
                                    {"when": "2020-01-01"}])
    (summary,) = summarize_fields(metadata, top=5)
    assert "seconds from 1970-01-01T00:00:00Z" in json.dumps(summary.as_dict())
    assert "seconds from 1970-01-01T00:00:00Z" in summary.text()


def test_a_named_filter_reference_in_any_mapping_is_at_the_top_level() -> None:
    from collections import OrderedDict

    from retrieval.filters.named import split_named

    assert split_named(OrderedDict([("$named", "mine"), ("dept", "a")])) == ("mine",
                                                                             {"dept": "a"})
