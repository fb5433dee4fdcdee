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

from indexes.encoders import DEFAULT_MODEL, Encoder, SentenceTransformerEncoder
from indexes.errors import EncoderMismatchError, InvalidQueryError, LimitExceededError
from retrieval.config import RetrieverConfig
from retrieval.filters import evaluate
from retrieval.fusion import linear_fusion, rrf_fusion, top_k_order
from retrieval.models import CacheInfo, Hit, SearchResult
from retrieval.request import SearchRequest, validate
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
    if encoder.encoder_id != expected.encoder_id or encoder.dim != expected.dim:
        raise EncoderMismatchError(
            f"query encoder {encoder.encoder_id!r} does not match the index's "
            f"{expected.encoder_id!r}; load the retriever with the encoder the index was built "
            "with, or rebuild the index with this one"
        )


class Retriever:
    """Two-stage hybrid search over one published build. Thread-safe."""

    def __init__(
        self, snapshot: IndexSnapshot, config: RetrieverConfig, encoder: Encoder | None
    ) -> None:
        if encoder is not None:
            check_encoder(encoder, snapshot)
        self.config = config
        self.encoder = encoder
        self._snapshot = snapshot
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="retrieval")

    @classmethod
    def load(
        cls,
        path: str | Path,
        config: RetrieverConfig | dict[str, Any] | None = None,
        *,
        encoder: Encoder | None = None,
    ) -> Retriever:
        """Load the live build under ``path`` (or a build directory), verified and mmapped."""
        if not isinstance(config, RetrieverConfig):
            config = RetrieverConfig(**(config or {}))
        snapshot = IndexSnapshot.load(path, verify=config.verify_checksums, mmap=config.mmap)
        if encoder is None:
            encoder = default_encoder(snapshot, config)
        retriever = cls(snapshot, config, encoder)
        retriever._warm_up()
        return retriever

    @property
    def build_id(self) -> str:
        return self._snapshot.build_id

    @property
    def snapshot(self) -> IndexSnapshot:
        return self._snapshot

    def close(self) -> None:
        self._pool.shutdown(wait=False)

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
        request = validate(query, filters, k, candidates, self.config, snapshot.metadata.kinds)
        timer.lap("validate")
        vector = self._start_embedding(request.query, query_vector, snapshot)
        return self._run(snapshot, request, vector, timer)

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
        requests = [validate(q, filters, k, candidates, self.config, snapshot.metadata.kinds)
                    for q in queries]
        per_query_ms = 0.0
        if query_vectors is None:
            started = time.perf_counter()
            query_vectors = self._encode([r.query for r in requests])
            per_query_ms = (time.perf_counter() - started) * 1e3 / max(len(requests), 1)
        embed_ms = per_query_ms if per_query_ms else None
        return [
            self._run(snapshot, request, _Ready(vector, embed_ms), StageTimer())
            for request, vector in zip(requests, query_vectors, strict=True)
        ]

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
        self, snapshot: IndexSnapshot, request: SearchRequest, vector: _Pending, timer: StageTimer
    ) -> SearchResult:
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
        return SearchResult(
            query=request.query, hits=hits, timings=timer.finish(), build_id=snapshot.build_id,
            candidates=int(rows.size), allowed=allowed,
            cache=CacheInfo(embedding="provided" if embed_ms is None else "miss"),
        )

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
