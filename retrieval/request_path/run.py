"""The request path, as one sequence of stages (the ``Retriever`` owns the lifecycle around it):

    validate → cache lookup (result + embedding, one round trip; a result hit returns)
             → embed ∥ filter → BM25 (+ dense leg, by ``candidate_policy``) → re-rank → fuse
             → features → hydrate                                              (``pipeline``)
             → cache write (queued, off the critical path)

Every stage is timed (``StageTimer``); what waits on something else takes what is left of the
search's ``Deadline``: the embedding wait gives up when the budget is spent (the search then
ranks by BM25 alone), the feature read is skipped past it, and a Ray shard that has not
answered is left out (``deadline.CURRENT``). The stages that compute always run (``limits``
bound them). A degraded result is returned, counted and never cached. Identical concurrent
cache misses compute once (single flight); a search that joined one computes for itself,
time left, when the leader's deadline degraded or failed it (``caused_by_deadline``): any
other failure is shared, so a failing backend is not asked again by every follower.
``search_batch`` has one budget for the whole call; given one, its one encoder call runs in
another thread and each query waits for its vector no longer than what is left.
Searches past ``max_in_flight`` are refused with ``OverloadedError`` before any work.
``search`` runs it all in the caller's thread; ``begin`` + ``resume`` split it at the cache
lookup, so an event loop can serve in-process cache hits itself (``Retriever.asearch``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from indexes.cpu import usable_cores
from indexes.encoders import Encoder, takes_single_thread
from indexes.errors import InvalidQueryError
from indexes.fan_out import search_alone
from retrieval.cache.base import CacheCounters
from retrieval.config import RetrieverConfig
from retrieval.errors import RetrieverClosedError
from retrieval.loaded_build import LoadedBuild
from retrieval.models import CacheInfo, CacheStatus, SearchResult
from retrieval.query_encoder import query_window
from retrieval.relevance import Calibration
from retrieval.request_path.batching import (
    EncodeBatcher,
    RefusedInBatch,
    checked_rows,
    encode_until_refused,
)
from retrieval.request_path.cache_lookup import Lookup, RequestCache, own_containers
from retrieval.request_path.deadline import NO_DEADLINE, Deadline, caused_by_deadline, within
from retrieval.request_path.encode_policy import InFlight, StageOverlap, batching_on
from retrieval.request_path.feature_stage import FeatureStage
from retrieval.request_path.grouping import grouping_key
from retrieval.request_path.pipeline import (
    FutureVector,
    PendingVector,
    ReadyVector,
    run_pipeline,
    timed_encode,
)
from retrieval.request_path.timing import StageTimer
from retrieval.request_path.validate import (
    FilterMemo,
    SearchRequest,
    batch_vectors,
    check_batch_queries,
    check_batch_work,
    check_deadline,
    check_query_text,
    in_batch,
    validate,
    validate_options,
)
from retrieval.tracing import Observer


@dataclass(frozen=True)
class Live:
    """What one request binds to at its start: a build and its filter memo, never mixed."""

    snapshot: LoadedBuild
    filters: FilterMemo
    relevance: Calibration | None = None  # gives hits their relevance (retrieval.relevance)


@dataclass(frozen=True)
class Begun:
    """A search validated and looked up in the caches, not yet computed."""

    request: SearchRequest
    lookup: Lookup | None
    timer: StageTimer
    deadline: Deadline




UNTRACED = nullcontext()  # reusable: it keeps no state


@contextmanager
def _failures_traced(observer: Observer) -> Iterator[None]:
    started = time.time_ns()
    try:
        yield
    except Exception as exc:
        observer.failed(exc, started)
        raise


class RequestPath:
    """The stages of a search over a ``Live`` build, and the threads and counters they use."""

    def __init__(self, config: RetrieverConfig, encoder: Encoder | None,
                 cache: RequestCache | None, features: FeatureStage | None) -> None:
        self.config = config
        self.encoder = encoder
        self.cache = cache
        self.features = features
        self._config_key = config.fingerprint()
        # Encodes that overlap filter + BM25 run here: one worker per core, first come first
        # served, so under load at most one model run per core and no request starves.
        self._pool = ThreadPoolExecutor(max_workers=max(2, usable_cores()),
                                        thread_name_prefix="retrieval")
        self.batcher = (EncodeBatcher(encoder, config.batching)
                        if encoder is not None and batching_on(encoder, config) else None)
        self.overlap = StageOverlap(encoder, config) if encoder is not None else None
        # With other searches in flight the encoder keeps a single query to one thread.
        self.in_flight = InFlight(config.max_in_flight)
        self._hint_threads = encoder is not None and takes_single_thread(encoder)
        self.window = query_window(encoder)  # a query longer than it gets a warning
        self.degraded = CacheCounters(("embed", "features", "partial"))
        self.observer = Observer(config.tracing)

    # -- one search --------------------------------------------------------------------------

    def search(self, live: Live, query: str, filters: Any, k: int | None,
               candidates: int | None, query_vector: np.ndarray | None,
               deadline_ms: float | None, group_by: Any = None, context: Any = 0,
               explain: bool = False, queued_ms: float = 0.0) -> SearchResult:
        """``queued_ms``: how long the search waited for a thread before this call (spent
        from its deadline, and its ``queue`` stage)."""
        with self.failures_traced():
            deadline = Deadline(check_deadline(deadline_ms, self.config), spent_ms=queued_ms)
            with self.in_flight:  # OverloadedError here, before any work, past max_in_flight
                begun = self._begin(live, query, filters, k, candidates, query_vector is None,
                                    deadline, group_by, context, explain, queued_ms)
                if isinstance(begun, SearchResult):
                    return begun
                return self._finish(live, begun, query_vector)

    def failures_traced(self) -> AbstractContextManager[None]:
        """A span for a search that raises in this block (``Observer.failed``); with tracing
        off, nothing to do on the request path."""
        return _failures_traced(self.observer) if self.observer.tracing else UNTRACED

    @property
    def reads_without_blocking(self) -> bool:
        """Whether a cache lookup never waits on I/O (an in-process cache), so an event loop
        may run validate + lookup itself and leave only misses to a worker thread."""
        return self.cache is not None and self.cache.cache.in_process

    def begin(self, live: Live, query: str, filters: Any, k: int | None, *,
              candidates: int | None = None, deadline_ms: float | None = None,
              group_by: Any = None, context: Any = 0, explain: bool = False
              ) -> SearchResult | Begun:
        """Validate and look up the caches (``reads_without_blocking`` caches only): a
        result-cache hit is the whole search; otherwise ``resume`` continues it."""
        with self.failures_traced():
            deadline = Deadline(check_deadline(deadline_ms, self.config))
            with self.in_flight:
                return self._begin(live, query, filters, k, candidates, True, deadline,
                                   group_by, context, explain)

    def resume(self, live: Live, begun: Begun) -> SearchResult:
        """The rest of a search ``begin`` started, usually in a worker thread."""
        with self.failures_traced(), self.in_flight:
            begun.timer.lap("queue")  # waiting for the thread is not the next stage's time
            return self._finish(live, begun, None)

    def _begin(self, live: Live, query: str, filters: Any, k: int | None,
               candidates: int | None, cacheable: bool, deadline: Deadline, group_by: Any,
               context: Any, explain: bool = False, queued_ms: float = 0.0
               ) -> SearchResult | Begun:
        timer = timer_after({"queue": queued_ms}) if queued_ms else StageTimer()
        request = validate(query, filters, k, candidates, self.config, live.filters,
                           group_by, context, explain)
        timer.lap("validate")
        # A caller-supplied vector is not part of any key, so its results are not cached.
        lookup = (self._lookup(live, request, deadline)
                  if cacheable and self.cache is not None else None)
        if lookup is not None:
            timer.lap("cache")
            if lookup.result is not None:
                return self._done(served_from_cache(lookup.result, request, timer), timer)
        return Begun(request, lookup, timer, deadline)

    def _finish(self, live: Live, begun: Begun, query_vector: np.ndarray | None
                ) -> SearchResult:
        request, lookup, timer = begun.request, begun.lookup, begun.timer

        ran: list[bool] = []

        def compute() -> SearchResult:
            ran.append(True)
            return self._compute(live, request, lookup, query_vector, timer, begun.deadline)

        if lookup is None:
            return self._done(compute(), timer)
        assert self.cache is not None
        try:
            result = self.cache.once(lookup.result_key, compute, begun.deadline.remaining())
        except Exception as exc:
            if ran or not caused_by_deadline(exc) or begun.deadline.expired():
                raise  # its own failure, or one any search would meet: shared, no stampede
            # The leader's deadline failed it (a shard slower than that budget): this search
            # has time left, so it computes for itself, once, as for a degraded result.
            return self._done(compute(), timer)
        if not ran:  # another search's result: its query text, timings and hit list
            # are not this one's, and a result its deadline degraded is recomputed here
            result = compute() if result.degraded else served_from_cache(result, request,
                                                                         timer)
        return self._done(result, timer)

    def _lookup(self, live: Live, request: SearchRequest, deadline: Deadline) -> Lookup:
        assert self.cache is not None
        return self.cache.lookup_many([self._keys(live, request)], live.snapshot.build_id,
                                      live.snapshot.vectors.dim, deadline)[0]

    def _compute(self, live: Live, request: SearchRequest, lookup: Lookup | None,
                 query_vector: np.ndarray | None, timer: StageTimer, deadline: Deadline
                 ) -> SearchResult:
        """Embed ∥ filter → BM25 → re-rank → fuse → features → hydrate, then the cache write."""
        snapshot = live.snapshot
        search_alone(self.in_flight.count <= 1)
        cached_vector = lookup.embedding if lookup is not None else None
        if cached_vector is not None:
            pending: PendingVector = ReadyVector(cached_vector)
        else:
            pending = self._embedding(request.query, query_vector, snapshot, deadline)
        with within(deadline):  # what waits on another machine (Ray shards) waits no longer
            result, vector = run_pipeline(snapshot, request, pending, timer, self.config,
                                          "hit" if cached_vector is not None else None,
                                          self.features, deadline, live.relevance,
                                          self._encoder_id)
        self._note_window(result)
        if self.cache is None and result.cache.embedding == "miss":  # no cache to miss
            result.cache = CacheInfo(result="off", embedding="off")
        if lookup is not None and self.cache is not None:
            result.cache = CacheInfo(result="miss", embedding=result.cache.embedding)
            if lasting(result):
                self.cache.store(lookup, result, vector if cached_vector is None else None)
        return result

    # -- many searches -------------------------------------------------------------------------

    def search_batch(self, live: Live, queries: Sequence[str], filters: Any, k: int | None,
                     candidates: int | None, query_vectors: np.ndarray | None,
                     deadline_ms: float | None = None, group_by: Any = None, context: Any = 0,
                     explain: bool = False, queued_ms: float = 0.0) -> list[SearchResult]:
        """Many queries with the same options: one validation of the options, one cache round
        trip, one encoder call. ``deadline_ms`` (default ``config.deadline_ms``) is one budget
        for the whole call, ``queued_ms`` (the wait for a thread) spent from it: each query
        waits for the encoder no longer than what is left of it, and skips the feature read
        past it, as one search does."""
        with self.failures_traced():
            deadline = Deadline(check_deadline(deadline_ms, self.config), spent_ms=queued_ms)
            return self._search_batch(live, queries, filters, k, candidates, query_vectors,
                                      deadline, {"queue": queued_ms} if queued_ms else {},
                                      group_by, context, explain)

    def _search_batch(self, live: Live, queries: Sequence[str], filters: Any, k: int | None,
                      candidates: int | None, query_vectors: np.ndarray | None,
                      deadline: Deadline, before: dict[str, float], group_by: Any,
                      context: Any, explain: bool) -> list[SearchResult]:
        check_batch_queries(queries)
        check_batch_work(len(queries), k, candidates, self.config)
        started = time.perf_counter()
        shared = validate_options(filters, k, candidates, self.config, live.filters, group_by,
                                  context, explain)
        requests = [replace(shared, query=in_batch(position, functools.partial(
                        check_query_text, q, self.config))) for position, q in enumerate(queries)]
        given = None if query_vectors is None else batch_vectors(
            query_vectors, len(queries), live.snapshot.vectors.given_query)
        before = {**before, "validate": (time.perf_counter() - started) * 1e3}
        with self.in_flight:
            if given is None and self.cache is not None:
                return self._cached_batch(live, requests, before, deadline)
            status: CacheStatus = "provided" if given is not None else "off"  # no cache
            if given is not None:
                pending: list[PendingVector] = [ReadyVector(v) for v in given]
            else:
                pending, embed = self._batch_embeddings([r.query for r in requests], deadline)
                before = {**before, **embed}
            return [in_batch(i, functools.partial(self._batch_query, live, r, p, status, before,
                                                  deadline))[0]
                    for i, (r, p) in enumerate(zip(requests, pending, strict=True))]

    def _batch_embeddings(self, texts: list[str], deadline: Deadline
                          ) -> tuple[list[PendingVector], dict[str, float]]:
        """The vectors of a batch's queries from one encoder call, and the stage that call
        adds to every query's timings before its own ("embed" when it ran here).

        Without a deadline the call runs here. With one it runs in the encode pool and each
        query waits for its row at most what is left of the budget (``BatchRow``): a query
        whose vector is not in by then ranks by BM25 alone, and the encode finishes unwatched
        (its vectors are not cached: no search is left to hand them to).

        A text the encoder refuses on its own (``encode_until_refused``) fails the batch when
        its query's turn comes, so the caller's ``in_batch`` names that query's position."""
        if self.encoder is None:
            self.encode(texts)  # raises: this index has no query encoder
        if not deadline.active:
            started = time.perf_counter()
            pending = ready_rows(self.encode, texts)
            return pending, {"embed": (time.perf_counter() - started) * 1e3}
        try:
            future = self._pool.submit(timed_encode_all, self.encode, texts)
        except RuntimeError as exc:  # the pool shut down: closed while this searched
            raise RetrieverClosedError() from exc
        return [BatchRow(future, row) for row in range(len(texts))], {}

    def _batch_query(self, live: Live, request: SearchRequest, pending: PendingVector,
                     status: CacheStatus, before: dict[str, float], deadline: Deadline
                     ) -> tuple[SearchResult, np.ndarray | None]:
        """One query of a batch within the batch's deadline, and the query vector it used;
        ``before``: the stages the batch ran once for it and the others (``timer_after``)."""
        timer = timer_after(before)
        search_alone(self.in_flight.count <= 1)
        with within(deadline):  # what waits on another machine (Ray shards) waits no longer
            result, vector = run_pipeline(live.snapshot, request, pending, timer, self.config,
                                          status, self.features, deadline, live.relevance,
                                          self._encoder_id)
        self._note_window(result)
        return self._done(result, timer), vector

    def _cached_batch(self, live: Live, requests: list[SearchRequest],
                      before: dict[str, float], deadline: Deadline) -> list[SearchResult]:
        """One cache round trip for the batch, one encoder call for the embedding misses."""
        assert self.cache is not None
        snapshot = live.snapshot
        started = time.perf_counter()
        lookups = self.cache.lookup_many([self._keys(live, r) for r in requests],
                                         snapshot.build_id, snapshot.vectors.dim, deadline)
        looked_up = {**before, "cache": (time.perf_counter() - started) * 1e3}
        missing = [i for i, look in enumerate(lookups)
                   if look.result is None and look.embedding is None]
        fresh: dict[int, PendingVector] = {}
        encoded = looked_up
        if missing:
            vectors, embed = self._batch_embeddings([requests[i].query for i in missing],
                                                    deadline)
            fresh, encoded = dict(zip(missing, vectors, strict=True)), {**looked_up, **embed}
        results = []
        for i, (request, lookup) in enumerate(zip(requests, lookups, strict=True)):
            if lookup.result is not None:
                timer = timer_after(looked_up)
                results.append(self._done(served_from_cache(lookup.result, request, timer),
                                          timer))
                continue
            results.append(in_batch(i, functools.partial(
                self._cached_batch_query, live, request, lookup, fresh.get(i),
                encoded if i in fresh else looked_up, deadline)))
        return results

    def _cached_batch_query(self, live: Live, request: SearchRequest, lookup: Lookup,
                            fresh: PendingVector | None, before: dict[str, float],
                            deadline: Deadline) -> SearchResult:
        """A result-cache miss of a batch, by the vector of the batch's encoder call
        (``fresh``) or else the embedding cache's; cached when it lasts (``lasting``)."""
        assert self.cache is not None
        status: CacheStatus = "miss" if fresh is not None else "hit"
        if fresh is None:
            assert lookup.embedding is not None
            fresh = ReadyVector(lookup.embedding)
        result, vector = self._batch_query(live, request, fresh, status, before, deadline)
        result.cache = CacheInfo(result="miss", embedding=result.cache.embedding)
        if lasting(result):
            self.cache.store(lookup, result, vector if status == "miss" else None)
        return result

    # -- stages' helpers -------------------------------------------------------------------------

    def _keys(self, live: Live, request: SearchRequest) -> tuple[str, str | None]:
        assert self.cache is not None
        relevance = live.relevance.calibration_id if live.relevance is not None else "-"
        # The query encoder ranks too: a result computed with one encoder's query vector is
        # never served to a search that would embed the query with another.
        return self.cache.keys(
            build_id=live.snapshot.build_id,
            snapshot_id=self.features.snapshot_key() if self.features is not None else "",
            config_key=f"{self._config_key}:{request.candidates}{grouping_key(request)}"
                       f"{':explain' if request.explain else ''}:{relevance}:{self._encoder_id}",
            query=request.query,
            filter_key=request.filter_key, k=request.k,
            encoder_id=self._encoder_id,
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:
            raise InvalidQueryError(
                "this index was built from precomputed vectors and has no query encoder; pass "
                "query_vector=... or load the retriever with encoder=..."
            )
        if self._hint_threads and self.in_flight.count > 1:
            vectors = self.encoder.encode(texts, single_thread=True)  # type: ignore[call-arg]
        else:
            vectors = self.encoder.encode(texts)
        return checked_rows(self.encoder, texts, vectors)

    def _embedding(self, text: str, query_vector: np.ndarray | None, snapshot: LoadedBuild,
                   deadline: Deadline = NO_DEADLINE) -> PendingVector:
        """The query vector: given, or encoded (with parallel stages: started now, so it
        computes while filter + BM25 run). Only searches running alongside others go through
        the batcher: a lone one has nothing to be batched with, so it skips the hand-off.
        With a deadline the encode always runs in another thread, so the search can stop
        waiting for it."""
        if query_vector is not None:
            return ReadyVector(snapshot.vectors.given_query(query_vector))
        in_flight = self.in_flight.count
        overlap = deadline.active or (self.overlap is not None and self.overlap.now(in_flight))
        if self.batcher is not None and in_flight > 1:
            future = self.batcher.submit(text)
            return FutureVector(future) if overlap else ReadyVector(*future.result())
        if overlap:
            try:
                return FutureVector(self._pool.submit(timed_encode, self.encode, text))
            except RuntimeError as exc:  # the pool shut down: closed while this searched
                raise RetrieverClosedError() from exc
        return ReadyVector(*timed_encode(self.encode, text))

    def _note_window(self, result: SearchResult) -> None:
        """Warn when the query encoder read only the start of the query (before the result
        is cached: a cache hit carries the warning). Only when its vector ranked the hits
        (``query_encoder``): not for a caller's vector nor one that missed the deadline."""
        if self.window is not None and result.query_encoder is not None:
            warning = self.window.warning(result.query)
            if warning is not None:
                result.warnings = [*result.warnings, warning]

    @property
    def _encoder_id(self) -> str | None:
        return self.encoder.encoder_id if self.encoder is not None else None

    def _done(self, result: SearchResult, timer: StageTimer) -> SearchResult:
        if result.degraded:  # "partial:<shard>" counts as "partial"
            self.degraded.add(**dict.fromkeys((d.split(":")[0] for d in result.degraded), 1))
        self.observer.observe(result, timer)
        return result

    # -- lifecycle (called by the Retriever) ---------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "latency_ms": self.observer.latency.summary(),
            "cache": self.cache.stats() if self.cache is not None else None,
            "batching": self.batcher.stats() if self.batcher is not None else None,
            "parallel_stages": self.overlap.describe() if self.overlap else None,
            "in_flight": self.in_flight.count,
            "shed": self.in_flight.shed,
            "degraded": self.degraded.snapshot(),
        }

    def close(self) -> None:
        self.in_flight.close()
        if self.batcher is not None:
            self.batcher.close()
        self._pool.shutdown(wait=False)


