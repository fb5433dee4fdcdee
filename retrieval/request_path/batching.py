"""Dynamic batching of query encodings across concurrent searches.

``workers`` threads share one queue. Each takes the first waiting query, then everything else
already queued (up to ``max_batch``), optionally waiting ``max_wait_ms`` for more, and encodes
them in one call. At concurrency 1 nothing waits, so single-request latency is unchanged; under
load, queries that arrive while the encoders are busy form the next batches. Unless
``workers`` is set, an encoder that can run a call on one thread (``single_thread=``, as
OnnxEncoder) gets one worker per core, each call on one thread; any other encoder (torch, or a
wrapper without that parameter) spreads every call over all cores and gets one worker, so
batches do not compete with each other for the cores.

An encoder that refuses a call (``InvalidQueryError``) is asked again in halves of it, down to
each text it refuses on its own (``encode_each``): the search that sent that text hears of it,
the others sharing the call get their vectors.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexes.cpu import usable_cores
from indexes.encoders import Encoder, takes_single_thread
from indexes.errors import EncoderMismatchError, InvalidQueryError, RetrievalError
from retrieval.errors import RetrieverClosedError


class BatchingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None = auto: on for an encoder that spreads one call over every core (torch), off for one
    # that keeps a call to one thread (ONNX): unbatched queries already run one per core there,
    # and batching speeds up only the encode. Measurements: benchmarks/README.md, "Dynamic
    # batching".
    enabled: bool | None = None
    workers: int | None = Field(
        None, ge=1, le=64,
        description="concurrent encoder calls; None = auto: one per core for an encoder whose "
                    "encode takes single_thread= (ONNX), else one, so that batches do not "
                    "compete for the cores a torch call already uses")
    max_batch: int = Field(32, ge=1, le=1024)
    max_wait_ms: float = Field(0.0, ge=0.0, le=100.0,
                               description="extra wait for a fuller batch; 0 = only what queued")


def default_workers(encoder: Encoder) -> int:
    """One worker per usable core (at most 64) for an encoder that can keep a call to one
    thread, else one."""
    return min(64, usable_cores()) if takes_single_thread(encoder) else 1


def _stop_markers(jobs: queue.SimpleQueue[_Job | None], workers: int) -> None:
    for _ in range(workers):
        jobs.put(None)  # one stop marker per worker, queued after every job


def _work(batcher: weakref.ref[EncodeBatcher], jobs: queue.SimpleQueue[_Job | None]) -> None:
    """A worker: waits on the queue alone, holding the batcher only while it serves."""
    while True:
        job = jobs.get()
        if job is None:
            return
        serving = batcher()
        if serving is None:  # collected with jobs queued: each is cancelled (its search, if
            job.future.cancel()  # any, degrades) until this worker's stop marker comes
            continue
        if serving._serve(job):
            return
        del serving


@dataclass
class _Job:
    text: str
    future: Future[tuple[np.ndarray, float]]


class EncodeBatcher:
    """Thread-safe front of an encoder; ``submit`` returns a future of (vector, encode ms)."""

    def __init__(self, encoder: Encoder, config: BatchingConfig) -> None:
        self.encoder = encoder
        self.config = config
        workers = config.workers if config.workers is not None else default_workers(encoder)
        # Several workers each encode on one core: an encoder that would spread a lone call
        # over every core is told to stay on one thread.
        self._narrow = workers > 1 and takes_single_thread(encoder)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._calls = 0  # encoder calls, a refused call's halves each one
        self._texts = 0  # the texts those calls held
        self._encoded = 0  # vectors handed to searches
        self._largest = 0  # most texts in one call
        self._closed = False
        # The workers hold the batcher weakly, and its collection stops them: a Retriever
        # dropped without close() no longer keeps its workers, and through them its encoder
        # (a model's weights), alive for the life of the process.
        self._stop = weakref.finalize(self, _stop_markers, self._queue, workers)
        self._workers = [threading.Thread(target=_work, args=(weakref.ref(self), self._queue),
                                          name=f"encode-batcher-{i}", daemon=True)
                         for i in range(workers)]
        for worker in self._workers:
            worker.start()

    def submit(self, text: str) -> Future[tuple[np.ndarray, float]]:
        """A future of the text's (vector, encode ms); ``RetrieverClosedError`` once closed."""
        future: Future[tuple[np.ndarray, float]] = Future()
        with self._lock:  # a job is queued before the stop markers, or refused
            if self._closed:
                raise RetrieverClosedError()
            self._queue.put(_Job(text, future))
        return future

    def close(self) -> None:
        """Stop the workers once they have encoded every job already queued."""
        with self._lock:
            self._closed = True
            self._stop()  # once, here or at collection

    def stats(self) -> dict[str, float]:
        """Encoder calls made (each half of a refused call too, and failed ones), the
        queries given a vector, and the mean and largest count of texts in a call."""
        with self._lock:
            mean = self._texts / self._calls if self._calls else 0.0
            return {"workers": len(self._workers), "encoder_calls": self._calls,
                    "queries_encoded": self._encoded, "mean_batch": mean,
                    "largest_batch": self._largest}

    def _serve(self, first: _Job) -> bool:
        """Encode ``first`` and the jobs batched with it; whether a stop marker came."""
        batch, stop = self._collect(first)
        self._encode(batch)
        return stop

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """The first job plus what is queued (or arrives within max_wait_ms)."""
        batch = [first]
        deadline = time.perf_counter() + self.config.max_wait_ms / 1e3
        while len(batch) < self.config.max_batch:
            remaining = deadline - time.perf_counter()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else (
                    self._queue.get_nowait())
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
        return batch, False

    def _encode(self, batch: list[_Job]) -> None:
        """Settle every job: its vector, or the encoder's error when it refused the job's text
        on its own. A job hears as soon as the call holding its text returns."""
        # A search that stopped waiting (its deadline) cancelled its job: not encoded.
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not batch:
            return
        started = time.perf_counter()
        outcomes = encode_each(self._encode_texts, [job.text for job in batch])
        for position, job in enumerate(batch):
            try:
                outcome = next(outcomes)
            except BaseException as exc:  # every waiter left must hear about the failure
                for waiting in batch[position:]:
                    waiting.future.set_exception(exc)
                return
            if isinstance(outcome, InvalidQueryError):
                job.future.set_exception(outcome)  # its search alone hears of it
                continue
            with self._lock:  # before the result: a search that has it sees it counted
                self._encoded += 1
            job.future.set_result((outcome, (time.perf_counter() - started) * 1e3))

    def _count_call(self, texts: int) -> None:
        """Count an encoder call of ``texts`` texts, made or about to be: a call refused
        (halved) or failed cost the encoder as much as one answered."""
        with self._lock:
            self._calls += 1
            self._texts += texts
            self._largest = max(self._largest, texts)

    def _encode_texts(self, texts: list[str]) -> np.ndarray:
        self._count_call(len(texts))
        if self._narrow:
            vectors = self.encoder.encode(texts, single_thread=True)  # type: ignore[call-arg]
        else:
            vectors = self.encoder.encode(texts)
        return checked_rows(self.encoder, texts, vectors)


