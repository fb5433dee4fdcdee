"""Postings restricted to a repeated filter's rows (``indexes.bm25_restricted``) against the
exhaustive kernel with the mask: the same top C, scores bit for bit and ties, cold and warm."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_bm25_filtered import SETTINGS, assert_same, cases, exhaustive

from indexes.bm25 import BM25Index
from indexes.bm25_restricted import RestrictedPostings
from indexes.mask_memo import MaskMemo


def _read_only(mask: np.ndarray) -> np.ndarray:
    frozen = mask.copy()
    frozen.flags.writeable = False
    return frozen


@SETTINGS
@given(cases(), st.sampled_from([0, 16, 1 << 20]))
def test_restricted_equals_exhaustive_cold_and_warm(
        case: tuple[BM25Index, list[str], np.ndarray, int], budget: int) -> None:
    index, tokens, mask, k = case
    ids, weights = index.query_terms(tokens)
    if index._nonpositive and not index._nonpositive.isdisjoint(ids.tolist()):
        return  # the general kernel's queries
    mask = _read_only(mask)
    restricted = RestrictedPostings(budget_bytes=budget)
    scratch = np.zeros(index.n_docs)
    want = exhaustive(index, tokens, mask, k)
    for _ in range(2):  # the first call restricts and keeps, the second reads what it kept
        assert_same(restricted.top_rows(index.indptr, index.rows, index.impacts, ids, weights,
                                        mask, int(mask.sum()), k, scratch), want)
        assert not scratch.any()
    assert restricted.stats()["bytes"] <= budget


def _corpus() -> tuple[BM25Index, list[list[str]]]:
    rng = np.random.default_rng(3)
    docs = [[f"w{int(w)}" for w in rng.zipf(1.3, size=40) if w < 500] or ["w1"]
            for _ in range(4000)]
    return BM25Index.build(docs), [[f"w{i}", f"w{i + 1}", "w2"] for i in range(1, 30)]


def test_the_index_restricts_repeated_read_only_masks_only() -> None:
    index, queries = _corpus()
    rng = np.random.default_rng(4)
    mask = rng.random(index.n_docs) < 0.02
    for frozen in (False, True):
        used = mask if not frozen else _read_only(mask)
        for query in queries:
            assert_same(index.top_candidates(query, 50, used), exhaustive(index, query, mask, 50))
        assert index.restricted.stats()["masks"] == int(frozen)
    kept = index.restricted.stats()["bytes"]
    assert 0 < kept <= 8 * int(mask.sum()) * len({t for q in queries for t in q})


def test_a_new_mask_is_never_served_another_masks_postings() -> None:
    index, queries = _corpus()
    rng = np.random.default_rng(5)
    for _ in range(6):  # freed masks' ids are reused by the next ones
        mask = _read_only(rng.random(index.n_docs) < 0.03)
        for query in queries[:5]:
            assert_same(index.top_candidates(query, 20, mask), exhaustive(index, query, mask, 20))
        del mask
        gc.collect()


def test_a_budget_of_zero_turns_it_off() -> None:
    index, queries = _corpus()
    index.restricted.budget_bytes = 0
    mask = _read_only(np.random.default_rng(6).random(index.n_docs) < 0.02)
    for query in queries:
        assert_same(index.top_candidates(query, 30, mask), exhaustive(index, query, mask, 30))
    assert index.restricted.stats() == {"masks": 0, "bytes": 0}


def test_a_short_allowed_count_is_refused_not_overrun() -> None:
    index, queries = _corpus()
    mask = _read_only(np.random.default_rng(7).random(index.n_docs) < 0.5)
    ids, weights = index.query_terms(queries[0])
    with pytest.raises(ValueError, match="n_allowed"):
        RestrictedPostings().top_rows(index.indptr, index.rows, index.impacts, ids, weights,
                                      mask, 1, 10, np.zeros(index.n_docs))


def test_mask_memo_forgets_writable_masks_and_weighs_updates() -> None:
    memo: MaskMemo[list[int]] = MaskMemo(4, max_weight=10, weigh=len)
    writable = np.zeros(3, dtype=bool)
    memo.put(writable, [1])
    memo.update(writable, lambda current: [1])
    assert memo.get(writable) is None and len(memo) == 0
    frozen = _read_only(writable)
    def append(n: int) -> Callable[[list[int] | None], list[int]]:
        def change(current: list[int] | None) -> list[int]:
            value = current if current is not None else []
            value.append(n)  # in place: the weight must follow the value, not its first size
            return value
        return change

    for n in range(1, 4):
        memo.update(frozen, append(n))
    assert memo.get(frozen) == [1, 2, 3] and memo.weight == 3
