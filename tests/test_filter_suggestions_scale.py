"""The closest-value suggestion over fields of tens of thousands of values: the ranked search
gives difflib's answer wherever the scan it replaces finished, from no more counted work, and
finds a near miss among 20,000 values within the filter's budget, where the scan ran out."""

from __future__ import annotations

import difflib
import random
import string
from collections.abc import Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from indexes.metadata import MetadataIndex
from retrieval.filters import hints, parse_filter
from retrieval.filters.hints import (
    CUTOFF,
    MAX_SUGGESTION_WORK,
    KnownValues,
    absent_values,
    closest_value,
)

ALPHABETS = ["ab", "abc", "abcdefghij", "aAbBcC", "ab\0", "aé\U0001f600b", "ab\ud800"]


def _reference(value: str, known: Sequence[str]) -> str | None:
    """The answer the search keeps: difflib's, else a value equal but for case."""
    close = difflib.get_close_matches(value, known, n=1, cutoff=CUTOFF)
    if close:
        return close[0]
    return next((v for v in known if v.casefold() == value.casefold()), None)


def _scan(value: str, known: Sequence[str], work: int) -> tuple[str | None, int]:
    """The search every field had before ranking: each value compared in turn."""
    matcher = hints._CountingMatcher(work)
    try:
        closest = hints._best_match(matcher, value, known)
        if closest is None:
            matcher.charge(len(known))
            closest = next((v for v in known if v.casefold() == value.casefold()), None)
    except hints._OverBudget:
        return None, work
    return closest, work - matcher.work


def _random_values(rng: random.Random, alphabet: str, count: int, longest: int) -> list[str]:
    return sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))
                   for _ in range(count)})


def _near_miss(rng: random.Random, value: str, alphabet: str) -> str:
    """``value`` with one character changed, dropped, added or case-flipped."""
    at = rng.randrange(len(value) + 1)
    edit = rng.choice(["change", "drop", "add", "case"]) if value else "add"
    if edit == "add" or at == len(value):
        return value[:at] + rng.choice(alphabet + "z") + value[at:]
    if edit == "change":
        return value[:at] + rng.choice(alphabet + "z") + value[at + 1:]
    if edit == "drop":
        return value[:at] + value[at + 1:]
    return value.swapcase()


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), alphabet=st.sampled_from(ALPHABETS),
       count=st.one_of(st.integers(300, 900), st.integers(0, 40)),
       longest=st.integers(6, 14), miss=st.booleans())
def test_the_closest_value_is_difflibs_wherever_the_scan_finished(
        seed: int, alphabet: str, count: int, longest: int, miss: bool) -> None:
    """Ranked from a few hundred values on: its answer is get_close_matches(n=1)'s (the
    greatest value among equal ratios), it never counts more work than the scan, and so
    finishes, with the scan's answer, within any budget the scan finished within."""
    rng = random.Random(seed)
    known = _random_values(rng, alphabet, count, longest)
    value = _near_miss(rng, rng.choice(known), alphabet) if miss and known else \
        "".join(rng.choice(alphabet + "z") for _ in range(rng.randint(0, longest)))
    event(f"ranked: {hints._ranks(len(known), len(set(value)))}")
    expected, scan_work = _scan(value, known, 10**12)
    assert expected == _reference(value, known)
    closest, work = closest_value(value, known, 10**12)
    assert closest == expected
    assert work <= scan_work
    assert closest_value(value, known, scan_work) == (expected, work)


def test_a_near_miss_among_20000_values_is_suggested_within_the_budget() -> None:
    """20,000 random twelve-character values: the scan spent the filter's budget passing over
    them (~55 ms) and gave no suggestion. The ranked search counts the characters each value
    shares with the typo first, compares only the few that could beat the best ratio, and
    charges all of it, its array work included, within the budget."""
    rng = random.Random(20_000)
    known = sorted({"".join(rng.choice(string.ascii_lowercase + string.digits)
                            for _ in range(12)) for _ in range(20_000)})
    target = known[12_345]
    typo = target[:5] + ("x" if target[5] != "x" else "y") + target[6:]
    assert difflib.get_close_matches(typo, known, n=1, cutoff=CUTOFF) == [target]
    closest, spent = closest_value(typo, known, MAX_SUGGESTION_WORK)
    assert closest == target
    assert 0 < spent <= MAX_SUGGESTION_WORK
    # every step counted: a budget one short of them stops the search
    assert closest_value(typo, known, spent - 1) == (None, spent - 1)
    index = MetadataIndex.build([{"sku": value} for value in known])
    (found,) = absent_values(parse_filter({"sku": typo}, index.kinds), index)
    assert found.message() == f"no document has sku = {typo!r}; did you mean {target!r}?"


def test_a_second_typo_in_the_same_field_reuses_the_values_arrays() -> None:
    """A filter's absent values in one field share its arrays: the second is charged only
    its own pass, so two typos over 20,000 values both get their closest value."""
    rng = random.Random(2)
    known = sorted({"".join(rng.choice(string.ascii_lowercase) for _ in range(12))
                    for _ in range(20_000)})
    typos = [known[10][:-1] + "0", known[20_000 - 10][1:]]
    index = MetadataIndex.build([{"sku": value} for value in known])
    found = absent_values(parse_filter({"sku": {"in": typos}}, index.kinds), index)
    assert [(a.value, a.closest) for a in found] == [(typos[0], known[10]),
                                                     (typos[1], known[20_000 - 10])]
    fields = KnownValues(known)
    first = closest_value(typos[0], fields, MAX_SUGGESTION_WORK)[1]
    assert closest_value(typos[1], fields, MAX_SUGGESTION_WORK)[1] < first


def test_a_field_past_the_budget_is_not_searched() -> None:
    """300,000 values: their ranking alone is charged past the budget, told from their
    number, and the value is warned about with no closest value."""
    known = [f"{i:06d}" for i in range(300_000)]
    assert KnownValues(known).least_work("00012x", MAX_SUGGESTION_WORK) > MAX_SUGGESTION_WORK
    assert closest_value("00012x", known, MAX_SUGGESTION_WORK) == (None, MAX_SUGGESTION_WORK)


def test_the_bounds_are_difflibs_quick_ratios_to_the_bit() -> None:
    """The ranking's bound of each value is difflib's quick_ratio, whatever its characters:
    astral ones, a lone surrogate, the separator the values are joined with, none."""
    for known in (["", "a", "abba", "b\U0001f600a", "\ud800x", "ééa", "caB"],
                  ["a\0b", "\0", "ab", "ba\0\0"]):
        arrays = KnownValues(known).arrays(hints._CountingMatcher(10**9))
        for value in ("ab", "a\0", "\U0001f600", "\ud800\ud800x", "éaa", "zzz"):
            matcher = difflib.SequenceMatcher(None, "", value)
            expected = []
            for candidate in known:
                matcher.set_seq1(candidate)
                expected.append(matcher.quick_ratio())
            assert hints._quick_ratios(arrays, value).tolist() == expected
