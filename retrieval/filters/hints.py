"""Hints for a filter that names values no document holds (a typo returns no hits silently)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass

from indexes.metadata import MetadataIndex
from retrieval.filters.nodes import And, Eq, Filter, In, Not, Or

MAX_CHECKED_VALUES = 64
# difflib's work for one filter, in character pairs: (value + 16) x (known value + 16), summed
# over the known values searched (a comparison costs up to ~0.02 us a pair: ~0.15 s in all; a
# field of 10,000 eight-character values fits). Bounded per filter, not per value: 64
# conditions of 64 absent values, each searching 20,000 known values, took minutes. Past it a
# value is still warned about, with no closest value.
MAX_SUGGESTION_WORK = 8_000_000
PAIR_OVERHEAD = 16  # a comparison's cost beyond its characters, in characters


@dataclass(frozen=True)
class AbsentValue:
    """``value`` of keyword ``field`` is in the filter but in no document."""

    field: str
    value: str
    closest: str | None

    def message(self) -> str:
        hint = f"; did you mean {self.closest!r}?" if self.closest else ""
        return f"no document has {self.field} = {self.value!r}{hint}"


def absent_values(node: Filter | None, metadata: MetadataIndex) -> list[AbsentValue]:
    """Keyword values the filter compares against that no document of the index holds."""
    found: list[AbsentValue] = []
    seen: set[tuple[str, str]] = set()
    sizes: dict[str, int] = {}  # each field's known values' characters, counted once
    work = MAX_SUGGESTION_WORK
    for field, value in _keyword_values(node, metadata):
        if (field, value) in seen or metadata.keyword_rows(field, value).size:
            continue
        seen.add((field, value))
        known = metadata.keyword_values(field)
        cost = _search_cost(value, known, work, sizes, field)
        closest = None
        if cost <= work:
            work -= cost
            closest = _closest(value, known)
        found.append(AbsentValue(field, value, closest))
    return found


def _search_cost(value: str, known: list[str], work: int, sizes: dict[str, int],
                 field: str) -> int:
    """difflib's work searching ``known`` (``field``'s values) for ``value``, in character
    pairs; more than ``work`` is told from the number of values alone, with no pass over them
    (an id field's 100,000)."""
    side = len(value) + PAIR_OVERHEAD
    if side * PAIR_OVERHEAD * len(known) > work:  # its least: were every known value empty
        return work + 1
    if field not in sizes:
        sizes[field] = sum(map(len, known)) + PAIR_OVERHEAD * len(known)
    return side * sizes[field]


def _closest(value: str, known: list[str]) -> str | None:
    closest = difflib.get_close_matches(value, known, n=1, cutoff=0.5)
    if not closest:  # a case slip is the commonest miss: "Oncology" for "oncology"
        closest = [v for v in known if v.casefold() == value.casefold()][:1]
    return closest[0] if closest else None


def _keyword_values(node: Filter | None, metadata: MetadataIndex) -> Iterator[tuple[str, str]]:
    if isinstance(node, And | Or):
        for child in node.children:
            yield from _keyword_values(child, metadata)
    elif isinstance(node, Not):
        yield from _keyword_values(node.child, metadata)
    elif isinstance(node, Eq | In) and metadata.kinds.get(node.field) == "keyword":
        values = (node.value,) if isinstance(node, Eq) else node.values
        if len(values) > MAX_CHECKED_VALUES:  # an access list: absent ids are expected there
            return
        yield from ((node.field, str(v)) for v in values)
