"""The Retriever: orchestration of the request path (it owns no algorithm).

filter mask -> BM25 top-C inside the mask   (caller thread)
query embedding                              (worker thread, concurrently)
-> exact re-rank of the C candidates -> fusion -> top-k -> hydrate
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from indexes.encoders import (
    DEFAULT_MODEL,
    Encoder,
    SentenceTransformerEncoder,
    compatible_query_encoder,
)
from indexes.errors import EncoderMismatchError, InvalidQueryError, LimitExceededError
from retrieval.cache import Cache, make_cache
from retrieval.config import RetrieverConfig
from retrieval.filters import evaluate
from retrieval.fusion import linear_fusion, rrf_fusion, top_k_order
from retrieval.models import CacheInfo, Hit, SearchResult
from retrieval.request import FilterMemo, SearchRequest, validate
from retrieval.request_cache import Lookup, RequestCache
from retrieval.snapshot import IndexSnapshot
from retrieval.timing import StageTimer


def default_encoder(snapshot: IndexSnapshot, config: RetrieverConfig) -> Encoder | None:
    """The encoder the build names; None for builds from precomputed (external) vectors."""
    info = snapshot.manifest.encoder
    if not info.encoder_id.endswith(":torch:fp32:" + str(info.dim)):
        return None
    if config.encoder_model_path is None and info.model != DEFAULT_MODEL:
        return None
    return SentenceTransformerEncoder(config.encoder_model_path)


def check_encoder(encoder: Encoder, snapshot: IndexSnapshot) -> None:
    expected = snapshot.manifest.encoder
    compatible = compatible_query_encoder(encoder.encoder_id, expected.encoder_id)
    if not compatible or encoder.dim != expected.dim:
        raise EncoderMismatchError(
            f"query encoder {encoder.encoder_id!r} does not match the index's "
            f"{expected.encoder_id!r}; load the retriever with the encoder the index was built "
            "with (or a declared compatible backend of the same model), or rebuild the index"
        )


class Retriever:
    """Two-stage hybrid search over one published build. Thread-safe."""

    def __init__(
        self, snapshot: IndexSnapshot, config: RetrieverConfig, encoder: Encoder | None,
        cache: Cache | None = None,
    ) -> None:
        if encoder is not None:
            check_encoder(encoder, snapshot)
        self.config = config
        self.encoder = encoder
        self._snapshot = snapshot
        self._filters = FilterMemo(snapshot.metadata.kinds, config.limits)
        self._config_key = config.fingerprint()
        self._cache = RequestCache(cache, config.cache) if cache is not None else None
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="retrieval")

    @classmethod
    def load(
        cls,
        path: str | Path,
        config: RetrieverConfig | dict[str, Any] | None = None,
        *,
        encoder: Encoder | None = None,
        cache: Cache | None = None,
    ) -> Retriever:
        """Load the live build under ``path`` (or a build directory), verified and mmapped.

        The cache is built from ``config.cache`` (in-process by default) unless one is given.
        """
        if not isinstance(config, RetrieverConfig):
            config = RetrieverConfig(**(config or {}))
        snapshot = IndexSnapshot.load(path, verify=config.verify_checksums, mmap=config.mmap)
        if encoder is None:
            encoder = default_encoder(snapshot, config)
        retriever = cls(snapshot, config, encoder, cache or make_cache(config.cache))
        retriever._warm_up()
        return retriever

    @property
    def build_id(self) -> str:
        return self._snapshot.build_id

    @property
    def snapshot(self) -> IndexSnapshot:
        return self._snapshot

    def close(self) -> None:
        """Stop worker threads and the cache's writer (queued cache writes are flushed)."""
        self._pool.shutdown(wait=False)
        if self._cache is not None:
            self._cache.cache.close()

    def stats(self) -> dict[str, Any]:
        """Counters for operators: cache hits/misses/errors per kind, breaker state, build."""
        return {
            "build_id": self.build_id,
            "cache": self._cache.stats() if self._cache is not None else None,
        }

    def flush_cache_writes(self, timeout: float = 5.0) -> bool:
        """Wait until queued cache writes are done (tests and orderly shutdown)."""
        return self._cache.cache.flush_writes(timeout) if self._cache is not None else True

    def _warm_up(self) -> None:
        """Compile the kernel and run the model once, so the first request is not cold."""
        self._snapshot.bm25.top_candidates(["warmup"], 1)
        if self.encoder is not None:
            self.encoder.encode(["warm up"])

    # -- public API -------------------------------------------------------------------------

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
        snapshot = self._snapshot
        timer = StageTimer()
        request = validate(query, filters, k, candidates, self.config, self._filters)
        timer.lap("validate")
        if self._cache is None or query_vector is not None:
            # A caller-supplied vector is not part of any key, so its results are not cached.
            vector = self._start_embedding(request.query, query_vector, snapshot)
            return self._run(snapshot, request, vector, timer)[0]
        cache = self._cache
        lookup = cache.lookup_many([self._keys(snapshot, request)], snapshot.build_id,
                                   snapshot.vectors.dim)[0]
        timer.lap("cache")
        if lookup.result is not None:
            return _served_from_cache(lookup.result, request, timer)
        return cache.once(lookup.result_key, lambda: self._miss(snapshot, request, lookup, timer))

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
        snapshot = self._snapshot
        requests = [validate(q, filters, k, candidates, self.config, self._filters)
                    for q in queries]
        if query_vectors is not None or self._cache is None:
            vectors = query_vectors if query_vectors is not None else self._encode(
                [r.query for r in requests])
            embed = "provided" if query_vectors is not None else "miss"
            return [self._run(snapshot, r, _Ready(v, None), StageTimer(), embed)[0]
                    for r, v in zip(requests, vectors, strict=True)]
        return self._cached_batch(snapshot, requests)

    def _cached_batch(self, snapshot: IndexSnapshot, requests: list[SearchRequest]
                      ) -> list[SearchResult]:
        """One cache round trip for the batch, one encoder call for the embedding misses."""
        assert self._cache is not None
        timer = StageTimer()
        lookups = self._cache.lookup_many([self._keys(snapshot, r) for r in requests],
                                          snapshot.build_id, snapshot.vectors.dim)
        timer.lap("cache")
        missing = [i for i, look in enumerate(lookups)
                   if look.result is None and look.embedding is None]
        fresh = dict(zip(missing, self._encode([requests[i].query for i in missing]), strict=True)
                     ) if missing else {}
        results = []
        for i, (request, lookup) in enumerate(zip(requests, lookups, strict=True)):
            if lookup.result is not None:
                results.append(_served_from_cache(lookup.result, request, StageTimer()))
                continue
            vector = fresh.get(i, lookup.embedding)
            assert vector is not None
            embed = "miss" if i in fresh else "hit"
            result, _ = self._run(snapshot, request, _Ready(vector, None), StageTimer(), embed)
            result = _with_cache_status(result, "miss", embed)
            self._cache.store(lookup, result, fresh.get(i))
            results.append(result)
        return results

    def _keys(self, snapshot: IndexSnapshot, request: SearchRequest) -> tuple[str, str | None]:
        assert self._cache is not None
        return self._cache.keys(
            build_id=snapshot.build_id, snapshot_id="",
            config_key=f"{self._config_key}:{request.candidates}", query=request.query,
            filter_key=request.filter_key, k=request.k,
            encoder_id=self.encoder.encoder_id if self.encoder is not None else None,
        )

    def _miss(self, snapshot: IndexSnapshot, request: SearchRequest, lookup: Lookup,
              timer: StageTimer) -> SearchResult:
        assert self._cache is not None
        if lookup.embedding is not None:
            result, _ = self._run(snapshot, request, _Ready(lookup.embedding, None), timer, "hit")
            fresh_vector = None
        else:
            pending = self._start_embedding(request.query, None, snapshot)
            result, fresh_vector = self._run(snapshot, request, pending, timer)
        result = _with_cache_status(result, "miss", result.cache.embedding)
        self._cache.store(lookup, result, fresh_vector)
        return result

    # -- stages -------------------------------------------------------------------------------

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:
            raise InvalidQueryError(
                "this index was built from precomputed vectors and has no query encoder; pass "
                "query_vector=... or load the retriever with encoder=..."
            )
        return self.encoder.encode(texts)

    def _start_embedding(
        self, text: str, query_vector: np.ndarray | None, snapshot: IndexSnapshot
    ) -> _Pending:
        if query_vector is not None:
            return _Ready(snapshot.vectors.check_query(query_vector))
        if self.config.parallel_stages:
            return _Timed(self._pool.submit(_timed_call, self._encode, [text]))
        return _Ready(*_timed_call(self._encode, [text]))

    def _run(
        self, snapshot: IndexSnapshot, request: SearchRequest, vector: _Pending, timer: StageTimer,
        embed_status: str | None = None,
    ) -> tuple[SearchResult, np.ndarray]:
        """The uncached pipeline; returns the result and the query vector it used."""
        mask, allowed = self._filter(snapshot, request)
        timer.lap("filter")
        rows, bm25 = self._bm25(snapshot, request, mask)
        timer.lap("bm25")
        query_vector, embed_ms = vector.get()
        timer.lap("embed_wait")  # time the caller waited for the encoder after BM25 finished
        if embed_ms is not None:
            timer.record("embed", embed_ms)
        cosine = snapshot.vectors.scores(query_vector, rows)
        timer.lap("rerank")
        fused = self._fuse(bm25, cosine)
        order = top_k_order(fused, request.k)
        timer.lap("fuse")
        hits = [self._hit(snapshot, int(rows[i]), fused[i], bm25[i], cosine[i]) for i in order]
        timer.lap("hydrate")
        embed = embed_status or ("provided" if embed_ms is None else "miss")
        result = SearchResult(
            query=request.query, hits=hits, timings=timer.finish(), build_id=snapshot.build_id,
            candidates=int(rows.size), allowed=allowed,
            cache=CacheInfo(embedding=embed),  # type: ignore[arg-type]
        )
        return result, query_vector

    def _filter(self, snapshot: IndexSnapshot, request: SearchRequest
                ) -> tuple[np.ndarray | None, int]:
        if request.filter is None:
            return None, snapshot.manifest.n_docs
        mask = evaluate(request.filter, snapshot.metadata)
        return mask, int(np.count_nonzero(mask))

    def _bm25(self, snapshot: IndexSnapshot, request: SearchRequest, mask: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray]:
        tokens = snapshot.analyzer(request.query)
        limit = self.config.limits.max_query_tokens
        if len(tokens) > limit:
            raise LimitExceededError(f"query has {len(tokens)} terms, more than the limit {limit}; "
                                     "shorten it or raise limits.max_query_tokens")
        return snapshot.bm25.top_candidates(tokens, request.candidates, mask)

    def _fuse(self, bm25: np.ndarray, cosine: np.ndarray) -> np.ndarray:
        if self.config.fusion == "rrf":
            return rrf_fusion(bm25, cosine, self.config.rrf_k)
        return linear_fusion(bm25, cosine, self.config.vector_weight)

    @staticmethod
    def _hit(snapshot: IndexSnapshot, row: int, score: float, bm25: float, cosine: float) -> Hit:
        doc = snapshot.docs.get(row)
        return Hit(doc_id=doc.id, score=float(score), bm25_score=float(bm25),
                   vector_score=float(cosine), title=doc.title, text=doc.text,
                   metadata=doc.metadata)


