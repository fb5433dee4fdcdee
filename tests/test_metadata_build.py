"""The metadata index is built field by field (``indexes.metadata.field_columns``); its kinds,
keyword postings and columns are what reading the records one by one defines: every value's
kind, each value's rows in row order (a list's items once each), floats and epoch seconds."""

from __future__ import annotations

import datetime
import decimal
import enum
import math
import uuid
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.errors import CorpusError
from indexes.metadata import (
    MetadataIndex,
    keyword_value,
    merge_kinds,
    parse_date,
    value_kind,
)

WORDS = st.sampled_from(["a", "b", "c", "true", "2020-01-31", "x y"])
DATES = st.sampled_from(["2020-01-31", "2021-06-01T12:30:00Z", "2019-12-31 23:59:59.5",
                         "2022-02-02T01:02:03+02:00"])
# Per field, values of one kind (a keyword field may mix strings, dates, booleans and lists,
# whose null items are skipped); in a field of any kind, None, nested objects and lists
# holding non-strings are stored but not indexed (NaN in a column).
# numpy's float64 is a float (numpy's integers are not ints: the build refuses them, below).
UNINDEXED = st.sampled_from([None, {"nested": 1}, [1, "a"], [], [None]])
KEYWORD = st.one_of(WORDS, DATES, st.booleans(),
                    st.lists(st.one_of(WORDS, st.booleans(), st.none()), max_size=4), UNINDEXED)
NUMBER = st.one_of(st.integers(-5, 5), st.floats(-1e6, 1e6, allow_nan=False),
                   st.sampled_from([np.float64(3)]), UNINDEXED)
DATE = st.one_of(DATES, UNINDEXED)
FIELDS = {"tag": KEYWORD, "score": NUMBER, "when": DATE}


@st.composite
def records(draw: Any) -> list[dict[str, Any]]:
    rows = draw(st.integers(1, 40))
    out = []
    for _ in range(rows):
        present = draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True))
        out.append({field: draw(FIELDS[field]) for field in present})
    return out


