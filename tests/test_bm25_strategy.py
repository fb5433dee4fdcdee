"""The BM25 kernel choice (``indexes.bm25_strategy``): each regime gets its kernel, every kernel
forced through ``top_candidates`` gives the exhaustive kernel's answer, and the per-mask facts
are remembered for read-only masks only."""

from __future__ import annotations

import numpy as np
import pytest
from test_bm25_filtered import assert_same

from indexes.bm25 import BM25Index
from indexes.bm25_strategy import (
    PRUNE_MIN_POSTINGS,
    Kernel,
    MaskFacts,
    choose,
)

N_DOCS = 20_000


@pytest.fixture(scope="module")
def index() -> BM25Index:
    rng = np.random.default_rng(5)
    docs = [[f"w{t}" for t in rng.zipf(1.2, size=rng.integers(5, 40)) % 400]
            for _ in range(N_DOCS)]
    return BM25Index.build(docs)


def read_only(mask: np.ndarray) -> np.ndarray:
    mask = mask.copy()
    mask.flags.writeable = False
    return mask


def share_mask(share: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(N_DOCS) < share


def lengths_of(index: BM25Index, tokens: list[str]) -> np.ndarray:
    ids, _ = index.query_terms(tokens)
    return index.indptr[ids + 1] - index.indptr[ids]


def test_each_regime_gets_its_kernel(index: BM25Index) -> None:
    common = ["w1", "w2", "w3"]  # the longest postings
    assert int(lengths_of(index, common).sum()) >= PRUNE_MIN_POSTINGS
    rare = ["w397"]

    def kernel(tokens: list[str], mask: np.ndarray | None) -> Kernel:
        return choose(lengths_of(index, tokens), N_DOCS, mask, MaskFacts(), True).kernel

    assert kernel(rare, None) is Kernel.EXHAUSTIVE
    assert kernel(common, None) is Kernel.PRUNED
    few = np.zeros(N_DOCS, dtype=bool)
    few[[10, 900, 7000]] = True
    assert kernel(common, few) is Kernel.GALLOP
    assert kernel(common, read_only(share_mask(0.03, 1))) is Kernel.RESTRICTED
    assert kernel(common, share_mask(0.03, 1)) is Kernel.MASK_WALK  # writable: not restricted
    assert kernel(common, share_mask(0.15, 2)) is Kernel.MASK_WALK
    assert kernel(common, share_mask(0.6, 3)) is Kernel.PRUNED
    no_restricted = choose(lengths_of(index, common), N_DOCS, read_only(share_mask(0.03, 1)),
                           MaskFacts(), False)
    assert no_restricted.kernel is Kernel.MASK_WALK
    # The exhaustive kernel shared by one thread per core beats MaxScore on one.
    shared = choose(lengths_of(index, common), N_DOCS, None, MaskFacts(), True, shared=True)
    assert shared.kernel is Kernel.EXHAUSTIVE


@pytest.mark.parametrize("kernel", [k for k in Kernel
                                    if k not in (Kernel.GENERAL, Kernel.TOUCHED)])
def test_every_kernel_gives_the_exhaustive_answer(index: BM25Index, kernel: Kernel) -> None:
    rng = np.random.default_rng(7)
    masks = [read_only(share_mask(0.02, 4)), share_mask(0.3, 5), np.ones(N_DOCS, dtype=bool)]
    if kernel not in (Kernel.GALLOP, Kernel.RESTRICTED, Kernel.MASK_WALK):
        masks.append(None)
    for _ in range(25):
        tokens = [f"w{t}" for t in rng.zipf(1.1, size=rng.integers(1, 9)) % 420]
        for mask in masks:
            for k in (1, 10, 300):
                assert_same(index.top_candidates(tokens, k, mask, kernel=kernel),
                            index.top_candidates(tokens, k, mask, kernel="exhaustive"))


def test_a_kernel_that_needs_a_mask_or_the_query_is_refused(index: BM25Index) -> None:
    with pytest.raises(ValueError, match="mask_walk kernel needs a mask"):
        index.top_candidates(["w1"], 10, None, kernel=Kernel.MASK_WALK)
    with pytest.raises(ValueError, match="chosen by the query"):
        index.top_candidates(["w1"], 10, None, kernel=Kernel.GENERAL)
    with pytest.raises(ValueError):
        index.top_candidates(["w1"], 10, None, kernel="fastest")


def test_mask_facts_are_remembered_for_read_only_masks_only() -> None:
    mask = np.zeros(100, dtype=bool)
    mask[[3, 50, 99]] = True
    facts = MaskFacts(size=2)
    assert facts.count(mask) == 3 and facts.rows(mask, 10).tolist() == [3, 50, 99]
    assert len(facts._memo) == 0  # writable: its owner may change it
    frozen = read_only(mask)
    assert facts.rows(frozen, 2) is None  # more allowed than the limit: not listed
    first = facts.rows(frozen, 10)
    assert first.tolist() == [3, 50, 99]
    assert facts.rows(frozen, 10) is first and facts.count(frozen) == 3