def _served_from_cache(cached: SearchResult, request: SearchRequest, timer: StageTimer
                       ) -> SearchResult:
    """A cached result with this request's query text, timings and cache status."""
    return cached.model_copy(update={
        "query": request.query, "timings": timer.finish(),
        "cache": CacheInfo(result="hit", embedding="skipped"),
    })


def _with_cache_status(result: SearchResult, status: str, embedding: str) -> SearchResult:
    result.cache = CacheInfo(result=status, embedding=embedding)  # type: ignore[arg-type]
    return result


def _timed_call(encode: Any, texts: list[str]) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    vectors = encode(texts)
    return vectors[0], (time.perf_counter() - started) * 1e3


class _Pending:
    """A query vector that may still be computing; ``get`` returns (vector, embed ms or None)."""

    def get(self) -> tuple[np.ndarray, float | None]:  # pragma: no cover - interface
        raise NotImplementedError


class _Ready(_Pending):
    def __init__(self, vector: np.ndarray, embed_ms: float | None = None) -> None:
        self._value = (vector, embed_ms)

    def get(self) -> tuple[np.ndarray, float | None]:
        return self._value


class _Timed(_Pending):
    def __init__(self, future: Future[tuple[np.ndarray, float]]) -> None:
        self._future = future

    def get(self) -> tuple[np.ndarray, float | None]:
        vector, ms = self._future.result()
        return vector, ms
