"""Hints for a filter that names values no document holds (a typo returns no hits silently)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from indexes.metadata import MetadataIndex
from retrieval.filters.nodes import And, Eq, Filter, In, Not, Or

MAX_CHECKED_VALUES = 64
# The closest-value search's work for one filter, in steps of difflib's matcher counted as it
# runs (``_CountingMatcher``): ~0.1 us of CPU a step, so the search stops by ~45 ms. The work
# was foretold as (value + 16) x (known value + 16) character pairs at ~0.02 us each, which
# values over a few characters take 3-4x (the matcher visits each position holding a
# character, at every level of its recursion): ~0.7 s. Bounded per filter, not per value: 64
# conditions of 64 absent values, each searching 20,000 known values, took minutes. Past it a
# value is still warned about, with no closest value.
MAX_SUGGESTION_WORK = 400_000
# Steps, as measured: a character read costs 2 (the quick ratio's dict, the match loop's), a
# position visited 1, a known value's comparison 16 beyond its characters, a longest-match
# search 48 beyond its reads and visits.
VALUE_STEPS = 16
MATCH_STEPS = 48
CUTOFF = 0.5  # difflib's similarity a closest value needs
# A field of a few hundred values and more is searched in rank order (``_ranked_match``): a
# scan compared every value (1,000 fifteen-character values filled the budget; 20,000 SKUs got
# no suggestion). numpy first counts, for all values at once, the characters each shares with
# the searched value: difflib's quick_ratio, an upper bound of its ratio. That work is charged
# at a step per ARRAY_ITEMS items, as measured: ~90 ns a value (the join, its cache misses at
# 200,000 values) and ~12 ns a character a pass (the build's, then one per PASS_CHARS of the
# searched value's), each charged ~2x over at difflib's ~0.11 us a step.
ARRAY_ITEMS = 8
VALUE_ITEMS = 16  # a value's join, length, bound and cutoff test
CHAR_ITEMS = 2  # a character's code point, value and count cell, in the build and each pass
PASS_STEPS = 600  # a pass's lookup table over Unicode (1.1 MB) and its numpy calls
MAX_PASSES = 2 * ARRAY_ITEMS // CHAR_ITEMS - 1  # so a character costs no more than a scan's 2
CANDIDATE_STEPS = 1  # a value whose bound reaches the cutoff: sorted by it
VISIT_STEPS = 8  # a value taken in bound order, beyond its ratio's longest-match searches
MAX_COUNT_CELLS = 1 << 20  # (characters counted in a pass + 1) x values: 8 MiB of counts
PASS_CHARS = 254  # a pass's characters, and one row for all others, are numbered in a byte
SEPARATOR = "\0"  # between values joined: a keyword value seldom holds it


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
    fields: dict[str, KnownValues] = {}  # read once per filter, whatever its absent values
    work = MAX_SUGGESTION_WORK
    for field, value in _keyword_values(node, metadata):
        if (field, value) in seen or metadata.keyword_rows(field, value).size:
            continue
        seen.add((field, value))
        if field not in fields:
            fields[field] = KnownValues(metadata.keyword_values(field))
        known = fields[field]
        closest = None
        if known.least_work(value, work) <= work:  # else no search could finish
            closest, spent = closest_value(value, known, work)
            work -= spent
        found.append(AbsentValue(field, value, closest))
    return found


class KnownValues:
    """A field's values as the closest-value search reads them, with what it learns of them
    (their characters, as one string and as arrays) kept for the filter's other values."""

    def __init__(self, values: Sequence[str]) -> None:
        self.values = values
        self._joined: str | None = None
        self._arrays: _ValueArrays | None = None

    @property
    def joined(self) -> str:
        """The values one after another, ``SEPARATOR`` between each two."""
        if self._joined is None:
            self._joined = SEPARATOR.join(self.values)
        return self._joined

    @property
    def chars(self) -> int:
        """Characters in all values."""
        return len(self.joined) - max(len(self.values) - 1, 0)

    def least_work(self, value: str, work: int) -> int:
        """The least work of a search for ``value``'s closest: the ranked search's charges
        before its first comparison, their characters' share left out, or a scan's pass over
        each value. Told from the number of values alone where it can be, with no pass over
        them (an id field's 100,000)."""
        count, distinct = len(self.values), len(set(value))
        if _ranks(count, distinct):
            return _ranking_work(count, 0, distinct)
        if VALUE_STEPS * count > work:
            return work + 1
        return 2 * self.chars + VALUE_STEPS * count

    def arrays(self, matcher: _CountingMatcher) -> _ValueArrays:
        """The values as arrays, built (and charged) on the first call."""
        if self._arrays is None:
            matcher.charge(_building_work(len(self.values), self.chars))
            self._arrays = _value_arrays(self.values, self.joined)
        return self._arrays


