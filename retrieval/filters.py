"""Exact metadata filters: an immutable AST, a dict language, a string DSL, cache keys, masks.

Both languages produce the same AST::

    {"year": {"gte": 2010}, "$or": [{"dept": "cardiology"}, {"dept": "oncology"}]}
    year >= 2010 AND (dept = "cardiology" OR dept = 'oncology') AND NOT retracted = true

``parse_filter`` validates against the index's field kinds and normalizes values: keyword values
become the indexed strings (booleans ``"true"``/``"false"``), number and date values floats (dates
as epoch seconds UTC). ``canonical`` gives one JSON string per filter whatever the key order,
child order, duplicates or nesting, for cache keys. ``evaluate`` builds a boolean mask with numpy;
NOT (also ``ne``, ``nin``, ``!=``, ``NOT IN``) complements over all documents, so it keeps
documents that lack the field.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from indexes.mask_cache import scatter_true
from indexes.metadata import MetadataIndex, keyword_value, parse_date
from retrieval.errors import (
    FilterTypeError,
    LimitExceededError,
    MalformedFilterError,
    UnknownFieldError,
)

MAX_DEPTH = 32
Scalar: TypeAlias = str | float
Mask: TypeAlias = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Eq:
    """``field`` equals ``value``; a list-valued keyword field matches when it holds ``value``."""

    field: str
    value: Scalar


@dataclass(frozen=True)
class In:
    field: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Range:
    """Bounds on a number or date field; a document without a value never matches."""

    field: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True)
class And:
    children: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    child: Filter


Filter: TypeAlias = Eq | In | Range | And | Or | Not
_RANGE_OPS = ("gt", "gte", "lt", "lte")
_FIELD_OPS = ("eq", "ne", "in", "nin", *_RANGE_OPS)
_DSL_OPS = {"=": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlevel = 60, 60, 2


def _show(value: object) -> str:
    """A short repr for messages: input may be huge, deeply nested or have a broken repr."""
    try:
        return _repr.repr(value)
    except Exception:  # noqa: BLE001 - building a message must never be what fails
        return f"<{type(value).__name__}>"


# --- smart constructors: the parser and canonical build every node through these ---


def _conj(children: Iterable[Filter]) -> Filter:
    """AND with nested ANDs flattened, ranges on one field merged and duplicates dropped."""
    flat: list[Filter] = []
    for child in _flatten(children, And):
        for i, prior in enumerate(flat):
            if isinstance(prior, Range) and isinstance(child, Range) and prior.field == child.field:
                flat[i] = _merge_ranges(prior, child)
                break
        else:
            if child not in flat:
                flat.append(child)
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def _disj(children: Iterable[Filter]) -> Filter:
    """OR with nested ORs flattened and duplicates dropped."""
    flat: list[Filter] = []
    for child in _flatten(children, Or):
        if child not in flat:
            flat.append(child)
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def _flatten(children: Iterable[Filter], kind: type[And] | type[Or]) -> Iterable[Filter]:
    for child in children:
        yield from child.children if isinstance(child, kind) else (child,)


def _neg(child: Filter) -> Filter:
    return child.child if isinstance(child, Not) else Not(child)


def _in(field: str, values: Iterable[Scalar]) -> Filter:
    """Sorted, deduplicated values; a single value is plain equality."""
    unique = sorted(set(values), key=lambda v: (isinstance(v, str), v))
    return Eq(field, unique[0]) if len(unique) == 1 else In(field, tuple(unique))


def _range(field: str, gt: float | None = None, gte: float | None = None,
           lt: float | None = None, lte: float | None = None) -> Range:
    """Keep only the tighter of a strict and an inclusive bound on the same side."""
    if gt is not None and gte is not None:
        gt, gte = (None, gte) if gte > gt else (gt, None)
    if lt is not None and lte is not None:
        lt, lte = (None, lte) if lte < lt else (lt, None)
    return Range(field, gt, gte, lt, lte)


def _merge_ranges(a: Range, b: Range) -> Range:
    def tighter(x: float | None, y: float | None, lower: bool) -> float | None:
        return y if x is None else x if y is None else max(x, y) if lower else min(x, y)

    return _range(a.field, tighter(a.gt, b.gt, True), tighter(a.gte, b.gte, True),
                  tighter(a.lt, b.lt, False), tighter(a.lte, b.lte, False))


# --- validation shared by both languages ---


def _coerce(field: str, kind: str, value: object) -> Scalar:
    """A filter value in its indexed form, or a FilterTypeError saying what the field takes."""
    got = f"{type(value).__name__} {_show(value)}"
    if value is None:
        raise FilterTypeError(f"field {field!r}: null is not a filter value; give a {kind} value")
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
        raise FilterTypeError(f"date field {field!r}: {_show(value)} is not a valid ISO 8601 "
                              "date; write e.g. '2020-01-31' or '2020-01-31T12:00:00Z'") from exc


def _unknown_field_message(field: str, kinds: Mapping[str, str]) -> str:
    known = sorted(kinds)
    close = difflib.get_close_matches(field, known, n=1) if len(field) <= 100 else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = ", ".join(known[:40]) + (f", ... ({len(known) - 40} more)" if len(known) > 40 else "")
    return (f"unknown filter field {_show(field)}{hint}; known fields: "
            f"{listing or '(none: this index has no filterable metadata)'}")


class _Context:
    """Field kinds and limits; counts clauses while parsing, so huge input fails early."""

    def __init__(self, kinds: Mapping[str, str], max_clauses: int, max_in_values: int) -> None:
        self.kinds, self.max_clauses, self.max_in_values = kinds, max_clauses, max_in_values
        self.clauses = 0

    def kind(self, field: str) -> str:
        if field not in self.kinds:
            raise UnknownFieldError(_unknown_field_message(field, self.kinds))
        return self.kinds[field]

    def nest(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise LimitExceededError(f"filter nests deeper than {MAX_DEPTH} levels; flatten it "
                                     "(AND/OR take any number of conditions without nesting)")

    def _count_clause(self) -> None:
        self.clauses += 1
        if self.clauses > self.max_clauses:
            raise LimitExceededError(f"filter has more than {self.max_clauses} conditions "
                                     "(max_clauses); merge equalities into IN lists")

    def compare(self, field: str, op: str, value: object) -> Filter:
        """``field op value`` for op in eq, ne, gt, gte, lt, lte."""
        kind = self.kind(field)
        if isinstance(value, list | tuple | Mapping):
            raise MalformedFilterError(f"field {field!r} ({op}) takes one value, not {_show(value)}"
                                       "; to match any of several write {'in': [...]}")
        if op in _RANGE_OPS and kind == "keyword":
            raise FilterTypeError(f"field {field!r} is a keyword field: range operator {op!r} "
                                  "needs a number or date field; use eq/in for keywords")
        self._count_clause()
        scalar = _coerce(field, kind, value)
        if op in _RANGE_OPS:
            return _range(field, **{op: float(scalar)})
        return _neg(Eq(field, scalar)) if op == "ne" else Eq(field, scalar)

    def member(self, field: str, values: object, negate: bool) -> Filter:
        kind, op = self.kind(field), "nin" if negate else "in"
        if not isinstance(values, list | tuple):
            raise MalformedFilterError(f"field {field!r}: {op!r} takes a list of values, got "
                                       f"{_show(values)}; write e.g. {{{op!r}: ['a', 'b']}}")
        self.check_in_count(field, len(values))
        self._count_clause()
        leaf = _in(field, [_coerce(field, kind, v) for v in values])
        return _neg(leaf) if negate else leaf

    def check_in_count(self, field: str, count: int) -> None:
        if count > self.max_in_values:
            raise LimitExceededError(f"field {field!r}: IN list has more than "
                                     f"{self.max_in_values} values (max_in_values); split it")


# --- dict language ---


def _parse_dict(spec: object, ctx: _Context, depth: int, where: str = "") -> Filter:
    """``{"field": value | {op: value}, "$and"|"$or": [...], "$not": {...}}``; keys are ANDed."""
    ctx.nest(depth)
    if not isinstance(spec, Mapping) or not spec:
        raise MalformedFilterError(f"{where} takes non-empty filter objects like "
                                   f"{{'field': value}}, got {_show(spec)}")
    clauses: list[Filter] = []
    for key, value in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list | tuple) or not value:
                raise MalformedFilterError(f"{key} takes a non-empty list of filter objects, "
                                           f"got {_show(value)}")
            parts = [_parse_dict(child, ctx, depth + 1, key) for child in value]
            clauses.append(_conj(parts) if key == "$and" else _disj(parts))
        elif key == "$not":
            clauses.append(_neg(_parse_dict(value, ctx, depth + 1, key)))
        elif not isinstance(key, str) or key.startswith("$"):
            raise MalformedFilterError(f"unknown filter key {_show(key)}: keys are field names "
                                       "or $and, $or, $not")
        else:
            clauses.append(_parse_field(key, value, ctx))
    return _conj(clauses)


def _parse_field(field: str, value: object, ctx: _Context) -> Filter:
    ctx.kind(field)  # an unknown field is the likelier mistake, so it is reported first
    if not isinstance(value, Mapping):  # {"field": value} is equality
        return ctx.compare(field, "eq", value)
    if not value:
        raise MalformedFilterError(f"field {field!r} has an empty operator object; write e.g. "
                                   f"{{{field!r}: {{'eq': ...}}}}")
    parts: list[Filter] = []
    for op, operand in value.items():
        if op in ("in", "nin"):
            parts.append(ctx.member(field, operand, negate=op == "nin"))
        elif op in _FIELD_OPS:
            parts.append(ctx.compare(field, str(op), operand))
        else:
            bare = op.lstrip("$") if isinstance(op, str) else ""
            hint = (f"write {bare!r} without '$'" if bare in _FIELD_OPS
                    else f"use one of {', '.join(_FIELD_OPS)}")
            raise MalformedFilterError(f"field {field!r}: unknown operator {_show(op)}; {hint}")
    return _conj(parts)


# --- DSL: a lazy tokenizer and a recursive-descent parser (precedence NOT > AND > OR) ---

_SPACE = re.compile(r"\s*")
_TOKEN = re.compile(
    r"""(?P<number>-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)
    |(?P<op><=|>=|!=|=|<|>)
    |(?P<punct>[(),])
    |(?P<string>"[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')
    |(?P<quoted>`[^`\\]*(?:\\.[^`\\]*)*`)
    |(?P<word>[^\W\d][\w.\-]*)""",
    re.VERBOSE | re.DOTALL,
)
_WORDS = {"and": "and", "or": "or", "not": "not", "in": "in", "true": "bool", "false": "bool"}
_ESCAPE = re.compile(  # a \u high+low surrogate pair first: together they are one character
    r"\\(u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)", re.DOTALL
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\",
            '"': '"', "'": "'", "`": "`"}


class _Token(NamedTuple):
    kind: str  # number, op, string, field, bool, and, or, not, in, end, or the punctuation
    text: str
    value: object
    pos: int


def _unescape(body: str, start: int) -> str:
    """JSON escapes (a JSON string literal is a valid DSL string) plus \\' and \\`."""

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code in _ESCAPES:
            return _ESCAPES[code]
        if len(code) == 1:  # unknown, or a \u without its four hex digits
            raise MalformedFilterError(f"filter syntax error at position {start + match.start()}:"
                                       f" bad escape {_show(chr(92) + code)}; write a backslash "
                                       "as two backslashes, \\u with four hex digits")
        if len(code) > 5:
            return chr(0x10000 + ((int(code[1:5], 16) - 0xD800) << 10) + int(code[7:], 16) - 0xDC00)
        return chr(int(code[1:], 16))

    return _ESCAPE.sub(replace, body)


class _DslParser:
    def __init__(self, text: str, ctx: _Context) -> None:
        self.text, self.ctx, self.pos = text, ctx, 0
        self.tok = self._scan()  # one token of lookahead: limits stop huge input early

    def _scan(self) -> _Token:
        space = _SPACE.match(self.text, self.pos)  # \s* always matches; the check is for mypy
        start = space.end() if space else self.pos
        if start == len(self.text):
            return _Token("end", "", None, start)
        match = _TOKEN.match(self.text, start)
        if match is None:
            char = self.text[start]
            what = "unterminated string" if char in "\"'`" else f"unexpected character {char!r}"
            raise MalformedFilterError(f"filter syntax error at position {start}: {what}"
                                       f"{self._near(start)}")
        self.pos, text, group = match.end(), match.group(), match.lastgroup
        if group == "number":
            return _Token("number", text, float(text), start)
        if group in ("string", "quoted"):
            body = _unescape(text[1:-1], start + 1)
            return _Token("string" if group == "string" else "field", text, body, start)
        if group == "word":
            kind = _WORDS.get(text.lower(), "field")
            return _Token(kind, text, text.lower() == "true" if kind == "bool" else text, start)
        return _Token(text if group == "punct" else "op", text, text, start)

    def _near(self, pos: int) -> str:
        return f" (near {_show(self.text[max(0, pos - 15) : pos + 15])})"

    def _error(self, expected: str, hint: str = "") -> MalformedFilterError:
        got = "end of filter" if self.tok.kind == "end" else _show(self.tok.text)
        return MalformedFilterError(f"filter syntax error at position {self.tok.pos}: expected "
                                    f"{expected}, got {got}{self._near(self.tok.pos)}{hint}")

    def _take(self, kind: str, expected: str) -> _Token:
        if self.tok.kind != kind:
            raise self._error(expected)
        token, self.tok = self.tok, self._scan()
        return token

    def parse(self) -> Filter:
        result = self._or(0)
        self._take("end", "AND, OR or the end of the filter")
        return result

    def _or(self, depth: int) -> Filter:
        """OR of ANDs of NOT-terms: the precedence NOT > AND > OR."""
        terms = [[self._not(depth)]]
        while self.tok.kind in ("and", "or"):
            if self._take(self.tok.kind, "AND or OR").kind == "or":
                terms.append([])
            terms[-1].append(self._not(depth))
        return _disj(_conj(term) for term in terms)

    def _not(self, depth: int) -> Filter:
        negations = 0  # a loop, not recursion: a long NOT chain cannot exhaust the stack
        while self.tok.kind == "not":
            negations += 1
            self.ctx.nest(depth + negations)
            self._take("not", "NOT")
        result = self._primary(depth + negations)
        return _neg(result) if negations % 2 else result

    def _primary(self, depth: int) -> Filter:
        if self.tok.kind == "(":
            opened = self._take("(", "'('")
            self.ctx.nest(depth + 1)
            inner = self._or(depth + 1)
            self._take(")", f"')' to close the '(' at position {opened.pos}")
            return inner
        field = str(self._take("field", "a field name, NOT or '('").value)
        self.ctx.kind(field)
        if self.tok.kind == "op":
            op = _DSL_OPS[self._take("op", "an operator").text]
            return self.ctx.compare(field, op, self._value())
        negate = self.tok.kind == "not"
        if negate:
            self._take("not", "NOT")
        self._take("in", "IN after NOT" if negate else
                   f"an operator (=, !=, <, <=, >, >=, IN, NOT IN) after field {field!r}")
        return self.ctx.member(field, self._list(field), negate)

    def _value(self) -> object:
        if self.tok.kind not in ("string", "number", "bool"):
            raise self._error("a value (a quoted string, a number, true or false)",
                              '; quote text values, e.g. "cardiology"')
        return self._take(self.tok.kind, "a value").value

    def _list(self, field: str) -> list[object]:
        self._take("(", "'(' to start the IN list, e.g. IN (\"a\", \"b\")")
        values: list[object] = []
        if self.tok.kind != ")":  # IN () is allowed: it matches nothing, NOT IN () everything
            values.append(self._value())
            while self.tok.kind == ",":
                self._take(",", "','")
                values.append(self._value())
                self.ctx.check_in_count(field, len(values))
        self._take(")", "',' or ')' in the IN list")
        return values


# --- public API ---


def parse_filter(spec: object, kinds: Mapping[str, str], *, max_clauses: int = 64,
                 max_in_values: int = 1024) -> Filter | None:
    """Validate a dict or DSL filter against the index's field kinds; None means no filter.

    Raises only InvalidQueryError subclasses: UnknownFieldError, FilterTypeError,
    MalformedFilterError and LimitExceededError.
    """
    ctx = _Context(kinds, max_clauses, max_in_values)
    if spec is None:
        return None
    if isinstance(spec, str):
        return _DslParser(spec, ctx).parse() if spec.strip() else None
    if isinstance(spec, Mapping):
        return _parse_dict(spec, ctx, 0) if spec else None
    raise MalformedFilterError(f"a filter is a dict, a DSL string or None, not "
                               f"{type(spec).__name__}; e.g. {{'year': {{'gte': 2010}}}} or "
                               "'year >= 2010'")


def canonical(filter: Filter) -> str:
    """One compact JSON string per filter whatever its order, duplicates or nesting."""
    return _serialize(_normalize(filter))


def _normalize(filter: Filter) -> Filter:
    """Rebuild through the smart constructors: hand-built ASTs key like parsed ones."""
    match filter:
        case And(children):
            return _conj(_normalize(child) for child in children)
        case Or(children):
            return _disj(_normalize(child) for child in children)
        case Not(child):
            return _neg(_normalize(child))
        case Eq(field, value):
            return Eq(field, _scalar(value))
        case In(field, values):
            return _in(field, map(_scalar, values))
    bounds = (filter.gt, filter.gte, filter.lt, filter.lte)
    return _range(filter.field, *(None if b is None else float(b) + 0.0 for b in bounds))


def _scalar(value: Scalar) -> Scalar:
    return keyword_value(value) if isinstance(value, str | bool) else float(value) + 0.0


def _serialize(node: Filter) -> str:
    match node:
        case And(children) | Or(children):
            # A set: siblings that differ only in the order of their own children collapse.
            parts = sorted({_serialize(child) for child in children})
            if len(parts) == 1:
                return parts[0]
            op = "and" if isinstance(node, And) else "or"
            return f'{{"children":[{",".join(parts)}],"op":"{op}"}}'
        case Not(child):
            return f'{{"child":{_serialize(child)},"op":"not"}}'
        case Eq(field, value):
            payload: dict[str, object] = {"op": "eq", "field": field, "value": value}
        case In(field, values):
            payload = {"op": "in", "field": field, "values": list(values)}
        case Range(field):
            bounds = {op: getattr(node, op) for op in _RANGE_OPS}
            payload = {"op": "range", "field": field,
                       **{op: b for op, b in bounds.items() if b is not None}}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def evaluate(filter: Filter, metadata: MetadataIndex) -> Mask:
    """Boolean mask of length ``metadata.n_docs``: True where the document matches.

    The mask is read-only: it may be remembered in ``metadata.masks`` and shared by later
    calls with an equal filter (the whole filter and each leaf are remembered; a repeated
    filter costs a dict lookup, a new combination of known leaves one pass per child).
    """
    return _remembered(filter, metadata, count=False)[0]


def evaluate_counted(filter: Filter, metadata: MetadataIndex) -> tuple[Mask, int]:
    """``evaluate`` and the number of allowed documents, remembered together: counting a
    1M-document mask costs ~50 us, several cached lookups."""
    mask, allowed = _remembered(filter, metadata, count=True)
    return mask, int(np.count_nonzero(mask)) if allowed is None else allowed


def _remembered(filter: Filter, metadata: MetadataIndex, count: bool
                ) -> tuple[Mask, int | None]:
    """(mask, allowed count or None) from the cache, else evaluated (and counted if
    ``count``) and remembered."""
    if not _cacheable(filter):
        mask = _evaluate(filter, metadata)[0]
        mask.flags.writeable = False
        return mask, None
    entry = metadata.masks.get(filter)
    if entry is not None and (entry[1] is not None or not count):
        return entry
    mask = _evaluate(filter, metadata)[0] if entry is None else entry[0]
    allowed = int(np.count_nonzero(mask)) if count else None
    return metadata.masks.put(filter, mask, allowed), allowed


def _cacheable(filter: Filter) -> bool:
    """Whether the filter may key the mask cache (itself: frozen ASTs hash and compare
    structurally in ~0.5 us, ``canonical`` takes ~18 us).

    Parsed ASTs hold only str and float values. A hand-built AST holding other types is not
    cached: ``Eq("year", True) == Eq("year", 1.0)`` in Python, yet the first must raise.
    """
    kind = type(filter)
    if kind is And or kind is Or:
        return all(map(_cacheable, filter.children))  # type: ignore[union-attr]
    if kind is Not:
        return _cacheable(filter.child)  # type: ignore[union-attr]
    if kind is Eq:
        return type(filter.value) in _KEY_TYPES  # type: ignore[union-attr]
    if kind is In:
        return all(type(v) in _KEY_TYPES for v in filter.values)  # type: ignore[union-attr]
    bounds = (filter.gt, filter.gte, filter.lt, filter.lte)  # type: ignore[union-attr]
    return all(b is None or type(b) is float for b in bounds)


_KEY_TYPES = (str, float)


def _evaluate(filter: Filter, metadata: MetadataIndex) -> tuple[Mask, bool]:
    """(mask, owned): owned masks are fresh and may be modified in place; others are shared."""
    match filter:
        case And(children) | Or(children):
            is_and = isinstance(filter, And)
            if not children:  # hand-built only: the parser never makes an empty AND/OR
                return np.full(metadata.n_docs, is_and), True
            combine = np.logical_and if is_and else np.logical_or
            first, *rest = [_evaluate(child, metadata) for child in children]
            mask, owned = first
            for child, _ in rest:
                if owned:
                    combine(mask, child, out=mask)
                else:  # the first two shared masks combine into a fresh array
                    mask, owned = combine(mask, child), True
            return mask, owned
        case Not(child):
            return np.logical_not(_evaluate(child, metadata)[0]), True
    if not _cacheable(filter):
        return _leaf_mask(filter, metadata), True
    entry = metadata.masks.get(filter)
    if entry is not None:
        return entry[0], False
    return metadata.masks.put(filter, _leaf_mask(filter, metadata)), False


def _leaf_mask(leaf: Eq | In | Range, metadata: MetadataIndex) -> Mask:
    kind = metadata.kinds.get(leaf.field)
    if kind is None:
        raise UnknownFieldError(_unknown_field_message(leaf.field, metadata.kinds))
    if kind == "keyword":
        if isinstance(leaf, Range):
            raise FilterTypeError(f"field {leaf.field!r} is a keyword field: range filters need "
                                  "a number or date field")
        mask = np.zeros(metadata.n_docs, dtype=bool)
        for value in (leaf.value,) if isinstance(leaf, Eq) else leaf.values:
            # A loop over filter values, not documents; numba scatters each posting list.
            rows = metadata.keyword_rows(leaf.field, str(_coerce(leaf.field, kind, value)))
            scatter_true(mask, rows)
        return mask
    column = metadata.numeric_column(leaf.field)
    if isinstance(leaf, Eq):
        return np.equal(column, _number(leaf.field, kind, leaf.value))
    if isinstance(leaf, In):
        return np.isin(column, [_number(leaf.field, kind, v) for v in leaf.values])
    bounds = [(b, op) for b, op in zip((leaf.gt, leaf.gte, leaf.lt, leaf.lte),
                                       (np.greater, np.greater_equal, np.less, np.less_equal),
                                       strict=True) if b is not None]
    if not bounds:
        return ~np.isnan(column)  # no bounds: every document with a value
    # A comparison with NaN is False, so missing values drop out without an isnan pass.
    (first, op), *rest = bounds
    mask = op(column, _number(leaf.field, kind, first))
    for bound, op in rest:
        np.logical_and(mask, op(column, _number(leaf.field, kind, bound)), out=mask)
    return mask


def _number(field: str, kind: str, value: object) -> float:
    """Parsed ASTs hold floats already; hand-built ones may hold ints or ISO date strings."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return float(_coerce(field, kind, value))
