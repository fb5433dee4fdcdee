"""``indexes.lru.LRU``: the one least-recently-used map behind the caches and memos."""

from __future__ import annotations

import pytest

from indexes.lru import LRU


def test_evicts_the_least_recently_used_entry() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent, so "b" goes next
    assert lru.put("c", 3) == 1
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2


def test_weight_bound_and_replacement_accounting() -> None:
    lru: LRU[str, bytes] = LRU(10, max_weight=10, weigh=lambda key, value: len(value))
    lru.put("a", b"xxxx")
    lru.put("b", b"yyyy")
    lru.put("a", b"zz")  # replacing re-weighs: 2 + 4
    assert lru.weight == 6
    assert lru.put("c", b"wwwwww") == 1  # 12 > 10: "b", the least recent, is evicted
    assert lru.get("b") is None and lru.weight == 8
    assert lru.put("huge", b"h" * 11) == 3  # heavier than the bound: everything goes, itself too
    assert len(lru) == 0 and lru.weight == 0


def test_pop_clear_and_zero_size() -> None:
    lru: LRU[int, str] = LRU(3)
    lru.put(1, "one")
    assert lru.pop(1) == "one" and lru.pop(1) is None
    lru.put(2, "two")
    lru.clear()
    assert len(lru) == 0
    nothing: LRU[int, str] = LRU(0)
    assert nothing.put(1, "one") == 1 and nothing.get(1) is None


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        LRU(-1)
    with pytest.raises(ValueError, match="together"):
        LRU(3, max_weight=10)