def checked_rows(encoder: Encoder, texts: list[str], vectors: np.ndarray) -> np.ndarray:
    """``vectors``, the encoder's answer to ``texts``, refused where it cannot be their
    vectors: another row count would give searches one another's vectors (or none), and NaN
    scores every document alike (no hits at all)."""
    if len(vectors) != len(texts):
        raise EncoderMismatchError(
            f"the query encoder returned {len(vectors)} vectors for {len(texts)} texts: "
            "an encoder's encode(texts) must return one row per text, in order")
    if not np.isfinite(vectors).all():
        raise RetrievalError(f"the query encoder {encoder.encoder_id!r} gave NaN or "
                             "infinity for these queries; it is broken, not the query")
    return vectors


class RefusedInBatch(Exception):
    """The encoder refused the text at ``position`` of a call's texts on its own
    (``error``, its ``InvalidQueryError``); ``vectors``: the rows of the texts before it."""

    def __init__(self, vectors: list[np.ndarray], position: int,
                 error: InvalidQueryError) -> None:
        super().__init__(f"text {position} of the encoder call: {error}")
        self.vectors, self.position, self.error = vectors, position, error


def encode_until_refused(encode: Callable[[list[str]], np.ndarray], texts: list[str]
                         ) -> np.ndarray:
    """``encode(texts)``, one call; when the encoder refuses the call (``InvalidQueryError``),
    its halves are encoded apart (``_halves``), down to the first text it refuses on its own:
    ``RefusedInBatch`` names that text's position and holds the vectors of those before it.
    Texts refused only together (a call too large for a remote model) are encoded in smaller
    calls, to the same vectors. Only a refused call pays for the extra calls (at most two per
    halving)."""
    try:
        return encode(texts)
    except InvalidQueryError as error:
        if not texts:  # nothing to split: the call itself is refused
            raise
        refused = error
    vectors: list[np.ndarray] = []
    for run in _halves(encode, texts, refused):  # no call past the refused text's
        if isinstance(run, InvalidQueryError):
            raise RefusedInBatch(vectors, len(vectors), run) from None
        vectors.extend(run)
    return np.stack(vectors)


def encode_each(encode: Callable[[list[str]], np.ndarray], texts: list[str]
                ) -> Iterator[np.ndarray | InvalidQueryError]:
    """Each text's vector, in order, or the encoder's error where it refuses the text on its
    own: ``encode(texts)``, one call, or when the encoder refuses it, its halves encoded apart
    (``_halves``). Each call is a node of one halving tree over the texts, so n texts take at
    most 2n - 1 calls (all refused); encoding the texts after each refused one anew took
    n log n (328 calls for 64 texts all refused). The vectors come as each call returns."""
    try:
        vectors = encode(texts)
    except InvalidQueryError as error:
        if not texts:  # nothing to split: the call itself is refused
            raise
        runs: Iterable[np.ndarray | InvalidQueryError] = _halves(encode, texts, error)
    else:
        runs = (vectors,)
    for run in runs:
        if isinstance(run, InvalidQueryError):
            yield run
        else:
            yield from run


def _halves(encode: Callable[[list[str]], np.ndarray], texts: list[str],
            error: InvalidQueryError) -> Iterator[np.ndarray | InvalidQueryError]:
    """The rows of ``texts``, which the encoder refused in one call (``error``), in runs: each
    half's call's rows, or its halves' when refused in turn, down to a single text refused on
    its own (the encoder's error in its place)."""
    if len(texts) == 1:
        yield error
        return
    middle = len(texts) // 2
    for half in (texts[:middle], texts[middle:]):
        try:
            vectors = encode(half)
        except InvalidQueryError as refused:
            yield from _halves(encode, half, refused)
        else:
            yield vectors
