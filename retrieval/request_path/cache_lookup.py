"""Caching for the request path: one lookup of result + embedding, writes off the critical path.

Keys hold everything their value depends on (build id, feature snapshot id, config fingerprint,
candidates, normalized query, canonical filters, k; encoder id for embeddings), so publishing a
build or changing the config invalidates by construction. A value that fails to decode or
validate is a miss, never an exception. A lookup waits no longer than what is left of its
search's deadline (``Cache.get_many_within``): past it, misses, counted by the backend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from indexes.lru import LRU
from retrieval.cache import (
    Cache,
    CacheConfig,
    SingleFlight,
    decode_embedding,
    embedding_key,
    encode_embedding,
    result_key,
)
from retrieval.cache.base import CacheCounters
from retrieval.models import Hit, SearchResult
from retrieval.request_path.deadline import NO_DEADLINE, Deadline
from retrieval.result_json import share


@dataclass(frozen=True)
class Lookup:
    """What one request found in the cache."""

    result_key: str
    embedding_key: str | None
    result: SearchResult | None
    embedding: np.ndarray | None


class RequestCache:
    """Result and embedding caching over one ``Cache`` backend, with per-kind counters."""

    def __init__(self, cache: Cache, config: CacheConfig) -> None:
        self.cache = cache
        self.config = config
        self.flights = SingleFlight()
        self.counters = CacheCounters(
            ("result_hits", "result_misses", "embedding_hits", "embedding_misses", "corrupt",
             "results_parsed"))
        # Decoded results by key, reused only when the cached bytes are identical: parsing a
        # 10-hit JSON result is most of the cost of a hit, and equal bytes parse equally.
        # Bounded by their JSON's bytes too, as the cache is: by count alone, 4,096 results
        # of k=1000 held gigabytes, most of them results the cache had already dropped.
        self._decoded: LRU[str, tuple[bytes, SearchResult]] = LRU(
            config.decoded_results, config.max_bytes, lambda key, memo: len(memo[0]))
        self._decoded_lock = threading.Lock()

    def keys(
        self, *, build_id: str, snapshot_id: str, config_key: str, query: str, filter_key: str,
        k: int, encoder_id: str | None,
    ) -> tuple[str, str | None]:
        ns = self.config.namespace
        rkey = result_key(ns, build_id, snapshot_id, config_key, query, filter_key, k)
        ekey = embedding_key(ns, encoder_id, query) if encoder_id else None
        return rkey, ekey

    def lookup_many(self, keys: Sequence[tuple[str, str | None]], build_id: str, dim: int,
                    deadline: Deadline = NO_DEADLINE) -> list[Lookup]:
        """Fetch every request's result and embedding in one ``get_many`` call, waited for
        no longer than what is left of ``deadline``."""
        flat = [k for pair in keys for k in pair if k is not None]
        found = self.cache.get_many_within(flat, deadline.remaining())
        values = dict(zip(flat, found, strict=True))
        return [self._decode(rkey, ekey, values, build_id, dim) for rkey, ekey in keys]

    def _decode(self, rkey: str, ekey: str | None, values: dict[str, bytes | None],
                build_id: str, dim: int) -> Lookup:
        result = self._decode_result(rkey, values.get(rkey), build_id)
        embedding = None
        if ekey is not None and result is None:
            blob = values.get(ekey)
            embedding = decode_embedding(blob, dim) if blob is not None else None
            if blob is not None and embedding is None:
                self.counters.add(corrupt=1)
            self.counters.add(embedding_hits=int(embedding is not None),
                              embedding_misses=int(embedding is None))
        self.counters.add(result_hits=int(result is not None), result_misses=int(result is None))
        return Lookup(rkey, ekey, result, embedding)

    def _decode_result(self, key: str, blob: bytes | None, build_id: str) -> SearchResult | None:
        if blob is None:
            return None
        with self._decoded_lock:
            memo = self._decoded.get(key)
        if memo is not None and memo[0] == blob:
            return memo[1]
        result = self._parse_result(blob, build_id)
        if result is not None:
            self._remember(key, blob, result)
        return result

    def _remember(self, key: str, blob: bytes, result: SearchResult) -> None:
        share(result)  # its copies served as hits are written as JSON from shared pieces
        with self._decoded_lock:
            self._decoded.put(key, (blob, result))

    def _parse_result(self, blob: bytes, build_id: str) -> SearchResult | None:
        self.counters.add(results_parsed=1)
        try:
            result = SearchResult.model_validate_json(blob)
        except (ValidationError, ValueError):
            self.counters.add(corrupt=1)
            return None
        if result.build_id != build_id or not written_whole(result):
            self.counters.add(corrupt=1)  # build ids are in the keys: belt and braces
            return None
        return result

    def store(self, lookup: Lookup, result: SearchResult, vector: np.ndarray | None) -> None:
        """Queue the result (and a freshly computed embedding) for writing; never blocks long.

        The result is also remembered as decoded, so this process's first hit on it skips JSON
        parsing (hits are immutable; its lists are copied, ``own_containers``).
        """
        blob = result.model_dump_json().encode()
        self.cache.set_many({lookup.result_key: blob}, self.config.result_ttl_seconds)
        self._remember(lookup.result_key, blob, own_containers(result))
        if vector is not None and lookup.embedding_key is not None and lookup.embedding is None:
            self.cache.set_many({lookup.embedding_key: encode_embedding(vector)},
                                self.config.embedding_ttl_seconds)

    def once(self, key: str, compute: Callable[[], SearchResult], timeout: float | None
             ) -> SearchResult:
        """Concurrent identical misses in this process compute once; a search waits for
        another's at most ``timeout`` seconds (what its deadline leaves), then computes."""
        return self.flights.do(key, compute, timeout)

    def stats(self) -> dict[str, object]:
        with self._decoded_lock:
            decoded = {"results": len(self._decoded), "json_bytes": self._decoded.weight}
        return {**self.counters.snapshot(), "backend": self.cache.stats(),
                "single_flight": self.flights.stats(), "decoded": decoded}


_RESULT_FIELDS = frozenset(SearchResult.model_fields)
_HIT_FIELDS = frozenset(Hit.model_fields)


def written_whole(result: SearchResult) -> bool:
    """Whether every field of today's result and hits came in the cached value (a result is
    always written whole). One an older release wrote lacks the fields added since, which
    would be served at their defaults as if computed: hits without a ``relevance``, so a
    search with ``min_score`` answered no hits where an uncached one answered five."""
    return result.model_fields_set >= _RESULT_FIELDS and all(
        hit.model_fields_set >= _HIT_FIELDS for hit in result.hits)


def own_containers(result: SearchResult, **update: object) -> SearchResult:
    """A copy of ``result`` (with ``update``) holding its own lists and dicts, so what one
    caller does to its result (appending a warning of its own, reordering its hits) reaches
    no other search served from the same cached result. The hits themselves are shared:
    treat them as read-only."""
    return result.model_copy(update={
        "hits": list(result.hits), "warnings": list(result.warnings),
        "degraded": list(result.degraded), "corrections": dict(result.corrections), **update})
