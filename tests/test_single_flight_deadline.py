"""Single flight and a leader's deadline: identical concurrent searches share one computation
(the in-process result cache's ``once``), and what the leader's own deadline caused (a shard
that did not answer within its budget, ``ShardUnavailableError.by_deadline``) is not handed to
a follower that still has time: that one computes for itself, once. Any other failure is
shared, so a failing backend is not asked again by every follower.

The shard is the build's BM25 answered the way the Ray layout's shard calls answer: waited
for within the search's deadline (``deadline.CURRENT``), a typed error past it. Gates, not
sleeps, order the leader, the follower and the shard's answer.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from polling import wait_until
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from indexes.bm25 import BM25Index
from retrieval import Retriever, ShardUnavailableError
from retrieval.cache import make_cache
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.request_path.deadline import CURRENT

SHARD = "shard-001"


class AwaitedShardBM25(BM25Index):
    """The build's BM25 behind a shard this process waits on. ``top_candidates`` says it was
    entered, waits until ``joined`` (the test's follower has joined the flight), then waits
    for the shard's answer (``answers``) as the Ray layout does: no longer than what is left
    of the search's deadline, past which it fails with the deadline's error. ``down``: the
    shard fails at once, of its own (no replica), deadline or not."""

    def __init__(self, local: BM25Index) -> None:
        self.__dict__.update(vars(local))  # the same postings and statistics
        self.entered = threading.Semaphore(0)
        self.calls = 0
        self.joined = threading.Event()
        self.answers = threading.Event()
        self.down = False

    def top_candidates(self, tokens, n, mask=None, kernel=None):
        self.calls += 1
        self.entered.release()
        assert self.joined.wait(30), "the test never let the shard go on"
        if self.down:
            raise ShardUnavailableError(f"shard {SHARD} has no live replica", SHARD)
        deadline = CURRENT.get()
        wait = deadline.remaining()
        if not self.answers.wait(30 if wait is None else wait):
            assert deadline.active, "the test never let the shard answer"
            raise ShardUnavailableError(f"shard {SHARD} did not answer within the search's "
                                        "deadline", SHARD, by_deadline=True)
        return super().top_candidates(tokens, n, mask, kernel)


@pytest.fixture()
def shard_retriever(index, query_encoder):
    """A retriever with the in-process result cache over the small index, its BM25 the
    awaited shard's."""
    loaded = LoadedBuild.load(index)
    shard = AwaitedShardBM25(loaded.bm25)
    config = RetrieverConfig(cache={"backend": "memory"})
    retriever = Retriever(replace(loaded, bm25=shard), config, query_encoder,
                          make_cache(config.cache))
    with retriever, ThreadPoolExecutor(2) as callers:
        yield retriever, shard, callers


def _lead_then_join(retriever, shard, callers, query, **follower_options):
    """A leader with a short deadline inside the shard, then a follower joined to its
    flight; the shard goes on only once the follower waits on the leader."""
    leader = callers.submit(retriever.search, query, k=5, deadline_ms=300)
    assert shard.entered.acquire(timeout=30)  # the leader is waiting on the shard
    follower = callers.submit(retriever.search, query, k=5, **follower_options)
    assert wait_until(lambda: retriever.stats()["cache"]["single_flight"]["shared"] == 1, 30)
    shard.joined.set()
    return leader, follower


@pytest.mark.parametrize("follower_deadline_ms", [None, 60_000])
def test_a_follower_with_time_left_computes_for_itself_past_the_leaders_deadline(
        shard_retriever, follower_deadline_ms) -> None:
    """The leader's 300 ms ran out waiting on the shard: the follower (no deadline, or one
    with a minute left) got the leader's ShardUnavailableError as its own answer."""
    retriever, shard, callers = shard_retriever
    leader, follower = _lead_then_join(retriever, shard, callers, QUERIES[5],
                                       deadline_ms=follower_deadline_ms)
    with pytest.raises(ShardUnavailableError, match="within the search's deadline") as failed:
        leader.result(timeout=30)
    assert failed.value.by_deadline and failed.value.shard == SHARD
    shard.answers.set()  # the shard answers the follower's own call
    result = follower.result(timeout=30)
    assert result.hits and result.degraded == []
    assert result.cache.result == "miss"  # computed here, not the leader's
    assert shard.calls == 2  # the leader's call and the follower's one retry, no more


def test_a_failure_not_caused_by_the_deadline_is_shared_with_the_followers(
        shard_retriever) -> None:
    """A shard with no live replica fails every search alike: the follower takes the
    leader's error and does not ask the shard again."""
    retriever, shard, callers = shard_retriever
    shard.down = True
    leader, follower = _lead_then_join(retriever, shard, callers, QUERIES[6])
    with pytest.raises(ShardUnavailableError, match="no live replica") as led:
        leader.result(timeout=30)
    with pytest.raises(ShardUnavailableError) as followed:
        follower.result(timeout=30)
    assert followed.value is led.value and not led.value.by_deadline
    assert shard.calls == 1
