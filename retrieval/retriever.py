"""The Retriever: the public front door; orchestration only (it owns no algorithm).

Per request: validate → one cache lookup (result + embedding) → on a miss, the query embedding
starts in another thread (the encode batcher) while filter + BM25 run here → exact re-rank of
the candidates → fusion → hydrate → cache write off the critical path → stats and spans.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.encoders import (
    DEFAULT_MODEL,
    Encoder,
    SentenceTransformerEncoder,
    compatible_query_encoder,
    takes_single_thread,
    usable_cores,
)
from indexes.errors import EncoderMismatchError, InvalidQueryError, RetrievalError
from indexes.history import publication_of
from indexes.manifest import resolve_build_dir
from retrieval.batching import EncodeBatcher
from retrieval.cache import Cache, make_cache
from retrieval.config import RetrieverConfig
from retrieval.encode_policy import InFlight, StageOverlap, batching_on
from retrieval.feature_stage import FeatureStage
from retrieval.features import OnlineStore, make_store
from retrieval.models import CacheInfo, SearchResult
from retrieval.pipeline import (
    FutureVector,
    PendingVector,
    ReadyVector,
    run_pipeline,
    timed_encode,
)
from retrieval.request import FilterMemo, SearchRequest, validate
from retrieval.request_cache import Lookup, RequestCache
from retrieval.snapshot import IndexSnapshot
from retrieval.timing import StageTimer
from retrieval.tracing import Observer

log = logging.getLogger(__name__)


def default_encoder(snapshot: IndexSnapshot, config: RetrieverConfig) -> Encoder | None:
    """The encoder the build names; None for builds from precomputed (external) vectors."""
    info = snapshot.manifest.encoder
    if config.encoder_model_path is None and info.model != DEFAULT_MODEL:
        return None
    if config.encoder_backend == "torch":
        return SentenceTransformerEncoder(config.encoder_model_path)
    from indexes.onnx_encoder import make_encoder

    return make_encoder(config.encoder_backend, config.encoder_model_path)


def check_encoder(encoder: Encoder, snapshot: IndexSnapshot) -> None:
    expected = snapshot.manifest.encoder
    compatible = compatible_query_encoder(encoder.encoder_id, expected.encoder_id)
    if not compatible or encoder.dim != expected.dim:
        raise EncoderMismatchError(
            f"query encoder {encoder.encoder_id!r} does not match the index's "
            f"{expected.encoder_id!r}; load the retriever with the encoder the index was built "
            "with (or a declared compatible backend of the same model), or rebuild the index"
        )


@dataclass(frozen=True)
class _Live:
    """What one request binds to at its start: a build and its filter memo, never mixed."""

    snapshot: IndexSnapshot
    filters: FilterMemo


class Retriever:
    """Two-stage hybrid search over the live build. Thread-safe; one instance serves many."""

    def __init__(
        self, snapshot: IndexSnapshot, config: RetrieverConfig, encoder: Encoder | None,
        cache: Cache | None = None, root: Path | None = None,
        feature_store: OnlineStore | None = None,
    ) -> None:
        if encoder is not None:
            check_encoder(encoder, snapshot)
        self.config = config
        self.encoder = encoder
        self.root = root
        self._live = _Live(snapshot, FilterMemo(snapshot.metadata.kinds, config.limits))
        self._config_key = config.fingerprint()
        self._cache = RequestCache(cache, config.cache) if cache is not None else None
        # Encodes that overlap filter + BM25 run here: one worker per core, first come first
        # served, so under load at most one model run per core and no request starves.
        self._pool = ThreadPoolExecutor(max_workers=max(2, usable_cores()),
                                        thread_name_prefix="retrieval")
        self._batcher = (EncodeBatcher(encoder, config.batching)
                         if encoder is not None and batching_on(encoder, config) else None)
        self._overlap = StageOverlap(encoder, config) if encoder is not None else None
        # With other searches in flight the encoder keeps a single query to one thread.
        self._in_flight = InFlight()
        self._hint_threads = encoder is not None and takes_single_thread(encoder)
        self._observer = Observer(config.tracing)
        self._features = (FeatureStage(feature_store, config.features, config.recency,
                                       config.feature_snapshot_refresh_seconds)
                          if (feature_store is not None and config.features) or config.recency
                          else None)
        self._reloader: Any = None
        now = time.monotonic()
        self.reload_events: list[dict[str, Any]] = [
            {"event": "loaded", "build_id": snapshot.build_id, "swapped_at": (now, now)}]

    @classmethod
    def load(
        cls,
        path: str | Path,
        config: RetrieverConfig | dict[str, Any] | None = None,
        *,
        encoder: Encoder | None = None,
        cache: Cache | None = None,
        feature_store: OnlineStore | None = None,
    ) -> Retriever:
        """Load the live build under ``path`` (or a build directory), verified and mmapped.

        The cache is built from ``config.cache`` (in-process by default) unless one is given.
        """
        if not isinstance(config, RetrieverConfig):
            config = RetrieverConfig(**(config or {}))
        snapshot = IndexSnapshot.load(path, verify=config.verify_checksums, mmap=config.mmap)
        if encoder is None:
            encoder = default_encoder(snapshot, config)
        if feature_store is None and config.feature_store is not None:
            feature_store = make_store(config.feature_store)
        retriever = cls(snapshot, config, encoder, cache or make_cache(config.cache), Path(path),
                        feature_store)
        retriever._warm_up()
        if config.reload_interval_seconds is not None:
            from retrieval.reload import Reloader

            retriever._reloader = Reloader(retriever, config.reload_interval_seconds)
        return retriever

    @property
    def build_id(self) -> str:
        return self._live.snapshot.build_id

    @property
    def snapshot(self) -> IndexSnapshot:
        return self._live.snapshot

    def _warm_up(self) -> None:
        """Compile the kernel and run the model once, so the first request is not cold."""
        self.snapshot.bm25.top_candidates(["warmup"], 1)
        if self._features is not None:
            self._features.doc_ids(self.snapshot)
        if self.encoder is not None:
            self.encoder.encode(["warm up"])

    # -- lifecycle --------------------------------------------------------------------------

    def reload(self) -> bool:
        """Load the build ``CURRENT`` names if it changed; swap atomically. True if swapped.

        The new build is loaded and verified off the request path; a build that fails
        verification is refused, logged and reported in ``stats()``, and the old one serves on.
        Requests in flight finish on the build they started with.
        """
        if self.root is None:
            return False
        try:
            if resolve_build_dir(self.root) == self.snapshot.path:
                return False
            fresh = IndexSnapshot.load(self.root, verify=self.config.verify_checksums,
                                       mmap=self.config.mmap)
            if self.encoder is not None:
                check_encoder(self.encoder, fresh)
            fresh.bm25.top_candidates(["warmup"], 1)
        except RetrievalError as exc:
            log.error("refused new build under %s: %s", self.root, exc)
            self.reload_events.append({"event": "refused", "error": str(exc)})
            return False
        swap_started = time.monotonic()
        self._live = _Live(fresh, FilterMemo(fresh.metadata.kinds, self.config.limits))
        self.reload_events.append({"event": "loaded", "build_id": fresh.build_id,
                                   "swapped_at": (swap_started, time.monotonic()),
                                   **publication_of(self.root, fresh.build_id)})
        log.info("now serving build %s", fresh.build_id)
        return True

    def live_windows(self) -> dict[str, tuple[float, float]]:
        """Monotonic-clock window in which each build served: from just before its swap to
        just after the next one (a request bound to it started and ended inside)."""
        loads = [e for e in self.reload_events if e["event"] == "loaded"]
        ends = [e["swapped_at"][1] for e in loads[1:]] + [float("inf")]
        return {e["build_id"]: (e["swapped_at"][0] if i else float("-inf"), end)
                for i, (e, end) in enumerate(zip(loads, ends, strict=True))}

    def close(self) -> None:
        """Stop worker threads and the cache's writer (queued cache writes are flushed)."""
        if self._reloader is not None:
            self._reloader.stop()
        if self._batcher is not None:
            self._batcher.close()
        self._pool.shutdown(wait=False)
        if self._cache is not None:
            self._cache.cache.close()

    def stats(self) -> dict[str, Any]:
        """Rolling p50/p95/p99 per stage, cache counters and breaker state, batching, whether
        stages run in parallel, reloads."""
        return {
            "build_id": self.build_id,
            "latency_ms": self._observer.latency.summary(),
            "cache": self._cache.stats() if self._cache is not None else None,
            "batching": self._batcher.stats() if self._batcher is not None else None,
            "parallel_stages": self._overlap.describe() if self._overlap else None,
            "reloads": list(self.reload_events[-20:]),
        }

    def flush_cache_writes(self, timeout: float = 5.0) -> bool:
        """Wait until queued cache writes are done (tests and orderly shutdown)."""
        return self._cache.cache.flush_writes(timeout) if self._cache is not None else True

    # -- search -----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        filters: dict[str, Any] | str | None = None,
        k: int | None = None,
        *,
        candidates: int | None = None,
        query_vector: np.ndarray | None = None,
    ) -> SearchResult:
        """Best ``k`` passages for ``query`` among documents allowed by ``filters``."""
        with self._in_flight:
            return self._search(query, filters, k, candidates, query_vector)

    def _search(self, query: str, filters: dict[str, Any] | str | None, k: int | None,
                candidates: int | None, query_vector: np.ndarray | None) -> SearchResult:
        live = self._live
        timer = StageTimer()
        request = validate(query, filters, k, candidates, self.config, live.filters)
        timer.lap("validate")
        if self._cache is None or query_vector is not None:
            # A caller-supplied vector is not part of any key, so its results are not cached.
            pending = self._embedding(request.query, query_vector, live.snapshot)
            result = run_pipeline(live.snapshot, request, pending, timer, self.config,
                                  features=self._features)[0]
            return self._done(result, timer)
        cache = self._cache
        lookup = cache.lookup_many([self._keys(live.snapshot, request)], live.snapshot.build_id,
                                   live.snapshot.vectors.dim)[0]
        timer.lap("cache")
        if lookup.result is not None:
            return self._done(_served_from_cache(lookup.result, request, timer), timer)
        result = cache.once(lookup.result_key,
                            lambda: self._miss(live.snapshot, request, lookup, timer))
        return self._done(result, timer)

    def search_batch(
        self,
        queries: Sequence[str],
        filters: dict[str, Any] | str | None = None,
        k: int | None = None,
        *,
        candidates: int | None = None,
        query_vectors: np.ndarray | None = None,
    ) -> list[SearchResult]:
        """Search many queries with the same filters; their embeddings are one encoder call."""
        live = self._live
        requests = [validate(q, filters, k, candidates, self.config, live.filters)
                    for q in queries]
        with self._in_flight:
            if query_vectors is None and self._cache is not None:
                return self._cached_batch(live.snapshot, requests)
            vectors = query_vectors if query_vectors is not None else self._encode(
                [r.query for r in requests])
            status = "provided" if query_vectors is not None else "miss"
            return [self._uncached(live.snapshot, r, ReadyVector(v), status)
                    for r, v in zip(requests, vectors, strict=True)]

    async def asearch(self, query: str, filters: dict[str, Any] | str | None = None,
                      k: int | None = None, **options: Any) -> SearchResult:
        """``search`` for asyncio apps: runs in the retriever's threads, never blocks the loop."""
        call = functools.partial(self.search, query, filters, k, **options)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def asearch_batch(self, queries: Sequence[str],
                            filters: dict[str, Any] | str | None = None, k: int | None = None,
                            **options: Any) -> list[SearchResult]:
        call = functools.partial(self.search_batch, queries, filters, k, **options)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    # -- internals ----------------------------------------------------------------------------

    def _done(self, result: SearchResult, timer: StageTimer) -> SearchResult:
        self._observer.observe(result, timer)
        return result

    def _uncached(self, snapshot: IndexSnapshot, request: SearchRequest, pending: PendingVector,
                  status: str) -> SearchResult:
        timer = StageTimer()
        result = run_pipeline(snapshot, request, pending, timer, self.config,
                              status, self._features)[0]  # type: ignore[arg-type]
        return self._done(result, timer)

    def _cached_batch(self, snapshot: IndexSnapshot, requests: list[SearchRequest]
                      ) -> list[SearchResult]:
        """One cache round trip for the batch, one encoder call for the embedding misses."""
        assert self._cache is not None
        lookups = self._cache.lookup_many([self._keys(snapshot, r) for r in requests],
                                          snapshot.build_id, snapshot.vectors.dim)
        missing = [i for i, look in enumerate(lookups)
                   if look.result is None and look.embedding is None]
        fresh = dict(zip(missing, self._encode([requests[i].query for i in missing]),
                         strict=True)) if missing else {}
        results = []
        for i, (request, lookup) in enumerate(zip(requests, lookups, strict=True)):
            if lookup.result is not None:
                timer = StageTimer()
                results.append(self._done(_served_from_cache(lookup.result, request, timer),
                                          timer))
                continue
            vector = fresh.get(i, lookup.embedding)
            assert vector is not None
            result = self._uncached(snapshot, request, ReadyVector(vector),
                                    "miss" if i in fresh else "hit")
            result.cache = CacheInfo(result="miss", embedding=result.cache.embedding)
            self._cache.store(lookup, result, fresh.get(i))
            results.append(result)
        return results

    def _keys(self, snapshot: IndexSnapshot, request: SearchRequest) -> tuple[str, str | None]:
        assert self._cache is not None
        return self._cache.keys(
            build_id=snapshot.build_id,
            snapshot_id=self._features.snapshot_key() if self._features is not None else "",
            config_key=f"{self._config_key}:{request.candidates}", query=request.query,
            filter_key=request.filter_key, k=request.k,
            encoder_id=self.encoder.encoder_id if self.encoder is not None else None,
        )

    def _miss(self, snapshot: IndexSnapshot, request: SearchRequest, lookup: Lookup,
              timer: StageTimer) -> SearchResult:
        assert self._cache is not None
        if lookup.embedding is not None:
            result, _ = run_pipeline(snapshot, request, ReadyVector(lookup.embedding), timer,
                                     self.config, "hit", self._features)
            fresh_vector = None
        else:
            pending = self._embedding(request.query, None, snapshot)
            result, fresh_vector = run_pipeline(snapshot, request, pending, timer, self.config,
                                                features=self._features)
        result.cache = CacheInfo(result="miss", embedding=result.cache.embedding)
        self._cache.store(lookup, result, fresh_vector)
        return result

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:
            raise InvalidQueryError(
                "this index was built from precomputed vectors and has no query encoder; pass "
                "query_vector=... or load the retriever with encoder=..."
            )
        if self._hint_threads and self._in_flight.count > 1:
            return self.encoder.encode(texts, single_thread=True)  # type: ignore[call-arg]
        return self.encoder.encode(texts)

    def _embedding(self, text: str, query_vector: np.ndarray | None, snapshot: IndexSnapshot
                   ) -> PendingVector:
        """The query vector: given, or encoded (with parallel stages: started now, so it
        computes while filter + BM25 run). Only searches running alongside others go through
        the batcher: a lone one has nothing to be batched with, so it skips the hand-off."""
        if query_vector is not None:
            return ReadyVector(snapshot.vectors.check_query(query_vector))
        in_flight = self._in_flight.count
        overlap = self._overlap is not None and self._overlap.now(in_flight)
        if self._batcher is not None and in_flight > 1:
            future = self._batcher.submit(text)
            return FutureVector(future) if overlap else ReadyVector(*future.result())
        if overlap:
            return FutureVector(self._pool.submit(timed_encode, self._encode, text))
        return ReadyVector(*timed_encode(self._encode, text))


def _served_from_cache(cached: SearchResult, request: SearchRequest, timer: StageTimer
                       ) -> SearchResult:
    """A cached result with this request's query text, timings and cache status.

    Decoded results are shared between hits of the same entry; the hit list is copied so a
    caller reordering it cannot affect others (treat the Hit objects themselves as read-only).
    """
    return cached.model_copy(update={
        "query": request.query, "hits": list(cached.hits), "timings": timer.finish(),
        "cache": CacheInfo(result="hit", embedding="skipped"),
    })
