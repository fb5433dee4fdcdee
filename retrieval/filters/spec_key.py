"""Hashable keys for raw filter specs, so a repeated filter is recognized without parsing it.

A key is built in C-level passes over the spec, unlike its JSON text, which cost ~2 ms for
10,000 values. A list of strings (an access-control list) becomes one string, its values
joined by NUL: one copy, one compiled hash of contiguous bytes and one memcmp on a hit, ~0.12
ms for 10,000 values whether the list is the same object again or freshly decoded from JSON.
A tuple of the values cost twice that fresh (a hash per new string object) and more under
cache pressure.
Scalars are tagged with their type: ``True == 1 == 1.0`` in Python, yet ``True`` is an error on
a number field.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from indexes.packed_strings import digest
from retrieval.filters.nodes import MAX_DEPTH

SpecKey = tuple[Hashable, int]


class HashedKey:
    """A key that hashes once: a memo's get and move_to_end would each re-hash a tuple of
    100,000 values otherwise."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: Hashable) -> None:
        self.key, self._hash = key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedKey) and self._hash == other._hash and \
            self.key == other.key
_TAGS: dict[type, str] = {str: "s", bool: "b", int: "i", float: "f", type(None): "n"}


def spec_key(spec: object) -> SpecKey | None:
    """(hashable key, weight) for a dict or DSL string filter, or None when it cannot be keyed
    (values of other types, such as dates or numpy scalars, or nesting beyond the depth limit,
    which the parser rejects anyway). Equal keys parse to equal filters; the weight (scalars in
    the spec, or DSL characters / 8) bounds the memory of a memo of them."""
    if isinstance(spec, str):
        return HashedKey(("dsl", spec)), len(spec) // 8 + 1
    if not isinstance(spec, dict):
        return None
    try:
        key, weight = _freeze(spec, 0)
    except _Unkeyable:
        return None
    return HashedKey(key), weight


class _Unkeyable(Exception):
    pass


def _freeze(value: object, depth: int) -> SpecKey:
    kind = type(value)
    tag = _TAGS.get(kind)
    if tag is not None:
        return (tag, value), 1
    if depth > MAX_DEPTH + 1:
        raise _Unkeyable
    if kind is list or kind is tuple:
        items: list | tuple = value  # type: ignore[assignment]
        strings = _strings_key(items)
        if strings is not None:  # the large case, an IN list of ids
            return strings, len(items) + 1
        parts = [_freeze(item, depth + 1) for item in items]
        return ("l", tuple(part for part, _ in parts)), sum(w for _, w in parts) + 1
    if kind is dict:
        entries = []
        weight = 1
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _Unkeyable
            part, w = _freeze(item, depth + 1)
            entries.append((key, part))
            weight += w
        return ("d", tuple(sorted(entries, key=lambda entry: entry[0]))), weight
    raise _Unkeyable


class _Text:
    """A list of str as one string (its values joined by NUL) hashed by ``digest``: one
    compiled pass for the hash and the NUL count (SipHash alone took longer)."""

    __slots__ = ("text", "_hash")

    def __init__(self, text: str, digest: int) -> None:
        self.text, self._hash = text, digest

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Text) and self._hash == other._hash and \
            self.text == other.text


def _strings_key(items: Sequence[object]) -> Hashable | None:
    """A key for a list of str (None for other lists): the values joined by NUL and their
    number. The join type-checks and copies in one C-level pass; with exactly len - 1 NULs the
    joined string splits back into the list, so equal keys mean equal lists. A list whose
    values hold NUL is keyed by the tuple of its values."""
    try:
        joined = "\0".join(items)  # type: ignore[arg-type]
    except TypeError:
        return None
    hashed, nuls = digest(joined)
    if nuls == max(len(items) - 1, 0):
        return ("J", len(items), _Text(joined, hashed))
    return ("L", tuple(items))