def one_by_one(records: list[dict[str, Any]]) -> tuple[dict[str, str], dict, dict]:
    """The per-record definition: (kinds, keyword postings, columns)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for record in records:
        for field, value in record.items():
            if value_kind(value) is not None:
                seen[field].add(value_kind(value))
            elif isinstance(value, list) and all(item is None for item in value):
                seen.setdefault(field, set())  # keyword if nothing else gives a kind
    kinds = {field: merge_kinds(found) if found else "keyword"
             for field, found in sorted(seen.items())}
    postings, columns = {}, {}
    for field, kind in kinds.items():
        if kind == "keyword":
            rows: dict[str, list[int]] = defaultdict(list)
            for row, record in enumerate(records):
                value = record.get(field)
                if value is not None and value_kind(value) is not None:
                    items = value if isinstance(value, list) else [value]
                    for key in {keyword_value(item) for item in items if item is not None}:
                        rows[key].append(row)  # True and "true" are one value
            postings[field] = {value: rows[value] for value in sorted(rows)}
        else:
            columns[field] = [converted(record.get(field), kind) for record in records]
    return kinds, postings, columns


def converted(value: Any, kind: str) -> float:
    if value_kind(value) is None:  # None, or no filterable kind: no value to filter on
        return np.nan
    return (parse_date if kind == "date" else float)(value)


@settings(max_examples=200, deadline=None)
@given(records())
def test_the_columnar_build_is_the_record_by_record_definition(corpus):
    kinds, postings, columns = one_by_one(corpus)
    index = MetadataIndex.build(corpus)
    assert index.kinds == kinds
    for field, expected in postings.items():
        values, offsets, rows = index.keyword_postings(field)
        assert rows.dtype == np.int32 and offsets.dtype == np.int64
        assert {v: rows[offsets[i]:offsets[i + 1]].tolist() for i, v in enumerate(values)} \
            == expected
        assert values == list(expected)
    for field, expected in columns.items():
        np.testing.assert_array_equal(index.numeric_column(field), np.array(expected))


def test_an_empty_list_holds_no_value_in_a_field_of_any_kind():
    """``[]`` (or ``[None]``) made a number field mixed and a date field a keyword field; a
    field of nothing but empty lists is a keyword field (of tags yet to come)."""
    index = MetadataIndex.build([{"year": 2020, "when": "2020-01-31", "tags": []},
                                 {"year": [], "when": [None], "tags": [None]}])
    assert index.kinds == {"year": "number", "when": "date", "tags": "keyword"}
    assert np.isnan(index.numeric_column("year")[1]) and np.isnan(index.numeric_column("when")[1])
    assert index.keyword_values("tags") == []


def test_a_date_with_a_line_end_is_a_keyword():
    """The date pattern ended in ``$``, which matches before a final newline: the field was a
    date field and the build failed on "Invalid isoformat string"."""
    index = MetadataIndex.build([{"when": "2020-01-31\n"}, {"when": "2021-06-01"}])
    assert index.kinds == {"when": "keyword"}
    with pytest.raises(ValueError, match="ISO"):
        parse_date("2020-01-31\n")


def test_kept_kinds_stay_and_refuse_values_they_cannot_hold():
    """A compaction's schema: a field whose values are gone stays, a keyword field of dates
    stays a keyword field; a number in a kept keyword field is refused, naming the field."""
    kept = {"promo": "keyword", "due": "keyword", "year": "number"}
    index = MetadataIndex.build([{"due": "2020-01-31", "year": [2020]}], kept=kept)
    assert index.kinds == kept
    assert index.keyword_values("promo") == [] and index.keyword_values("due") == ["2020-01-31"]
    with pytest.raises(CorpusError, match="'due' is a keyword field, and its values are number"):
        MetadataIndex.build([{"due": 5}], kept=kept)
    # Nothing but an empty list left: the kept kind, not a keyword field at odds with it
    # (an acknowledged write of [] then stopped every later compaction).
    assert MetadataIndex.build([{"year": [], "due": []}], kept=kept).kinds == kept


def test_a_value_that_does_not_convert_names_its_row_and_field():
    corpus = [{"when": "2020-01-31"}, {"when": {"nested": 1}}, {"when": "2020-02-30"}]
    with pytest.raises(CorpusError, match=r"document row 2: field 'when'"):
        MetadataIndex.build(corpus)
    with pytest.raises(CorpusError, match=r"document row 1: field 'when'.*day is out of range"):
        MetadataIndex.build([{"when": "2020-01-31"}, {"when": "2020-02-30"}])


def test_a_field_of_two_kinds_names_the_first_document_of_each():
    corpus = [{"year": "x"}, {"year": True}, {"year": 2020}, {"year": 2021.5}]
    with pytest.raises(CorpusError, match=r"'year' mixes \['keyword', 'number'\] values "
                                          r"\(keyword in document 'a', number in document 'c'\)"):
        MetadataIndex.build(corpus, ["a", "b", "c", "d"])


class Colour(enum.Enum):
    RED = "red"


@pytest.mark.parametrize("value", [uuid.UUID(int=5), Colour.RED, np.int64(3), np.bool_(True),
                                   datetime.date(2020, 1, 31), decimal.Decimal("1.5"), {1, 2}])
def test_a_value_json_has_no_type_for_names_its_field_and_document(value):
    # A live write refuses these (its log is JSON); the build refuses them before writing
    # anything, instead of storing a string no filter reads or failing mid-build untyped.
    corpus = [{"tenant": "a"}, {"tenant": value}, {"tenant": "b"}]
    with pytest.raises(CorpusError, match=rf"field 'tenant' holds a {type(value).__name__} .*"
                                          r"in document 'd1', which JSON has no type for"):
        MetadataIndex.build(corpus, ["d0", "d1", "d2"])


def test_subclasses_of_json_types_are_their_base():
    class Tag(str):
        pass

    # Not a StrEnum: str() of this mix-in says "Shade.DARK", JSON stores "dark".
    class Shade(str, enum.Enum):  # noqa: UP042
        DARK = "dark"

    class Level(enum.IntEnum):
        HIGH = 2

    index = MetadataIndex.build([{"tag": Tag("x"), "level": Level.HIGH, "score": np.float64(1),
                                  "shade": Shade.DARK},
                                 {"tag": "y", "level": 1, "score": 2.5, "shade": "light"}])
    assert index.kinds == {"tag": "keyword", "level": "number", "score": "number",
                           "shade": "keyword"}
    assert index.keyword_values("shade") == ["dark", "light"]
    np.testing.assert_array_equal(index.numeric_column("level"), [2.0, 1.0])


def test_an_infinite_number_names_its_row_and_nan_is_no_value():
    """Infinity was stored: no filter can name it (they take finite numbers), and every
    range matched it."""
    with pytest.raises(CorpusError, match=r"document row 1: field 'n': inf is no number"):
        MetadataIndex.build([{"n": 1.0}, {"n": math.inf}])
    assert np.isnan(MetadataIndex.build([{"n": 1.0}, {"n": math.nan}]).numeric_column("n")[1])


def test_a_number_past_a_float_names_its_row_and_field():
    with pytest.raises(CorpusError, match=r"document row 1: field 'n': int too large"):
        MetadataIndex.build([{"n": 1}, {"n": 10**400}])


def test_a_tuple_is_the_list_json_stores():
    # Read back from the doc store or the log a tuple is a list: indexed as one from the start.
    index = MetadataIndex.build([{"tags": ("a", "b")}, {"tags": ["b"]}, {"tags": "c"}])
    assert index.kinds == {"tags": "keyword"}
    values, offsets, rows = index.keyword_postings("tags")
    assert {v: rows[offsets[i]:offsets[i + 1]].tolist() for i, v in enumerate(values)} == {
        "a": [0], "b": [0, 1], "c": [2]}
