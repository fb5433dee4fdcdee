"""``parse_filter``: a dict or DSL filter, validated, as an AST. The dict language lives here::

    {"year": {"gte": 2010}, "$or": [{"dept": "cardiology"}, {"dept": "oncology"}]}
    {"tags": {"all": ["a", "b"]}, "reviewer": {"exists": false}}

On a list (keyword) field ``=`` / ``contains`` match a document holding the value among its
values, ``in`` / ``any`` one holding any of them, ``all`` one holding every one; ``exists``
tests whether a document holds a value of the field to filter on (not null, an empty list,
a nested object or a list of numbers: those are stored, not indexed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from retrieval.errors import FilterTypeError, MalformedFilterError, UnknownFieldError
from retrieval.filters.dsl import DslParser
from retrieval.filters.nodes import FIELD_OPS, Filter, conj, disj, neg, show
from retrieval.filters.validate import ANY_KIND, Context


def parse_filter(spec: object, kinds: Mapping[str, str], *, max_clauses: int = 64,
                 max_in_values: int = 1024) -> Filter | None:
    """Validate a dict or DSL filter against the index's field kinds; None means no filter.

    Raises only InvalidQueryError subclasses: UnknownFieldError, FilterTypeError,
    MalformedFilterError and LimitExceededError.
    """
    ctx = Context(kinds, max_clauses, max_in_values)
    if spec is None:
        return None
    if isinstance(spec, str):
        return DslParser(spec, ctx).parse() if spec.strip() else None
    if isinstance(spec, Mapping):
        return _parse_dict(spec, ctx, 0) if spec else None
    raise MalformedFilterError(f"a filter is a dict, a DSL string or None, not "
                               f"{type(spec).__name__}; e.g. {{'year': {{'gte': 2010}}}} or "
                               "'year >= 2010'")


class _AnyField(Mapping[str, str]):
    """Field kinds that know every field, as one taking values of any kind: a filter's syntax
    and size, checked without a build. As a keyword field, a range or a number on it stopped
    the check there, passing whatever followed ("year >= 2010 AND (dept = 'x'")."""

    def __getitem__(self, field: str) -> str:
        return ANY_KIND

    def __contains__(self, field: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def check_syntax(spec: object, *, max_clauses: int = 64, max_in_values: int = 1024) -> None:
    """Raise ``MalformedFilterError`` or ``LimitExceededError`` for a filter no build can
    serve (a syntax error, too many clauses); whether its fields and values fit is the
    build's to say, so those errors are not raised here."""
    try:
        parse_filter(spec, _AnyField(), max_clauses=max_clauses, max_in_values=max_in_values)
    except (UnknownFieldError, FilterTypeError):
        pass


ALL_OPS = (*FIELD_OPS, "contains", "any", "all", "exists")

# --- dict language ---



def _parse_dict(spec: object, ctx: Context, depth: int, where: str = "") -> Filter:
    """``{"field": value | {op: value}, "$and"|"$or": [...], "$not": {...}}``; keys are ANDed."""
    ctx.nest(depth)
    if not isinstance(spec, Mapping) or not spec:
        raise MalformedFilterError(f"{where} takes non-empty filter objects like "
                                   f"{{'field': value}}, got {show(spec)}")
    clauses: list[Filter] = []
    for key, value in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list | tuple) or not value:
                raise MalformedFilterError(f"{key} takes a non-empty list of filter objects, "
                                           f"got {show(value)}")
            parts = [_parse_dict(child, ctx, depth + 1, key) for child in value]
            clauses.append(conj(parts) if key == "$and" else disj(parts))
        elif key == "$not":
            clauses.append(neg(_parse_dict(value, ctx, depth + 1, key)))
        elif not isinstance(key, str) or key.startswith("$"):
            raise MalformedFilterError(f"unknown filter key {show(key)}: keys are field names "
                                       "or $and, $or, $not ($named only at the top level)")
        else:
            clauses.append(_parse_field(key, value, ctx))
    return conj(clauses)


def _parse_field(field: str, value: object, ctx: Context) -> Filter:
    ctx.kind(field)  # an unknown field is the likelier mistake, so it is reported first
    if not isinstance(value, Mapping):  # {"field": value} is equality
        return ctx.compare(field, "eq", value)
    if not value:
        raise MalformedFilterError(f"field {field!r} has an empty operator object; write e.g. "
                                   f"{{{field!r}: {{'eq': ...}}}}")
    parts: list[Filter] = []
    for op, operand in value.items():
        if op in ("in", "nin", "any"):
            parts.append(ctx.member(field, operand, negate=op == "nin"))
        elif op == "contains":
            parts.append(ctx.contains(field, operand))
        elif op == "all":
            parts.append(ctx.all_of(field, operand))
        elif op == "exists":
            parts.append(ctx.exists(field, operand))
        elif op in FIELD_OPS:
            parts.append(ctx.compare(field, str(op), operand))
        else:
            bare = op.lstrip("$") if isinstance(op, str) else ""
            hint = (f"write {bare!r} without '$'" if bare in ALL_OPS
                    else f"use one of {', '.join(ALL_OPS)}")
            raise MalformedFilterError(f"field {field!r}: unknown operator {show(op)}; {hint}")
    return conj(parts)
