"""Query-embedding and result caches: in-process LRU or fail-open Redis (standalone/Cluster)."""

from retrieval.cache.base import Cache, CacheConfigError, CacheError
from retrieval.cache.codec import (
    CacheValueError,
    decode_embedding,
    decode_json,
    encode_embedding,
    encode_json,
)
from retrieval.cache.config import CacheConfig, make_cache
from retrieval.cache.keys import (
    canonicalize_filters,
    embedding_key,
    normalize_query,
    query_tag,
    result_key,
)
from retrieval.cache.memory import MemoryCache
from retrieval.cache.redis_backend import RedisCache
from retrieval.cache.singleflight import SingleFlight
from retrieval.resilience import BurstLogger, CircuitBreaker

__all__ = [
    "BurstLogger",
    "Cache",
    "CacheConfig",
    "CacheConfigError",
    "CacheError",
    "CacheValueError",
    "CircuitBreaker",
    "MemoryCache",
    "RedisCache",
    "SingleFlight",
    "canonicalize_filters",
    "decode_embedding",
    "decode_json",
    "embedding_key",
    "encode_embedding",
    "encode_json",
    "make_cache",
    "normalize_query",
    "query_tag",
    "result_key",
]
