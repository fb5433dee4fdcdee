"""The console's sides: a request holds its side's retriever by a lease, so a variant that
other requests push out is closed when its last lease ends, never under a search still
running on it; and two requests making the same variant at once leave one open, not two.

Real retrievers over a small root with random 8-dimensional vectors (no model): searches pass
their query vector.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_index import build_small, scifact_docs, unit_vectors

from retrieval import Retriever
from retrieval.console.sides import MAX_VARIANTS, Ranking, Side, Sides
from retrieval.errors import RetrieverClosedError
from retrieval.models import SearchResult

CONFIG = {"cache": {"backend": "none"}, "live_lag_seconds": None}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, dataset: Any) -> Path:
    root = tmp_path_factory.mktemp("console-sides") / "index"
    build_small(root, scifact_docs(dataset("scifact"), 60))
    return root


@pytest.fixture()
def serving(root: Path) -> Iterator[Retriever]:
    with Retriever.load(root, CONFIG) as retriever:
        yield retriever


@pytest.fixture()
def sides(root: Path) -> Iterator[Sides]:
    kept = Sides(root)
    yield kept
    kept.close()


def weighted(weight: float) -> Side:
    return Side(ranking=Ranking(vector_weight=weight))


def search(retriever: Retriever) -> SearchResult:
    return retriever.search("cancer cells", query_vector=unit_vectors(1, 5)[0], k=3)


def push_out(sides: Sides, serving: Retriever) -> None:
    """Ask for MAX_VARIANTS other rankings: every variant kept before is dropped."""
    for i in range(MAX_VARIANTS):
        with sides.lease(serving, weighted(0.5 + i / 10)):
            pass


def test_a_leased_variant_outlives_being_dropped_and_closes_when_released(sides, serving):
    """A variant was closed by the request that pushed it out, under the request still
    searching on it: 503 RetrieverClosedError."""
    with sides.lease(serving, weighted(0.1)) as mine:
        push_out(sides, serving)
        assert search(mine).hits  # dropped, but leased: still open
    with pytest.raises(RetrieverClosedError):
        search(mine)  # its last lease ended: closed
    with sides.lease(serving, weighted(0.1)) as again:
        assert again is not mine and search(again).hits  # no longer kept: made anew


def test_a_released_variant_stays_kept_until_pushed_out(sides, serving):
    with sides.lease(serving, weighted(0.1)) as first:
        pass
    with sides.lease(serving, weighted(0.1)) as second:
        assert second is first and search(second).hits
    push_out(sides, serving)
    with pytest.raises(RetrieverClosedError):
        search(first)  # unleased when dropped: closed at once


def test_the_side_that_changes_nothing_is_the_serving_retriever(sides, serving):
    with sides.lease(serving, Side()) as retriever:
        assert retriever is serving
    push_out(sides, serving)
    sides.close()
    assert search(serving).hits  # the service closes it, not the sides


class MeetingRetriever(Retriever):
    """A serving retriever whose variants two requests make at once: each waits in
    ``with_ranking``, its variant made, until the other has made its own."""

    meeting: threading.Barrier
    made: list[Retriever]

    def with_ranking(self, *args: Any, **kwargs: Any) -> Retriever:
        variant = super().with_ranking(*args, **kwargs)
        self.made.append(variant)
        self.meeting.wait()
        return variant


def test_two_requests_making_one_variant_at_once_leave_one_open(root, sides):
    """The second replaced the first in the kept map, and the first was never closed: its
    threads outlived ``Sides.close``."""
    with MeetingRetriever.load(root, CONFIG) as serving:
        serving.meeting, serving.made = threading.Barrier(2, timeout=60), []
        answered: list[Retriever] = []

        def request() -> None:
            with sides.lease(serving, weighted(0.3)) as retriever:
                answered.append(retriever)
                search(retriever)

        threads = [threading.Thread(target=request) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(serving.made) == 2 and len(answered) == 2
        kept = answered[0]
        assert answered[1] is kept  # both answered by the one kept
        (extra,) = [r for r in serving.made if r is not kept]
        with pytest.raises(RetrieverClosedError):
            search(extra)  # the one made in vain is closed at once
        sides.close()
        for made in serving.made:
            with pytest.raises(RetrieverClosedError):
                search(made)


def test_a_request_cancelled_while_its_side_opens_ends_its_lease(sides, serving):
    """The lease the worker thread takes for a cancelled request is ended by nobody else:
    counted forever, its variant would be retired when dropped and never closed."""

    async def cancelled() -> None:
        async def request() -> None:
            async with sides.alease(serving, weighted(0.2)):
                raise AssertionError("cancelled before its side opened")

        task = asyncio.create_task(request())
        await asyncio.sleep(0)  # it waits on the thread opening its side
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The thread ends later; the lease it took is ended on this loop then.
        deadline = time.monotonic() + 60
        while not _kept_and_unleased(sides):
            assert time.monotonic() < deadline, "the cancelled request's lease never ended"
            await asyncio.sleep(0.01)

    asyncio.run(cancelled())
    with sides.lease(serving, weighted(0.2)) as variant:
        pass
    push_out(sides, serving)
    with pytest.raises(RetrieverClosedError):
        search(variant)


def _kept_and_unleased(sides: Sides) -> bool:
    kept = list(sides._variants.values())  # what the lease count is, not what it answers
    return len(kept) == 1 and kept[0].leases == 0