def served_from_cache(cached: SearchResult, request: SearchRequest, timer: StageTimer
                      ) -> SearchResult:
    """A cached result with this request's query text, timings and cache status, its lists
    its own (``own_containers``: decoded results are shared between hits of the same entry)."""
    return own_containers(cached, query=request.query, timings=timer.finish(),
                          cache=CacheInfo(result="hit", embedding="skipped"))


def lasting(result: SearchResult) -> bool:
    """Whether a result may be served to later searches from the cache: not one a passing
    fault shaped (a deadline, a shard left out, a feature store that did not answer while its
    snapshot key still names the good snapshot)."""
    return not result.degraded and result.features_available is not False


def timer_after(before: dict[str, float]) -> StageTimer:
    """A timer holding stages done for its request before it started, in order, each counted
    in its ``total`` (its result was not ready before they were done): the wait for a thread,
    or what a batch ran once for all its queries (validation, the cache round trip, the
    encode)."""
    timer = StageTimer(before_ms=sum(before.values()))
    offset = 0.0
    for stage, milliseconds in before.items():
        timer.record(stage, milliseconds, start_offset_ms=offset)
        offset += milliseconds
    return timer


class BatchRow(FutureVector):
    """Row ``row`` of a batch's one encoder call, running in another thread: every query of
    the batch waits on the same call, each for at most what is left of the batch's budget.
    From the row whose text the encoder refused on its own, ``get`` raises the encoder's
    error (the rows before it have their vectors)."""

    def __init__(self, future: Future[tuple[np.ndarray, float]], row: int) -> None:
        super().__init__(future)
        self._row = row

    def get(self, timeout: float | None = None) -> tuple[np.ndarray | None, float | None]:
        try:
            vectors, ms = super().get(timeout)
        except RefusedInBatch as refused:
            if self._row < refused.position:
                return refused.vectors[self._row], None
            raise refused.error from None
        return (None, None) if vectors is None else (vectors[self._row], ms)


