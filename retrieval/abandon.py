"""Work a caller stopped waiting for: dropped while it still waits for a thread.

An HTTP client that disconnects leaves its search queued behind the worker threads; computing
it serves nobody and delays the searches of clients still waiting. ``unless_abandoned`` races
the executor future against the caller's ``abandoned()`` awaitable: if that completes first,
the future is cancelled (a job that has not started never runs; one already running finishes
on its thread, its answer discarded) and ``SearchAbandonedError`` is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from retrieval.errors import SearchAbandonedError

T = TypeVar("T")
Abandoned = Callable[[], Awaitable[Any]]


async def unless_abandoned(work: asyncio.Future[T], abandoned: Abandoned | None) -> T:
    if abandoned is None:
        return await work
    watcher = asyncio.ensure_future(abandoned())
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:  # this task cancelled (a timeout around it) drops the queued work too
        watcher.cancel()
        if not work.done():
            work.cancel()
    if work.cancelled():
        if not watcher.cancelled() and watcher.exception() is not None:
            raise watcher.exception()  # type: ignore[misc] # a broken watcher, not a caller gone
        raise SearchAbandonedError("the caller stopped waiting; the search was dropped")
    return work.result()