def closest_value(value: str, known: Sequence[str] | KnownValues,
                  work: int) -> tuple[str | None, int]:
    """(the value of ``known`` closest to ``value``, or None; the matcher steps spent), as
    ``difflib.get_close_matches(value, known, n=1, cutoff=0.5)`` finds it, else one equal
    but for case. A search that would pass ``work`` stops there: (None, ``work``)."""
    values = known if isinstance(known, KnownValues) else KnownValues(known)
    matcher = _CountingMatcher(work)
    try:
        closest = _search(matcher, value, values)
        if closest is None:  # a case slip is the commonest miss: "Oncology" for "oncology"
            matcher.charge(len(values.values))  # a casefold and a comparison each, in C
            folded = value.casefold()
            closest = next((v for v in values.values if v.casefold() == folded), None)
    except _OverBudget:
        return None, work
    return closest, work - matcher.work


def _search(matcher: _CountingMatcher, value: str, known: KnownValues) -> str | None:
    if _ranks(len(known.values), len(set(value))):
        return _ranked_match(matcher, value, known)
    return _best_match(matcher, value, known.values)


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


def _ranked_match(matcher: _CountingMatcher, value: str, known: KnownValues) -> str | None:
    """``_best_match``'s answer from fewer ratios: values in decreasing order of their quick
    ratio (an upper bound of their ratio, ``ratio() <= quick_ratio()``), up to the first whose
    bound is below the best ratio found, since no value after it can reach that ratio."""
    count, distinct = len(known.values), len(set(value))
    if _ranking_work(count, 0, distinct) > matcher.work:
        raise _OverBudget  # told before the values are joined
    arrays = known.arrays(matcher)
    matcher.charge(_ranking_work(count, known.chars, distinct)
                   - _building_work(count, known.chars))
    bounds = _quick_ratios(arrays, value)
    candidates = np.flatnonzero(bounds >= CUTOFF)
    matcher.charge(CANDIDATE_STEPS * candidates.size)
    order = candidates[np.argsort(-bounds[candidates], kind="stable")]
    matcher.set_seq2(value)
    best: tuple[float, str] | None = None
    for bound, index in zip(bounds[order].tolist(), order.tolist(), strict=True):
        if best is not None and bound < best[0]:
            break  # bounds only fall from here
        matcher.charge(VISIT_STEPS)
        candidate = known.values[index]
        if best is not None and (bound, candidate) <= best:
            continue  # its ratio at most ties the best, and the best is the greater value
        matcher.set_seq1(candidate)
        ratio = matcher.ratio()
        if ratio >= CUTOFF and (best is None or (ratio, candidate) > best):
            best = ratio, candidate
    return best[1] if best is not None else None


def _ranks(count: int, distinct: int) -> bool:
    """Whether ``count`` values are searched in rank order for a value of ``distinct``
    characters: where that search's work is never more than the scan's, so it finishes
    wherever the scan does, with its answer. Its ratios are a subset of the scan's (values whose
    quick ratio reaches the cutoff); its other charges, with every value taken, stay within the
    scan's 2 a character and ``VALUE_STEPS`` a value."""
    if distinct == 0 or _passes(count, distinct) > MAX_PASSES:
        return False
    most = _ranking_work(count, 0, distinct) + (CANDIDATE_STEPS + VISIT_STEPS) * count
    return most + 2 <= VALUE_STEPS * count  # 2: rounding its characters' steps up, twice