class RefusedRow(PendingVector):
    """A row of a batch the encoder did not encode: its text, or one before it in the same
    call, was refused; ``get`` raises the encoder's error."""

    def __init__(self, error: InvalidQueryError) -> None:
        self._error = error

    def get(self, timeout: float | None = None) -> tuple[np.ndarray | None, float | None]:
        raise self._error


def ready_rows(encode: Callable[[list[str]], np.ndarray], texts: list[str]
               ) -> list[PendingVector]:
    """The vectors of a batch's texts, encoded here; the rows from the first text the encoder
    refuses on its own raise its error (``RefusedRow``)."""
    try:
        vectors = list(encode_until_refused(encode, texts))
    except RefusedInBatch as refused:
        return ([ReadyVector(v) for v in refused.vectors]
                + [RefusedRow(refused.error)] * (len(texts) - refused.position))
    return [ReadyVector(v) for v in vectors]


def timed_encode_all(encode: Callable[[list[str]], np.ndarray], texts: list[str]
                     ) -> tuple[np.ndarray, float]:
    """``encode(texts)`` (shape (len(texts), dim)) and the ms it took; ``RefusedInBatch``
    when the encoder refuses a text of them on its own (``encode_until_refused``)."""
    started = time.perf_counter()
    vectors = encode_until_refused(encode, texts)
    return vectors, (time.perf_counter() - started) * 1e3

