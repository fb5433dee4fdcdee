"""A search whose caller stopped waiting (``asearch(abandoned=...)``, an HTTP client gone)
while it still waited for a thread is dropped: ``SearchAbandonedError``, and it never runs."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from small_index import index_fixture  # noqa: F401 - the module's index

from retrieval import Retriever, SearchAbandonedError


class CountingEncoder:
    """The real encoder, counting the texts it encodes (a search that runs encodes its query)."""

    def __init__(self, inner) -> None:
        self.inner, self.texts = inner, 0
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim

    def encode(self, texts, *, batch_size: int = 64, progress: bool = False):
        self.texts += len(texts)
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


@pytest.mark.parametrize("batch", [False, True], ids=["asearch", "asearch_batch"])
def test_a_search_abandoned_while_queued_is_dropped_unrun(index, encoder, batch):
    counting = CountingEncoder(encoder)
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=counting) as retriever:
        encoded_at_load = counting.texts
        release = threading.Event()

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(1))
            blocker = loop.run_in_executor(None, release.wait)  # the one thread is busy
            gone = asyncio.Event()
            search = (retriever.asearch_batch(["heart disease"], abandoned=gone.wait) if batch
                      else retriever.asearch("heart disease", abandoned=gone.wait))
            task = asyncio.ensure_future(search)
            await asyncio.sleep(0.05)
            assert not task.done()  # queued behind the blocker
            gone.set()  # the caller leaves
            with pytest.raises(SearchAbandonedError, match="dropped"):
                await task
            release.set()
            await blocker
            await asyncio.sleep(0.05)  # a job left in the queue would run now
            kept = (await retriever.asearch_batch(["heart disease"], abandoned=asyncio.Event().wait)
                    if batch else await retriever.asearch("heart disease",
                                                           abandoned=asyncio.Event().wait))
            assert kept  # a caller still waiting gets its answer

        asyncio.run(scenario())
        assert counting.texts == encoded_at_load + 1  # only the search still wanted ran


def test_a_timeout_drops_the_queued_work_and_a_broken_watcher_is_its_own_error():
    """A timeout around ``unless_abandoned`` cancelled only the watcher, so the queued search
    still ran; a watcher that raised read as a caller gone, its error lost."""
    from retrieval.abandon import ThreadWork, unless_abandoned

    ran: list[str] = []

    async def broken() -> None:
        raise RuntimeError("watcher bug")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        release = threading.Event()
        blocker = loop.run_in_executor(None, release.wait)  # the one thread is busy
        try:
            queued = ThreadWork(lambda: ran.append("timed out"))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(unless_abandoned(queued, asyncio.Event().wait), 0.05)
            with pytest.raises(RuntimeError, match="watcher bug"):
                await unless_abandoned(ThreadWork(lambda: ran.append("broken")), broken)
        finally:
            await asyncio.sleep(0.01)  # a cancel reaches the executor's job on the next turn
            release.set()
        await blocker
        await asyncio.sleep(0.05)  # a job left in the queue would run now

    asyncio.run(scenario())
    assert ran == []


def test_a_search_abandoned_while_computing_is_waited_for():
    """A caller gone while its search computes: the search cannot be stopped, so the caller
    waits for its thread before it hears ``SearchAbandonedError``. It heard it at once, and
    the service freed the admission slot while the thread still computed: with clients that
    gave up, more searches computed side by side than ``server.max_in_flight``."""
    from retrieval.abandon import ThreadWork, unless_abandoned

    async def scenario() -> None:
        computing, release = threading.Event(), threading.Event()

        def search() -> str:
            computing.set()
            release.wait(30)
            return "answer nobody reads"

        gone = asyncio.Event()
        caller = asyncio.ensure_future(unless_abandoned(ThreadWork(search), gone.wait))
        while not computing.is_set():
            await asyncio.sleep(0.001)
        gone.set()
        await asyncio.sleep(0.1)
        assert not caller.done(), "the caller left while its search still computed"
        release.set()
        with pytest.raises(SearchAbandonedError):
            await caller

    asyncio.run(scenario())
