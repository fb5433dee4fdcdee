"""The encode batcher's counters, a search its executor cancelled, and the Redis link's URL
checks: each test names what went wrong before."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from small_index import QUERIES, query_encoder_fixture  # noqa: F401

from retrieval.abandon import ThreadWork, unless_abandoned
from retrieval.errors import ConfigError, InvalidQueryError, RetrieverClosedError
from retrieval.request_path.batching import BatchingConfig, EncodeBatcher
from retrieval.resilience import redact_url, validate_redis_url

REFUSED = "a text the model refuses"


class GatedEncoder:
    """The real encoder; its first call waits for ``release`` (the searches submitted
    meanwhile form the batcher's next call), a call holding ``REFUSED`` is refused, and with
    ``broken`` every later call fails as a dead model server's would. ``calls``: the texts of
    each call."""

    def __init__(self, inner, broken: bool = False) -> None:
        self.inner, self.broken = inner, broken
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[int] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        texts = list(texts)
        self.calls.append(len(texts))
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30), "the test never released the encoder"
        elif self.broken:
            raise RuntimeError("the model server is down")
        if REFUSED in texts:
            raise InvalidQueryError("the model cannot encode this text")
        return self.inner.encode(texts)


def batched(encoder: GatedEncoder, texts: list[str]) -> dict[str, float]:
    """The batcher's stats once it has encoded a lone text, then ``texts`` in one batch."""
    batcher = EncodeBatcher(encoder, BatchingConfig(enabled=True, workers=1, max_batch=64))
    try:
        first = batcher.submit(QUERIES[0])
        assert encoder.entered.wait(30)
        futures = [batcher.submit(text) for text in texts]
        encoder.release.set()
        first.result(30)
        for future in futures:
            future.exception(30)
        return batcher.stats()
    finally:
        batcher.close()


@pytest.mark.parametrize("broken", [False, True], ids=["refused text", "failing encoder"])
def test_batcher_stats_count_every_encoder_call(query_encoder, broken):
    """``encoder_calls`` counted batches that gave a vector: the halves of a refused call were
    not counted, and an encoder failing every call showed no calls at all."""
    gated = GatedEncoder(query_encoder, broken=broken)
    texts = [QUERIES[1], REFUSED, QUERIES[2], QUERIES[3]]
    stats = batched(gated, texts)
    assert gated.calls == ([1, 4] if broken else [1, 4, 2, 1, 1, 2])
    assert stats["encoder_calls"] == len(gated.calls)
    assert stats["largest_batch"] == 4
    assert stats["mean_batch"] == sum(gated.calls) / len(gated.calls)
    assert stats["queries_encoded"] == (1 if broken else 4)  # the lone text, the good three


def test_a_search_its_executor_cancelled_is_a_typed_error():
    """A search queued in an executor shut down with ``cancel_futures=True`` raised asyncio's
    InvalidStateError ("Exception is not set") with a watcher, and without one a bare
    CancelledError, as if the caller's own task had been cancelled."""

    async def scenario() -> list[BaseException]:
        executor = ThreadPoolExecutor(1)
        asyncio.get_running_loop().set_default_executor(executor)
        started, release = threading.Event(), threading.Event()
        blocker = ThreadWork(lambda: started.set() or release.wait(30))  # holds the one thread
        while not started.is_set():  # running, so the shutdown cancels only the queued two
            await asyncio.sleep(0.001)
        queued = [asyncio.ensure_future(unless_abandoned(ThreadWork(lambda: "unrun"), watch))
                  for watch in (asyncio.Event().wait, None)]
        await asyncio.sleep(0.05)
        executor.shutdown(wait=False, cancel_futures=True)
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        release.set()
        await blocker.future
        return outcomes

    for outcome in asyncio.run(scenario()):
        assert isinstance(outcome, RetrieverClosedError), repr(outcome)
        assert "was shut down before this search ran" in str(outcome)


def test_a_cancelled_caller_still_hears_its_cancel():
    """The executor's cancel is told from the caller's own: a task cancelled while it waits
    for its search still ends cancelled."""

    async def scenario() -> None:
        release = threading.Event()
        task = asyncio.ensure_future(unless_abandoned(
            ThreadWork(lambda: release.wait(30)), None))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    asyncio.run(scenario())


def test_a_db_of_non_ascii_digits_is_a_config_error():
    """``"²".isdigit()`` is True: the URL passed, redis-py then read no db from it and used
    db 0 without a word, and with ``cluster`` int() raised a bare ValueError."""
    for cluster in (False, True):
        with pytest.raises(ConfigError, match="the path must be a db number, got '²'"):
            validate_redis_url("redis://h:6379/²", cluster=cluster)


def test_redaction_keeps_an_ipv6_hosts_brackets():
    """The brackets were dropped: ``redis://:***@::1:6379/0``, its port read as part of the
    address."""
    assert redact_url("redis://:s3cret@[::1]:6379/0") == "redis://:***@[::1]:6379/0"
    assert redact_url("rediss://app:s3cret@[2001:db8::5]/1") == "rediss://app:***@[2001:db8::5]/1"


def test_a_vector_set_as_its_wait_runs_out_is_used_not_raised():
    """The encode finished between ``result(timeout)`` timing out and the check whether the
    call was done: the late vector was taken for the encoder's own TimeoutError and raised
    to the search. A trace hook on the waiting thread plays the worker's timing; the worker
    is a real thread setting the future's result."""
    import sys
    from concurrent.futures import Future

    from retrieval.request_path.pipeline import FutureVector

    future: Future = Future()
    future.set_running_or_notify_cancel()
    vector = np.ones(3, dtype=np.float32)

    def finish_on_timeout(frame, event, arg):
        if event == "exception" and frame.f_code.co_name == "get" and \
                issubclass(arg[0], TimeoutError) and not future.done():
            worker = threading.Thread(target=future.set_result, args=((vector, 1.5),))
            worker.start()
            worker.join()
        return finish_on_timeout

    sys.settrace(finish_on_timeout)
    try:
        got, ms = FutureVector(future).get(0.01)
    finally:
        sys.settrace(None)
    assert got is vector and ms == 1.5
    failed: Future = Future()
    failed.set_exception(TimeoutError("the remote model timed out"))
    with pytest.raises(TimeoutError, match="remote model"):  # the encoder's own stays raised
        FutureVector(failed).get(0.01)


def test_a_batcher_dropped_unclosed_stops_its_workers_and_frees_its_encoder(query_encoder):
    """Its workers held the batcher (a bound method), so one never closed kept its threads
    and its encoder alive for the life of the process."""
    import gc
    import weakref

    encoder = GatedEncoder(query_encoder)
    encoder.entered.set()  # no gate: every call encodes at once
    batcher = EncodeBatcher(encoder, BatchingConfig(enabled=True, workers=2, max_batch=8))
    assert batcher.submit(QUERIES[0]).result(30)[0].shape == (encoder.dim,)
    workers, freed = batcher._workers, weakref.ref(encoder)
    del batcher, encoder
    gc.collect()
    for worker in workers:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers)
    assert freed() is None


def test_jobs_queued_when_an_unclosed_batcher_is_collected_are_all_cancelled():
    """A worker finding its batcher collected cancelled one queued job and stopped: the
    others were never settled, and a caller waiting on one without a timeout hung."""
    entered, gate = threading.Event(), threading.Event()

    class HeldEncoder:
        encoder_id, model, dim = "held", "held", 4

        def encode(self, texts, *, batch_size=64, progress=False):
            entered.set()
            assert gate.wait(30), "the test never released the encoder"
            return np.ones((len(texts), self.dim), dtype=np.float32)

    batcher = EncodeBatcher(HeldEncoder(), BatchingConfig(enabled=True, workers=1, max_batch=1))
    first = batcher.submit("one")
    assert entered.wait(30)  # the worker encodes "one"; the rest queue behind it
    queued = [batcher.submit(text) for text in ("two", "three", "four")]
    worker = batcher._workers[0]
    del batcher  # dropped unclosed: collected once the worker has served "one"
    gate.set()
    assert first.result(30)[0].shape == (4,)
    worker.join(30)
    assert not worker.is_alive()
    assert [job.cancelled() for job in queued] == [True] * 3
