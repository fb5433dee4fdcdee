"""IN / NOT IN at access-control scale (100,000 values): results against a naive evaluation,
limits, the filter memo's structural keys and its memory bound."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

import numpy as np
import pytest

from indexes.metadata import MetadataIndex
from retrieval.config import Limits
from retrieval.errors import FilterTypeError, LimitExceededError
from retrieval.filters import In, Not, canonical, evaluate, evaluate_counted, parse_filter
from retrieval.filters.spec_key import spec_key
from retrieval.request_path.validate import FilterMemo

N_DOCS = 30_000
N_VALUES = 100_000


@pytest.fixture(scope="module")
def corpus() -> tuple[list[dict[str, Any]], MetadataIndex]:
    rng = random.Random(7)
    records: list[dict[str, Any]] = []
    for row in range(N_DOCS):
        record: dict[str, Any] = {"article": f"art-{rng.randrange(50_000)}",
                                  "groups": [f"g{rng.randrange(3000)}" for _ in range(2)],
                                  "year": rng.randrange(1990, 2025)}
        if row % 17 == 0:
            del record["article"]  # documents without the field: NOT IN keeps them
        records.append(record)
    return records, MetadataIndex.build(records)


def _values(seed: int, n: int, prefix: str, universe: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{prefix}{rng.randrange(universe)}" for _ in range(n)]  # duplicates included


@pytest.mark.parametrize("field", ["article", "groups"])
def test_in_and_not_in_with_100k_values_match_naive(corpus: Any, field: str) -> None:
    records, index = corpus
    prefix, universe = ("art-", 120_000) if field == "article" else ("g", 40_000)
    values = _values(3, N_VALUES, prefix, universe)
    wanted = set(values)

    def holds(record: dict[str, Any]) -> bool:
        value = record.get(field)
        return bool(wanted.intersection(value if isinstance(value, list) else [value]))

    expected = np.array([holds(r) for r in records])
    assert 0 < expected.sum() < N_DOCS
    memo = FilterMemo(index.kinds, Limits())
    parsed, key = memo.parse({field: {"in": values}})
    mask, count = evaluate_counted(parsed, index)
    np.testing.assert_array_equal(mask, expected)
    assert count == expected.sum()
    negated, _ = memo.parse({field: {"nin": values}})
    np.testing.assert_array_equal(evaluate(negated, index), ~expected)
    # The canonical key does not depend on the order or duplicates of the values.
    shuffled = sorted(wanted, key=lambda v: hash((v, 1)))
    assert canonical(In(field, tuple(shuffled))) == key


def test_dsl_in_list_of_thousands_of_values_matches_dict(corpus: Any) -> None:
    _, index = corpus
    values = _values(5, 3000, "art-", 60_000)
    dsl = "article IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    from_dsl = parse_filter(dsl, index.kinds, max_in_values=N_VALUES)
    assert from_dsl == parse_filter({"article": {"in": values}}, index.kinds,
                                    max_in_values=N_VALUES)
    assert evaluate(from_dsl, index).sum() > 0


def test_in_limit_is_100k_by_default_and_still_enforced(corpus: Any) -> None:
    _, index = corpus
    memo = FilterMemo(index.kinds, Limits())
    assert Limits().max_in_values == 100_000
    with pytest.raises(LimitExceededError, match="max_in_values"):
        memo.parse({"article": {"in": [f"a{i}" for i in range(100_001)]}})
    with pytest.raises(LimitExceededError, match="max_in_values"):
        memo.parse({"article": {"nin": [f"a{i}" for i in range(100_001)]}})


def test_mixed_types_in_a_keyword_list_are_still_rejected(corpus: Any) -> None:
    _, index = corpus
    with pytest.raises(FilterTypeError, match="article"):
        parse_filter({"article": {"in": ["a"] * 500 + [3]}}, index.kinds)
    parsed = parse_filter({"groups": {"in": ["g1", True]}}, index.kinds)
    assert parsed == In("groups", ("g1", "true"))


def test_hand_built_unsorted_in_evaluates_and_keys_like_the_parsed_one(corpus: Any) -> None:
    _, index = corpus
    values = ("art-9", "art-1", "art-5", "art-1")
    parsed = parse_filter({"article": {"in": list(values)}}, index.kinds)
    assert canonical(In("article", values)) == canonical(parsed)
    np.testing.assert_array_equal(evaluate(Not(In("article", values)), index),
                                  ~evaluate(parsed, index))


def test_spec_keys_tell_types_apart_and_ignore_key_order() -> None:
    assert spec_key({"a": 1, "b": [True, "x"]}) == spec_key({"b": [True, "x"], "a": 1})
    keys = {spec_key({"year": v}) for v in (1, 1.0, True, "1")}
    assert len(keys) == 4  # equal in Python, different filters (True is an error on numbers)
    assert spec_key({"d": date(2020, 1, 1)}) is None  # not keyable: parsed every time
    assert spec_key({1: "a"}) is None
    assert spec_key(["a"]) is None
    deep: dict[str, Any] = {"year": 1}
    for _ in range(1000):
        deep = {"$not": deep}
    assert spec_key(deep) is None  # deeper than the parser allows: no recursion error
    key, weight = spec_key({"a": {"in": ["x"] * 50}})  # type: ignore[misc]
    assert weight >= 50
    assert spec_key("year = 1") != spec_key({"year": 1})


def test_filter_memo_remembers_large_filters_within_its_weight_bound(corpus: Any) -> None:
    _, index = corpus
    memo = FilterMemo(index.kinds, Limits(), max_weight=25_000)
    big = {"article": {"in": _values(1, 10_000, "art-", 50_000)}}
    first = memo.parse(big)
    assert memo.parse({"article": {"in": list(big["article"]["in"])}})[0] is first[0]
    for seed in range(2, 5):  # three more 10k filters: the memo keeps at most two
        memo.parse({"article": {"in": _values(seed, 10_000, "art-", 50_000)}})
    assert memo._entries.weight <= 25_000 and len(memo._entries) == 2
    assert memo.parse(big)[0] is not first[0]  # evicted: parsed again, equal result
    assert memo.parse(big)[0] == first[0]
    with pytest.raises(FilterTypeError):
        memo.parse({"year": True})
    with pytest.raises(FilterTypeError):  # errors are never remembered
        memo.parse({"year": True})
    assert memo.parse({"year": 1})[0] != memo.parse({"year": 2})[0]


def test_the_mask_cache_counts_the_bytes_its_keys_hold():
    """Distinct large IN filters: each key holds its values (~6.4 MB for 80,000) beside a
    small mask, and the cache stays within its bytes by counting both (it counted only the
    masks: 300 such filters grew a worker by ~1.9 GB). Evicted keys are freed."""
    import gc
    import weakref

    from indexes.mask_cache import footprint
    from indexes.metadata import MetadataIndex
    from retrieval.filters import evaluate
    from retrieval.filters.nodes import In

    metadata = MetadataIndex.build([{"tag": f"t{i % 50}"} for i in range(5000)])
    metadata.masks.max_bytes = 32 << 20
    alive = []
    for n in range(24):
        node = In("tag", tuple(f"user-{n}-{i:06d}" for i in range(80_000)))
        assert footprint(node) > 5_000_000
        evaluate(node, metadata)
        alive.append(weakref.ref(node))
        del node
        assert metadata.masks.nbytes <= metadata.masks.max_bytes
    gc.collect()
    kept = sum(ref() is not None for ref in alive)
    assert 1 <= kept <= 5 and len(metadata.masks) == kept
