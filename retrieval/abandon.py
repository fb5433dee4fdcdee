"""Work a caller stopped waiting for: dropped while it still waits for a thread.

An HTTP client that disconnects leaves its search queued behind the worker threads; computing
it serves nobody and delays the searches of clients still waiting. ``unless_abandoned`` races
the work against the caller's ``abandoned()`` awaitable: if that completes first, a job that
has not started never runs, one already running is waited for (its answer discarded), and
``SearchAbandonedError`` is raised. The wait keeps whatever the caller holds (the service's
admission slot) held while a thread still computes: freed at once, more searches than the
limit would compute side by side.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from retrieval.errors import RetrieverClosedError, SearchAbandonedError

T = TypeVar("T")
Abandoned = Callable[[], Awaitable[Any]]


class ThreadWork(Generic[T]):
    """``call`` in the running loop's default executor, which its caller may drop."""

    def __init__(self, call: Callable[[], T]) -> None:
        loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        # then "running" and "done"; "dropped" (never runs) or "dropped while running"
        self._phase = "queued"
        self.finished: asyncio.Future[None] = loop.create_future()
        self.future: asyncio.Future[T] = loop.run_in_executor(None, self._run, call, loop)

    def _run(self, call: Callable[[], T], loop: asyncio.AbstractEventLoop) -> T:
        with self._lock:
            if self._phase == "dropped":  # its future is cancelled: nobody reads this
                raise asyncio.CancelledError
            self._phase = "running"
        try:
            return call()
        finally:
            with self._lock:
                waited = self._phase == "dropped while running"
                self._phase = "done"
            if waited:  # only then: a wake-up of the loop per search costs
                loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def drop(self) -> bool:
        """Cancel the work; True when a thread is computing it (``finished`` tells when not)."""
        with self._lock:
            if self._phase == "queued":
                self._phase = "dropped"
            elif self._phase == "running":
                self._phase = "dropped while running"
            running = self._phase == "dropped while running"
        self.future.cancel()
        return running


async def unless_abandoned(work: ThreadWork[T], abandoned: Abandoned | None) -> T:
    if abandoned is None:
        try:
            return await work.future
        except asyncio.CancelledError:
            current = asyncio.current_task()  # this task's own cancel propagates
            if work.future.cancelled() and current is not None and not current.cancelling():
                raise executor_cancelled() from None
            raise
    watcher = asyncio.ensure_future(abandoned())
    try:
        await asyncio.wait((work.future, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:  # this task cancelled (a timeout around it) drops the queued work too
        watcher.cancel()
        running = not work.future.done() and work.drop()
    if running:
        await work.finished
    if work.future.cancelled():
        if not watcher.done():  # the caller still waits: its executor cancelled the work
            raise executor_cancelled()
        if not watcher.cancelled() and watcher.exception() is not None:
            raise watcher.exception()  # type: ignore[misc] # a broken watcher, not a caller gone
        raise SearchAbandonedError("the caller stopped waiting; the search was dropped")
    return work.future.result()


def executor_cancelled() -> RetrieverClosedError:
    """The error of a search its executor cancelled before it ran (one shut down with
    ``cancel_futures=True``): no caller left, and no cancel of the caller's own task."""
    return RetrieverClosedError("the executor that runs searches (the event loop's default "
                                "executor) was shut down before this search ran; serve from "
                                "a loop whose executor is running")
