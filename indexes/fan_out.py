"""Running a search's parts at once: the shards of a sharded build (``each_part``), the row
blocks of one BM25 index (``by_threads``, ``indexes.bm25``).

The BM25 and dense kernels release the GIL (numba ``nogil``, faiss), so S parts run on S
cores: the caller's thread takes the first part and a small pool the others. A hand-off to
a pool thread costs tens of microseconds, more than a small shard's whole BM25 top C, so a
call fans out to threads only when its work is large (``THREADS_FROM_POSTINGS``: the query
terms' postings over all shards); below that the shards run one after another in the caller's
thread, as a whole build would.

Only a search alone in its retriever fans out (``search_alone``); under concurrency each
search keeps to its thread. Measured at 1M passages, S = 2 (``benchmarks.shards``, old and new
alternated twice; benchmarks/README.md, "In-process shards in threads"): S = 2 minus unsharded
went from +0.21 / +0.26-0.29 ms (p50 / p95, shards one after another) to -0.05 / -0.47-0.83;
at 2 and 4 concurrent callers throughput and latency stayed as they were.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from indexes.cpu import usable_cores

T = TypeVar("T")

# Below this many postings (all query terms, all shards) the shards run in the caller's
# thread: SciFact-sized shards' BM25 (~20,000 postings, ~0.05 ms) gains nothing from a pool
# hand-off (~0.03 ms each way), 1M-passage shards (~290,000 postings, ~0.45 ms each) do.
THREADS_FROM_POSTINGS = 50_000

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_local = threading.local()  # .alone: this thread's search is its retriever's only one


def _not_alone() -> None:
    _local.alone = False  # a part already runs beside others: its own parts stay in its thread


def _shared_pool() -> ThreadPoolExecutor:
    """One pool per process for every build: a core each beyond the caller's."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, usable_cores() - 1),
                                       thread_name_prefix="retrieval-part",
                                       initializer=_not_alone)
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist here (a pool made before a
    fork would take work and never run it); the next fan-out makes the child's own."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def search_alone(alone: bool) -> None:
    """Say whether the search about to run on this thread is its retriever's only one in
    flight (``RequestPath`` calls it before each search): only a lone search fans out to
    threads, as only a lone search's encode uses every core. Under concurrency the cores are
    busy with other searches and threads only add hand-offs and switches: at 2 callers on 2
    cores (1M passages, S = 2) threads for every search cut the throughput by 15%."""
    _local.alone = alone


def fans_out() -> bool:
    """Whether a search on this thread may run its parts at once now: several cores, and the
    search is alone (``search_alone``) and not itself a part running beside others."""
    return usable_cores() > 1 and getattr(_local, "alone", True)


def each_part(calls: Sequence[Callable[[], T]], parallel: bool) -> list[T]:
    """The results of ``calls`` (one per part), in order; at once on the pool when
    ``parallel``, there are several and ``fans_out()``, else one after another in this thread.
    A call the pool has not started by the time this thread is free is taken back and run
    here, so a search never waits behind another for a part."""
    if not parallel or len(calls) < 2 or not fans_out():
        return [call() for call in calls]
    futures = [_shared_pool().submit(call) for call in calls[1:]]
    _local.alone = False  # the parts this thread runs fan out no further
    try:
        results = [calls[0]()]
        for call, future in zip(calls[1:], futures, strict=True):
            results.append(call() if future.cancel() else future.result())
    finally:
        _local.alone = True
    return results


class Beside(Generic[T]):
    """A search's other stage (its dense leg), run by the first pool thread of the next
    ``by_threads`` fan-out of this thread's search before that pool thread takes its share:
    so it runs beside the caller's share, and the blocks it would have taken are the
    caller's. Not handed to a pool thread (no fan-out happened, or the pool thread had not
    started by the end), ``result`` runs it in the caller. Made by ``beside``; a stage of
    None is offered to no fan-out, and its result is None."""

    def __init__(self, stage: Callable[[], T] | None) -> None:
        self._stage = stage
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.future: Future[None] | None = None  # the pool's call running it, once handed

    def run(self) -> None:
        try:
            self._value = self._stage() if self._stage is not None else None
        except BaseException as exc:  # raised again in the caller, by ``result``
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> T:
        if self.future is None or self.future.cancel():  # never handed over, or not started
            if not self._done.is_set():
                self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@contextmanager
def beside(stage: Callable[[], T] | None) -> Iterator[Beside[T]]:
    """``stage`` offered to the fan-outs this thread starts inside the block."""
    part = Beside(stage)
    _local.beside = part if stage is not None else None
    try:
        yield part
    finally:
        _local.beside = None


def by_threads(call: Callable[[int], object], threads: int, finished: Callable[[], bool]
               ) -> None:
    """Run ``call(slot)`` on this thread (slot 0) and on ``threads - 1`` pool threads at once,
    for work the calls share out among themselves as they go (``bm25_kernels.
    claimed_top_rows``): a pool thread that starts late takes less of it, and one that has
    not started when the work is done is not waited for. ``finished()``: whether every call's
    share is done, waiting a little without sleeping; when it says no, this thread blocks on
    the pool threads' calls instead. A pending ``Beside`` stage runs on the first pool thread
    before its share."""
    part: Beside[Any] | None = getattr(_local, "beside", None)
    futures: list[Future[Any]] = []
    for slot in range(1, threads):
        if slot == 1 and part is not None:
            _local.beside = None  # one fan-out takes it

            def first(part: Beside[Any] = part) -> None:
                part.run()
                call(1)

            part.future = _shared_pool().submit(first)
            futures.append(part.future)
        else:
            futures.append(_shared_pool().submit(call, slot))
    call(0)
    if finished():
        for future in futures:
            future.cancel()  # not started: nothing left for it
        return
    for future in futures:
        future.result()
