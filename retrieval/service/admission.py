"""Admission control in front of the executor: a request that takes a worker thread (a search,
a document read or write, a console search, schema or gate) past ``server.max_in_flight`` is shed
at once (503 ``OverloadedError`` with ``Retry-After``) instead of queueing behind the worker
threads, so the work a worker holds for clients that may have gone is bounded too.

The count is taken on the event loop, before a search is handed to a thread: the retriever's
own ``max_in_flight`` is counted inside the executor, behind its unbounded queue, so on a
2-core machine (6 executor threads) a limit of 6 or more never fired and 1,024 connections
queued until their clients timed out (p99 4.8 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from indexes.cpu import usable_cores
from retrieval.errors import OverloadedError

SEARCHES_PER_CORE = 16  # in flight per core before shedding: a few ms of queue per core


def default_limit() -> int:
    """Searches a worker admits at once, from the cores it may use."""
    return SEARCHES_PER_CORE * usable_cores()


class Admission:
    """Searches admitted and running in this worker; one event loop uses it (no lock)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit if limit is not None else default_limit()
        self.active = 0
        self.shed = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        if self.active >= self.limit:
            self.shed += 1
            raise OverloadedError(f"{self.active} requests in flight, the limit of this worker "
                                  "(server.max_in_flight); retry shortly")
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