def _ranking_work(count: int, chars: int, distinct: int) -> int:
    """Steps charged before the first comparison: the arrays of ``count`` values of ``chars``
    characters, then a pass over them per ``_pass_width`` characters of the searched value's
    ``distinct``, each counting into (width + 1) x ``count`` cells."""
    passes = _passes(count, distinct)
    items = CHAR_ITEMS * passes * chars + (distinct + passes) * count
    return _building_work(count, chars) + PASS_STEPS * passes + -(-items // ARRAY_ITEMS)


def _building_work(count: int, chars: int) -> int:
    return -(-(VALUE_ITEMS * count + CHAR_ITEMS * chars) // ARRAY_ITEMS)


def _passes(count: int, distinct: int) -> int:
    return -(-distinct // _pass_width(count, distinct))


def _pass_width(count: int, distinct: int) -> int:
    """The searched value's characters counted in one pass: counts of ``count`` values for
    each, and one row for all other characters, within ``MAX_COUNT_CELLS``."""
    return max(1, min(distinct, PASS_CHARS, MAX_COUNT_CELLS // max(count, 1) - 1))


@dataclass(frozen=True, eq=False)
class _ValueArrays:
    """A field's values as arrays: ``codes`` and ``owners`` are (characters,), one value's
    after another; ``lengths`` is (values,)."""

    codes: npt.NDArray[np.uint32]  # code points
    owners: npt.NDArray[np.intp]  # the index of the value each code point is in
    lengths: npt.NDArray[np.intp]
    top: int  # the greatest code point; -1 where there are none


def _value_arrays(values: Sequence[str], joined: str) -> _ValueArrays:
    """Each value's length told from the separators in ``joined`` (``KnownValues.joined``):
    reading them one by one took 4x the join (~200 ns a value of 200,000)."""
    codes = _code_points(joined)
    breaks = codes == ord(SEPARATOR)
    ends = np.flatnonzero(breaks)
    if values and ends.size == len(values) - 1:
        lengths = np.diff(ends, prepend=-1, append=codes.size) - 1
        codes = codes[~breaks]
    else:  # a value holds the separator
        codes = _code_points("".join(values))
        lengths = np.fromiter(map(len, values), dtype=np.intp, count=len(values))
    owners = np.repeat(np.arange(len(values), dtype=np.intp), lengths)
    return _ValueArrays(codes, owners, lengths, int(codes.max()) if codes.size else -1)


def _code_points(text: str) -> npt.NDArray[np.uint32]:
    """uint32 (len(text),): a lone surrogate is its own code point, as in a str."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _quick_ratios(arrays: _ValueArrays, value: str) -> npt.NDArray[np.float64]:
    """float64 (values,): each value's difflib quick_ratio against ``value``, to the bit (the
    same 2.0 * shared / total): the characters it shares, counted with repeats."""
    chars, wanted = np.unique(_code_points(value), return_counts=True)
    held = chars <= arrays.top  # a character no value holds shares nothing
    chars, wanted = chars[held], wanted[held]
    shared = np.zeros(arrays.lengths.size, dtype=np.int64)
    width = _pass_width(arrays.lengths.size, chars.size)
    for start in range(0, chars.size, width):
        shared += _shared_chars(arrays, chars[start:start + width], wanted[start:start + width])
    return 2.0 * shared / (arrays.lengths + len(value))


def _shared_chars(arrays: _ValueArrays, chars: npt.NDArray[np.uint32],
                  wanted: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    """int64 (values,): how many of ``chars`` (each up to its ``wanted`` count) each value
    holds. Counted as one bincount of cells (character row, value column); every other
    character lands in a last row, left unread."""
    count, width = arrays.lengths.size, chars.size
    rows = np.full(arrays.top + 1, width, dtype=np.uint8)
    rows[chars] = np.arange(width, dtype=np.uint8)
    cells = np.take(rows, arrays.codes).astype(np.intp)  # 2x indexing with uint32
    cells *= count
    cells += arrays.owners
    counts = np.bincount(cells, minlength=(width + 1) * count).reshape(width + 1, count)[:width]
    np.minimum(counts, wanted[:, None], out=counts)
    return counts.sum(axis=0)


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
