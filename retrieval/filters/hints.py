"""Hints for a filter that names values no document holds (a typo returns no hits silently)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat

from indexes.metadata import MetadataIndex
from retrieval.filters.nodes import And, Eq, Filter, In, Not, Or

MAX_CHECKED_VALUES = 64
# The closest-value search's work for one filter, in steps of difflib's matcher counted as it
# runs (``_CountingMatcher``): ~0.1 us of CPU a step, so the search stops by ~45 ms; a field
# of 1,000 fifteen-character values fits once. The work was foretold as (value + 16) x (known
# value + 16) character pairs at ~0.02 us each, which values over a few characters take 3-4x
# (the matcher visits each position holding a character, at every level of its recursion):
# ~0.7 s. Bounded per filter, not per value: 64 conditions of 64 absent values, each searching
# 20,000 known values, took minutes. Past it a value is still warned about, with no closest
# value.
MAX_SUGGESTION_WORK = 400_000
# Steps, as measured: a character read costs 2 (the quick ratio's dict, the match loop's), a
# position visited 1, a known value's comparison 16 beyond its characters, a longest-match
# search 48 beyond its reads and visits.
VALUE_STEPS = 16
MATCH_STEPS = 48
CUTOFF = 0.5  # difflib's similarity a closest value needs


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
    sizes: dict[str, int] = {}  # each field's _scan_cost, counted once
    work = MAX_SUGGESTION_WORK
    for field, value in _keyword_values(node, metadata):
        if (field, value) in seen or metadata.keyword_rows(field, value).size:
            continue
        seen.add((field, value))
        known = metadata.keyword_values(field)
        closest = None
        if _scan_cost(known, work, sizes, field) <= work:  # else no search could finish
            closest, spent = closest_value(value, known, work)
            work -= spent
        found.append(AbsentValue(field, value, closest))
    return found


def _scan_cost(known: list[str], work: int, sizes: dict[str, int], field: str) -> int:
    """The least work of a search of ``known`` (``field``'s values): passing over each once.
    More than ``work`` is told from the number of values alone, with no pass over them (an id
    field's 100,000)."""
    if VALUE_STEPS * len(known) > work:
        return work + 1
    if field not in sizes:
        sizes[field] = 2 * sum(map(len, known)) + VALUE_STEPS * len(known)
    return sizes[field]


def closest_value(value: str, known: Sequence[str], work: int) -> tuple[str | None, int]:
    """(the value of ``known`` closest to ``value``, or None; the matcher steps spent), as
    ``difflib.get_close_matches(value, known, n=1, cutoff=0.5)`` finds it, else one equal
    but for case. A search that would pass ``work`` stops there: (None, ``work``)."""
    matcher = _CountingMatcher(work)
    try:
        closest = _best_match(matcher, value, known)
    except _OverBudget:
        return None, work
    if closest is None:  # a case slip is the commonest miss: "Oncology" for "oncology"
        try:
            matcher.charge(len(known))  # a casefold and a comparison each, in C
        except _OverBudget:
            return None, work
        folded = value.casefold()
        closest = next((v for v in known if v.casefold() == folded), None)
    return closest, work - matcher.work


def _best_match(matcher: _CountingMatcher, value: str, known: Sequence[str]) -> str | None:
    """``get_close_matches``'s loop with ``n=1``: the same tests in the same order, and the
    same winner among equal ratios (the greatest value)."""
    matcher.set_seq2(value)
    best: tuple[float, str] | None = None
    for candidate in known:
        matcher.charge(2 * len(candidate) + VALUE_STEPS)
        matcher.set_seq1(candidate)
        if matcher.real_quick_ratio() >= CUTOFF and matcher.quick_ratio() >= CUTOFF:
            ratio = matcher.ratio()
            if ratio >= CUTOFF and (best is None or (ratio, candidate) > best):
                best = ratio, candidate
    return best[1] if best is not None else None


class _OverBudget(Exception):
    """The closest-value search spent its work."""


class _CountingMatcher(difflib.SequenceMatcher[str]):
    """difflib's matcher, charging each longest-match search before it runs: two steps per
    character of ``a`` it reads, and one per position in ``b`` holding that character (the
    positions its inner loop visits). Counted per search, so the count follows the real work
    whatever the values' alphabet and however deep difflib's recursion goes."""

    a: str  # set by set_seq1 and set_seq2 (difflib's stubs do not declare them)
    b2j: dict[str, list[int]]
    _visits: dict[str, int]  # a character's positions in b, set with b

    def __init__(self, work: int) -> None:
        super().__init__()
        self.work = work

    def set_seq2(self, b: Sequence[str]) -> None:
        super().set_seq2(b)
        self._visits = {char: len(rows) for char, rows in self.b2j.items()}

    def find_longest_match(self, alo: int = 0, ahi: int | None = None, blo: int = 0,
                           bhi: int | None = None) -> difflib.Match:
        ahi = len(self.a) if ahi is None else ahi
        visits = sum(map(self._visits.get, self.a[alo:ahi], repeat(0, ahi - alo)))
        self.charge(MATCH_STEPS + 2 * (ahi - alo) + visits)
        return super().find_longest_match(alo, ahi, blo, bhi)

    def charge(self, steps: int) -> None:
        self.work -= steps
        if self.work < 0:
            raise _OverBudget


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
