"""Checks shared by the dict language and the DSL: field kinds, value types, limits."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime

import numpy as np

from indexes.doc_ids import ID_FIELD
from indexes.metadata import inexact_number, keyword_value, parse_date
from retrieval.errors import (
    FilterTypeError,
    LimitExceededError,
    MalformedFilterError,
    UnknownFieldError,
)
from retrieval.filters.nodes import (
    MAX_DEPTH,
    RANGE_OPS,
    Eq,
    Filter,
    Range,
    Scalar,
    bounded,
    conj,
    neg,
    one_of,
    one_of_strings,
    show,
)

ANY_KIND = "any"  # a field of no build: a syntax check's, taking a value of any kind


def coerce(field: str, kind: str, value: object) -> Scalar:
    """A filter value in its indexed form, or a FilterTypeError saying what the field takes."""
    got = f"{type(value).__name__} {show(value)}"
    if value is None:
        raise FilterTypeError(null_value_message(field, kind))
    if field == ID_FIELD:  # a string in every build, so checked without one too
        return document_id(value)
    if kind == ANY_KIND:  # whether the value fits the field is the build's to say
        return 0.0
    if kind == "keyword":
        if isinstance(value, str | bool):
            return keyword_value(value)
        raise FilterTypeError(f"keyword field {field!r} takes a string or true/false, not {got}")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise FilterTypeError(f"number field {field!r} takes an int or a float, not {got}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            number = math.inf
        if not math.isfinite(number):
            raise FilterTypeError(f"number field {field!r} takes finite numbers, not {got}")
        why = inexact_number(value)
        if why is not None:
            raise FilterTypeError(f"number field {field!r}: {why}")
        return number + 0.0  # -0.0 == 0.0, but it would print differently in cache keys
    if not isinstance(value, str | date):
        raise FilterTypeError(f"date field {field!r} takes an ISO 8601 string or a date, not {got}")
    try:
        if isinstance(value, str):
            return parse_date(value)
        if not isinstance(value, datetime):
            value = datetime(value.year, value.month, value.day)
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError, OSError) as exc:
        raise FilterTypeError(f"date field {field!r}: {show(value)} is not a valid ISO 8601 "
                              "date; write e.g. '2020-01-31' or '2020-01-31T12:00:00Z'") from exc


def null_value_message(field: str, kind: str) -> str:
    """What to write instead of null: a value, or the test for documents without one (no
    document lacks an id)."""
    if field == ID_FIELD:
        return (f"field {ID_FIELD!r}: null is not a filter value, and every document has an "
                f"id; give one as a string, e.g. {{{ID_FIELD!r}: 'doc-1'}}")
    wanted = "a value" if kind == ANY_KIND else f"a {kind} value"
    return (f"field {field!r}: null is not a filter value; give {wanted}, or "
            f"{{{field!r}: {{'exists': False}}}} for documents without one")


def document_id(value: object) -> str:
    """An ``id`` filter value: a string, as every document id is. A keyword field takes
    true/false as the strings "true"/"false" (a build indexes a boolean so), but no id is a
    boolean: ``{"id": True}`` matched a document whose id is the string "true"."""
    if isinstance(value, str):
        return keyword_value(value)
    if isinstance(value, bool):
        spelled = keyword_value(value)
    elif isinstance(value, float) and value.is_integer():
        spelled = show(int(value))  # the DSL reads 5 as 5.0
    else:
        spelled = show(value)
    raise FilterTypeError(f"{ID_FIELD!r} is the document id, a string: it takes strings, not "
                          f"{type(value).__name__} {show(value)}; quote the id: "
                          f"{{{ID_FIELD!r}: {spelled!r}}}, or {ID_FIELD} = {spelled!r} in the DSL")


def unknown_field_message(field: str, kinds: Mapping[str, str]) -> str:
    known = sorted({*kinds, ID_FIELD})
    close = difflib.get_close_matches(field, known, n=1) if len(field) <= 100 else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = ", ".join(known[:40]) + (f", ... ({len(known) - 40} more)" if len(known) > 40 else "")
    return (f"unknown filter field {show(field)}{hint}; known fields: "
            f"{listing or '(none: this index has no filterable metadata)'}")


class Context:
    """Field kinds and limits; counts clauses while parsing, so huge input fails early."""

    def __init__(self, kinds: Mapping[str, str], max_clauses: int, max_in_values: int) -> None:
        self.kinds, self.max_clauses, self.max_in_values = kinds, max_clauses, max_in_values
        self.clauses = 0

    def kind(self, field: str) -> str:
        if field == ID_FIELD:  # the document id: a keyword every document has
            return "keyword"
        if field not in self.kinds:
            raise UnknownFieldError(unknown_field_message(field, self.kinds))
        return self.kinds[field]

    def nest(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise LimitExceededError(f"filter nests deeper than {MAX_DEPTH} levels; flatten it "
                                     "(AND/OR take any number of conditions without nesting)")

    def _count_clause(self) -> None:
        self.clauses += 1
        if self.clauses > self.max_clauses:
            raise LimitExceededError(f"filter has more than {self.max_clauses} conditions "
                                     "(max_clauses; each value of an ALL list is one); merge "
                                     "equalities into IN lists, or raise max_clauses")

    def compare(self, field: str, op: str, value: object) -> Filter:
        """``field op value`` for op in eq, ne, gt, gte, lt, lte."""
        kind = self.kind(field)
        if isinstance(value, list | tuple | Mapping):
            raise MalformedFilterError(f"field {field!r} ({op}) takes one value, not {show(value)}"
                                       "; to match any of several write {'in': [...]}")
        if op in RANGE_OPS and kind == "keyword":
            raise FilterTypeError(f"field {field!r} is a keyword field: range operator {op!r} "
                                  "needs a number or date field; use eq/in for keywords")
        self._count_clause()
        scalar = coerce(field, kind, value)
        if op in RANGE_OPS:
            return bounded(field, **{op: float(scalar)})
        return neg(Eq(field, scalar)) if op == "ne" else Eq(field, scalar)

    def exists(self, field: str, flag: object) -> Filter:
        """``{field: {"exists": true}}``: documents holding any value of ``field`` (false:
        those holding none). A range without bounds is that test, on every kind."""
        self.kind(field)
        if field == ID_FIELD:  # refused by every build: a syntax error, named at start-up
            raise MalformedFilterError(f"{ID_FIELD!r} is the document id, which every "
                                       "document has: filter it with = or IN, not 'exists'")
        if not isinstance(flag, bool):
            raise FilterTypeError(f"field {field!r}: 'exists' takes true or false, got "
                                  f"{show(flag)}")
        self._count_clause()
        return Range(field) if flag else neg(Range(field))

    def contains(self, field: str, value: object) -> Filter:
        """A list (keyword) field holding ``value`` among its values: what '=' means on it."""
        self._keyword_only(field, "contains")
        return self.compare(field, "eq", value)

    def all_of(self, field: str, values: object) -> Filter:
        """A list field holding every one of ``values``."""
        self._keyword_only(field, "all")
        if not isinstance(values, list | tuple) or not values:
            raise MalformedFilterError(f"field {field!r}: 'all' takes a non-empty list of "
                                       f"values, got {show(values)}")
        self.check_in_count(field, len(values))
        return conj(self.compare(field, "eq", value) for value in values)

    def _keyword_only(self, field: str, op: str) -> None:
        kind = self.kind(field)
        if kind not in ("keyword", ANY_KIND):
            raise FilterTypeError(f"field {field!r} is a {kind} field: {op!r} tests the values "
                                  "of keyword (list) fields; use =, IN or a range")

    def member(self, field: str, values: object, negate: bool) -> Filter:
        kind, op = self.kind(field), "nin" if negate else "in"
        if not isinstance(values, list | tuple):
            raise MalformedFilterError(f"field {field!r}: {op!r} takes a list of values, got "
                                       f"{show(values)}; write e.g. {{{op!r}: ['a', 'b']}}")
        self.check_in_count(field, len(values))
        self._count_clause()
        # Access-control lists (ids as strings): compiled passes, no per-value coerce.
        leaf = one_of_strings(field, values) if kind == "keyword" else None
        if leaf is None:
            leaf = one_of(field, [coerce(field, kind, v) for v in values])
        return neg(leaf) if negate else leaf

    def check_in_count(self, field: str, count: int) -> None:
        if count > self.max_in_values:
            raise LimitExceededError(f"field {field!r}: IN list has more than "
                                     f"{self.max_in_values} values (max_in_values); split it")
