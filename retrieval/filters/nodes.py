"""The filter AST: immutable nodes, the smart constructors every parser builds through, and
``canonical``, the one JSON string per filter that cache keys use."""

from __future__ import annotations

import json
import operator
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from indexes.metadata import keyword_value
from indexes.packed_strings import distinct_order, joined_in_order, pack

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

    def __hash__(self) -> int:
        # Remembered: every mask-cache lookup hashes the node. From the NUL-joined values when
        # there are (one hash of contiguous bytes): hashing 100,000 new strings one by one
        # took ~20-35 ms on a busy machine. Equal nodes hash equally: their joins are equal.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            joined = self.joined
            cached = hash((self.field, self.values) if joined is None else
                          (self.field, len(self.values), joined))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        """Equal fields and values. Two equal nodes that are different objects meet when the
        filter memo has forgotten a filter the mask cache still keys (or a named filter's node
        keys it): comparing their tuples value by value chases every string of both, ~0.2-0.4
        ms at 10,000 values on each cache lookup; their NUL-joined values (remembered) compare
        by one memcmp."""
        if self is other:
            return True
        if type(other) is not In:
            return NotImplemented
        # No hash comparison: a remembered hash does not survive pickling (str hashes are
        # salted per process), and a memcmp of different joins stops at their first difference.
        if self.field != other.field or len(self.values) != len(other.values):
            return False
        mine, theirs = self.joined, other.joined
        if mine is not None and theirs is not None:
            return mine == theirs
        return self.values == other.values

    @cached_property
    def joined(self) -> str | None:
        """``nul_joined(values)``, remembered (``one_of_strings`` sets it from packed bytes)."""
        return nul_joined(self.values)

    @cached_property
    def plain(self) -> bool:
        """Whether every value is a str or a float, as in parsed filters (remembered: the mask
        cache asks on every lookup)."""
        return self.strings or all(type(v) in (str, float) for v in self.values)

    @cached_property
    def strings(self) -> bool:
        """Whether every value is a str (remembered)."""
        return all_strings(self.values)

    @cached_property
    def canonical(self) -> bool:
        """Whether the values are two or more strings in strictly ascending order, as the
        parser makes them (remembered; ``one_of_strings`` sets it)."""
        return (len(self.values) > 1 and self.strings
                and all(map(str.__lt__, self.values[:-1], self.values[1:])))  # type: ignore[arg-type]


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
RANGE_OPS = ("gt", "gte", "lt", "lte")
FIELD_OPS = ("eq", "ne", "in", "nin", *RANGE_OPS)
DSL_OPS = {"=": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlevel = 60, 60, 2


def show(value: object) -> str:
    """A short repr for messages: input may be huge, deeply nested or have a broken repr."""
    try:
        return _repr.repr(value)
    except Exception:  # noqa: BLE001 - building a message must never be what fails
        return f"<{type(value).__name__}>"


# --- smart constructors: the parser and canonical build every node through these ---


def conj(children: Iterable[Filter]) -> Filter:
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


def disj(children: Iterable[Filter]) -> Filter:
    """OR with nested ORs flattened and duplicates dropped."""
    flat: list[Filter] = []
    for child in _flatten(children, Or):
        if child not in flat:
            flat.append(child)
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def _flatten(children: Iterable[Filter], kind: type[And] | type[Or]) -> Iterable[Filter]:
    for child in children:
        yield from child.children if isinstance(child, kind) else (child,)


def neg(child: Filter) -> Filter:
    return child.child if isinstance(child, Not) else Not(child)


def nul_joined(values: Sequence[object]) -> str | None:
    """The values joined by NUL when all are str and none holds NUL, else None. The join
    type-checks and copies in one C-level pass; with exactly len - 1 NULs in it, it splits back
    into the values, so for lists of equal length equal joins mean equal lists."""
    try:
        joined = "\0".join(values)  # type: ignore[arg-type]
    except TypeError:
        return None
    encoded = np.frombuffer(joined.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    return joined if np.count_nonzero(encoded == 0) == max(len(values) - 1, 0) else None


def all_strings(values: Iterable[object]) -> bool:
    """Whether every value is a str, in one C-level pass: ``str.join`` type-checks each item
    (~10x cheaper than an isinstance loop over a 100,000-value IN list)."""
    try:
        "".join(values)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def one_of(field: str, values: Iterable[Scalar]) -> Filter:
    """Sorted, deduplicated values (numbers before strings); a single value is plain equality."""
    distinct = set(values)
    try:  # all strings or all numbers: the plain sort, ~4x faster than one with a key
        unique = sorted(distinct)
    except TypeError:  # strings mixed with numbers (hand-built only)
        unique = sorted(distinct, key=lambda v: (isinstance(v, str), v))
    return Eq(field, unique[0]) if len(unique) == 1 else In(field, tuple(unique))


PACKED_FROM = 64  # values: below, Python's set and sort; from there, the packed kernels


def one_of_strings(field: str, values: Sequence[object]) -> Filter | None:
    """``one_of`` for a list of str (keyword IN lists: access control), linear in the values'
    bytes: sorted and deduplicated by ``indexes.packed_strings`` (a radix sort of each value's
    first distinguishing 8 bytes; ~0.5 ms for 10,000 ids against ~2.5 ms for ``sorted(set())``).
    Subclasses of str are made plain str first (their own characters, ``keyword_value``: a
    ``class C(str, Enum)`` member's ``str()`` is its name). None when a value is not a str."""
    exact = operator.countOf(map(type, values), str) == len(values)
    if not exact and not all_strings(values):
        return None
    packed = pack(values) if exact and len(values) >= PACKED_FROM else None  # type: ignore[arg-type]
    if packed is None:  # few values, a str subclass, or a value holding NUL
        return one_of(field, map(keyword_value, values))
    order = distinct_order(packed)
    if order.shape[0] == 1:
        return Eq(field, values[int(order[0])])  # type: ignore[arg-type]
    # The values are new strings split from one string built from the packed bytes: no pass
    # over the caller's scattered string objects, and contiguous for the passes to come.
    joined = joined_in_order(packed, order)
    leaf = In(field, tuple(joined.split("\0")))
    # Known by construction: no check passes over the values later.
    leaf.__dict__.update(strings=True, plain=True, canonical=True, joined=joined)
    return leaf


def bounded(field: str, gt: float | None = None, gte: float | None = None,
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

    return bounded(a.field, tighter(a.gt, b.gt, True), tighter(a.gte, b.gte, True),
                  tighter(a.lt, b.lt, False), tighter(a.lte, b.lte, False))


# --- canonical form ---


def canonical(filter: Filter) -> str:
    """One compact JSON string per filter whatever its order, duplicates or nesting."""
    return _serialize(_normalize(filter))


def _normalize(filter: Filter) -> Filter:
    """Rebuild through the smart constructors: hand-built ASTs key like parsed ones."""
    match filter:
        case And(children):
            return conj(_normalize(child) for child in children)
        case Or(children):
            return disj(_normalize(child) for child in children)
        case Not(child):
            return neg(_normalize(child))
        case Eq(field, value):
            return Eq(field, _scalar(value))
        case In(field, values):
            if filter.canonical:
                return filter  # a parsed keyword IN list: already sorted, distinct strings
            return one_of(field, map(_scalar, values))
    bounds = (filter.gt, filter.gte, filter.lt, filter.lte)
    return bounded(filter.field, *(None if b is None else float(b) + 0.0 for b in bounds))


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
            fast = _in_json(node)
            if fast is not None:
                return fast
            payload = {"op": "in", "field": field, "values": list(values)}
        case Range(field):
            bounds = {op: getattr(node, op) for op in RANGE_OPS}
            payload = {"op": "range", "field": field,
                       **{op: b for op, b in bounds.items() if b is not None}}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def _in_json(node: In) -> str | None:
    """``_serialize`` of an IN over strings json.dumps writes as they are (printable ASCII, no
    quote or backslash: ids), built by one join and checked by numpy: ~10x json.dumps, which
    scans each string for escapes. None for other IN lists."""
    if not node.values or not node.strings:
        return None
    joined = node.joined  # the values as one string: the replace copies contiguous memory
    body = joined.replace("\0", '","') if joined is not None else \
        '","'.join(node.values)  # type: ignore[arg-type]
    if not body.isascii():
        return None
    codes = np.frombuffer(body.encode("ascii"), dtype=np.uint8)
    # json.dumps escapes controls, DEL, '"' and '\\' (ASCII checked above); the only ones
    # allowed are the separators' quotes.
    escaped = (codes < 0x20) | (codes == 0x7F) | (codes == ord('"')) | (codes == ord("\\"))
    if np.count_nonzero(escaped) != 2 * (len(node.values) - 1):
        return None
    field = json.dumps(node.field)
    return f'{{"field":{field},"op":"in","values":["{body}"]}}'
