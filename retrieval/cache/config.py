"""Cache configuration (pydantic) and the factory that turns it into a ``Cache``."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from retrieval.cache.base import MAX_TTL_SECONDS, Cache, check_ttl
from retrieval.cache.keys import validate_namespace
from retrieval.cache.memory import MemoryCache
from retrieval.cache.redis_backend import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_SOCKET_TIMEOUT_MS,
    DEFAULT_WRITE_QUEUE_SIZE,
    RedisCache,
    refuse_decoded_replies,
)
from retrieval.resilience import link_options, redact_url, validate_redis_url
from retrieval.strict import StrictConfig

_TTL_LIMIT = f"seconds, at most {MAX_TTL_SECONDS:.0e}: the longest expiry Redis accepts"


class CacheConfig(StrictConfig):
    """Which cache to use and how; ``backend="none"`` disables caching."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["memory", "redis", "none"] = "memory"
    # repr=False: a URL may carry a password and configs end up in logs.
    url: str | None = Field(default=None, repr=False)
    cluster: bool = False
    namespace: str = "retrieval"
    max_entries: int = Field(default=100_000, ge=1)
    max_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1024, description="the memory cache's bytes, the "
        "JSON bytes of the results this process keeps decoded (any backend; decoded, they "
        "take about twice their JSON), and the bytes of writes waiting for Redis (redis; "
        "past them a write is dropped and counted)")
    result_ttl_seconds: float = Field(default=300.0, gt=0, allow_inf_nan=False,
                                      description=_TTL_LIMIT)
    embedding_ttl_seconds: float = Field(default=7 * 24 * 3600.0, gt=0, allow_inf_nan=False,
                                         description=_TTL_LIMIT)
    socket_timeout_ms: float = Field(
        default=DEFAULT_SOCKET_TIMEOUT_MS, gt=0, le=60_000, allow_inf_nan=False
    )
    connect_timeout_ms: float = Field(
        default=DEFAULT_CONNECT_TIMEOUT_MS, gt=0, le=60_000, allow_inf_nan=False
    )
    breaker_failures: int = Field(default=5, ge=1)
    breaker_cooldown_seconds: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    write_queue_size: int = Field(default=DEFAULT_WRITE_QUEUE_SIZE, ge=1)
    tls_ca_file: str | None = Field(None, description="rediss://: PEM of the CA that signed "
                                    "the server (None = system trust store)")
    tls_cert_file: str | None = Field(None, description="rediss://: client certificate (mTLS)")
    tls_key_file: str | None = Field(None, description="rediss://: client key (mTLS)")
    decoded_results: int = Field(
        default=4096, ge=0, description="results kept decoded in this process (LRU) so a hit "
        "skips JSON parsing; ~30 KB each with 10 hits of full text. Keep it above the number "
        "of hot entries: a working set cycling through more than this parses on every hit")

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        return validate_namespace(value)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        return None if value is None else refuse_decoded_replies(validate_redis_url(value))

    @field_validator("result_ttl_seconds", "embedding_ttl_seconds")
    @classmethod
    def _check_ttl(cls, value: float, info: ValidationInfo) -> float:
        return check_ttl(value, str(info.field_name))

    @model_validator(mode="after")
    def _check_backend(self) -> CacheConfig:
        if self.backend == "redis" and not self.url:
            raise ValueError("url is required when backend='redis' (e.g. redis://host:6379/0)")
        if self.url and self.cluster:
            validate_redis_url(self.url, cluster=True)  # Cluster only has db 0
        return self

    def describe(self) -> str:
        """One-line, password-free summary for logs."""
        where = f" url={redact_url(self.url)} cluster={self.cluster}" if self.url else ""
        return f"cache backend={self.backend}{where} namespace={self.namespace}"


def make_cache(config: CacheConfig) -> Cache | None:
    """The cache ``config`` describes, or None when caching is disabled."""
    if config.backend == "none":
        return None
    if config.backend == "memory":
        return MemoryCache(max_entries=config.max_entries, max_bytes=config.max_bytes)
    assert config.url is not None  # guaranteed by CacheConfig validation
    return RedisCache(config.url, write_queue_size=config.write_queue_size,
                      write_queue_bytes=config.max_bytes, **link_options(config))
