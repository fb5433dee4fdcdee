"""The exhaustive BM25 kernel by blocks of rows claimed by threads (``claimed_top_rows``),
and one index's blocks shared by one thread per core (``BM25Index``, ``indexes.fan_out``):
the same top C, scores bit for bit and ties, as ``general_rows``, which keeps its own list of
touched rows, whichever thread takes which block, or none."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_bm25_filtered import SETTINGS, assert_same, cases

from indexes.bm25 import BM25Index
from indexes.bm25_kernels import (
    BLOCK_ROWS,
    SCAN_FROM,
    best_found,
    claimed_top_rows,
    general_rows,
    new_found,
)
from indexes.fan_out import beside, by_threads, search_alone


def reference(index: BM25Index, tokens: list[str], mask: np.ndarray, k: int
              ) -> tuple[np.ndarray, np.ndarray]:
    ids, weights = index.query_terms(tokens)
    n = index.n_docs
    return general_rows(index.indptr, index.rows, index.impacts, ids, weights, mask, True, k,
                        np.zeros(n), np.zeros(n, dtype=np.bool_), np.empty(n, dtype=np.int32))


def claimed_by(index: BM25Index, tokens: list[str], mask: np.ndarray, k: int, block: int,
               threads: int, late: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` with ``threads`` real threads claiming blocks of ``block`` rows at once,
    then ``late`` more calls after every block was taken (threads that started too late)."""
    ids, weights = index.query_terms(tokens)
    scratch = np.zeros(index.n_docs)
    claims, found_r, found_s, sizes = new_found(threads + late, k)

    def run(slot: int) -> None:
        claimed_top_rows(index.indptr, index.rows, index.impacts, ids, weights, mask, True, k,
                         scratch, block, claims, found_r, found_s, sizes, slot)

    workers = [threading.Thread(target=run, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for slot in range(threads, threads + late):
        run(slot)
    assert claims[1] == -(-index.n_docs // block)  # every block finished, once
    assert not scratch.any()  # the scratch contract: left all zeros
    return best_found(found_s, found_r, sizes, k)


@SETTINGS
@given(cases(), st.sampled_from([1, 2, 3, 16, BLOCK_ROWS]), st.integers(1, 3), st.integers(0, 1))
def test_claimed_blocks_equal_the_reference(
        case: tuple[BM25Index, list[str], np.ndarray, int], block: int, threads: int,
        late: int) -> None:
    index, tokens, mask, k = case
    ids, _ = index.query_terms(tokens)
    if index._nonpositive and not index._nonpositive.isdisjoint(ids.tolist()):
        return  # the kernel needs positive impacts; general_rows handles these queries
    assert_same(claimed_by(index, tokens, mask, k, block, threads, late),
                reference(index, tokens, mask, k))


@pytest.mark.parametrize("finished", [True, False])
def test_by_threads_waits_for_the_pool_only_when_the_work_is_not_finished(finished: bool
                                                                           ) -> None:
    """Slot 0 runs in the caller, slot 1 on the pool. When ``finished`` says the shared work
    is done the caller returns at once, its pool slot still running; otherwise it blocks
    until the pool's slot returns."""
    release, pool_done, ran = threading.Event(), threading.Event(), []

    def call(slot: int) -> None:
        ran.append(slot)
        if slot == 1:
            release.wait(10)
            pool_done.set()

    search_alone(True)
    if not finished:
        release.set()  # the pool's slot returns as soon as it runs
    by_threads(call, 2, lambda: finished)
    assert 0 in ran
    assert pool_done.is_set() is not finished
    release.set()


def test_a_large_query_on_a_large_index_splits_its_rows_and_answers_the_same() -> None:
    """Three row blocks and a query of ~100,000 postings: searched alone, the blocks are
    shared by one thread per core (this host has two); under concurrency one thread takes
    them all. Both answers equal the reference, ties included (many documents repeat)."""
    rng = np.random.default_rng(5)
    n_docs = 2 * BLOCK_ROWS + 1_000
    docs = [[f"w{t}" for t in rng.integers(0, 12, size=rng.integers(1, 6))]
            for _ in range(n_docs)]
    index = BM25Index.build(docs)
    query = ["w1", "w2", "w3", "w1"]
    ids, _ = index.query_terms(query)
    postings = int(np.sum(index.indptr[ids + 1] - index.indptr[ids]))
    everything = np.ones(n_docs, dtype=bool)
    want = reference(index, query, everything, 300)
    try:
        search_alone(False)
        assert index._threads(postings) == 1
        assert_same(index.top_candidates(query, 300), want)
        search_alone(True)
        assert index._threads(postings) == 2
        assert_same(index.top_candidates(query, 300), want)
        assert_same(index.top_candidates(query, 300, everything), want)
        assert_same(index.top_candidates(query, 300, kernel="exhaustive"), want)
        assert_same(index.top_candidates(query, 7, everything, kernel="exhaustive"),
                    reference(index, query, everything, 7))
    finally:
        search_alone(True)


def test_a_stage_beside_the_blocks_runs_on_the_pool_thread_or_else_in_the_caller() -> None:
    """A ``Beside`` stage pending when a large query fans out leaves the answer unchanged;
    with no fan-out (under concurrency) ``result`` runs it in the caller; a stage's error is
    raised by ``result``."""
    rng = np.random.default_rng(6)
    n_docs = 2 * BLOCK_ROWS + 1_000
    docs = [[f"w{t}" for t in rng.integers(0, 12, size=rng.integers(1, 6))]
            for _ in range(n_docs)]
    index = BM25Index.build(docs)
    query = ["w1", "w2", "w3"]
    want = reference(index, query, np.ones(n_docs, dtype=bool), 300)
    caller = threading.get_ident()
    try:
        for _ in range(5):  # on the pool thread, or the caller's when it finished first
            with beside(threading.get_ident) as stage:
                assert_same(index.top_candidates(query, 300), want)
            assert isinstance(stage.result(), int)
        search_alone(False)
        with beside(threading.get_ident) as stage:
            assert_same(index.top_candidates(query, 300), want)
        assert stage.result() == caller
        with beside(None) as nothing:  # no stage: nothing offered, nothing to wait for
            assert_same(index.top_candidates(query, 300), want)
        assert nothing.result() is None
        with beside(lambda: 1 // 0) as failing:
            index.top_candidates(query, 300)
        with pytest.raises(ZeroDivisionError):
            failing.result()
    finally:
        search_alone(True)


def test_a_stage_beside_a_fan_out_runs_on_the_pool_thread_before_its_share() -> None:
    """The caller's share waits until the stage has started: only a stage handed to the
    pool thread can start meanwhile (else this waits 10 s and fails)."""
    started, order = threading.Event(), []

    def stage() -> int:
        started.set()
        order.append("stage")
        return threading.get_ident()

    def call(slot: int) -> None:
        if slot == 0:
            assert started.wait(10)
        else:
            order.append("share")

    search_alone(True)
    with beside(stage) as part:
        by_threads(call, 2, lambda: False)
    assert part.result() != threading.get_ident()
    assert order == ["stage", "share"]


def _pool_answers_in_child() -> bool:
    from indexes import fan_out

    return fan_out._shared_pool().submit(lambda: True).result(timeout=10)


def test_a_forked_child_makes_its_own_pool() -> None:
    """A pool started before a fork (its threads are the parent's): the child's first part
    still runs, on a pool of the child's own, instead of waiting for threads it does not
    have."""
    import multiprocessing

    from indexes import fan_out

    assert fan_out._shared_pool().submit(lambda: True).result(timeout=10)
    with multiprocessing.get_context("fork").Pool(1) as child:
        assert child.apply(_pool_answers_in_child)


@pytest.mark.parametrize("block", [64, 1024])
def test_blocks_scanned_or_walked_again_give_the_same_answer(block: int) -> None:
    """Common query terms fill some blocks (their slots are scanned, ``_offer_slots``) and
    leave others sparse (their postings are walked again); a mask excludes half the rows,
    ties abound. Every top k equals the reference, and both ways were taken."""
    rng = np.random.default_rng(7)
    n_docs = 8 * block
    dense = np.arange(n_docs) < 3 * block  # the first 3 blocks hold w1 and w2 in every row
    docs = [[f"w{t}" for t in rng.integers(3, 40, size=rng.integers(1, 5))]
            + (["w1", "w2"] if dense[row] else []) for row in range(n_docs)]
    index = BM25Index.build(docs)
    query = ["w1", "w2", "w3"]
    ids, _ = index.query_terms(query)
    assert not index._nonpositive & set(ids.tolist())  # the kernel's positive impacts
    others = np.concatenate([index.rows[index.indptr[t]:index.indptr[t + 1]] for t in ids[:2]])
    per_block = np.bincount(others // block, minlength=8)  # postings of w1 and w2 by block
    assert (per_block * SCAN_FROM > block).any() and (per_block * SCAN_FROM <= block).any()
    mask = rng.random(n_docs) < 0.5
    for k in (1, 10, 300):
        for threads in (1, 2):
            assert_same(claimed_by(index, query, mask, k, block, threads),
                        reference(index, query, mask, k))
