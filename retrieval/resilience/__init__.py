"""Fail-open access to remote dependencies: circuit breaker, burst logging, the Redis link."""

from retrieval.resilience.breaker import BurstLogger, CircuitBreaker
from retrieval.resilience.redis_link import (
    NO_TLS,
    LinkSettings,
    RedisLink,
    TlsFiles,
    credential_problem,
    link_options,
    make_client,
    redact_url,
    validate_redis_url,
)

__all__ = [
    "LinkSettings",
    "NO_TLS",
    "BurstLogger",
    "CircuitBreaker",
    "RedisLink",
    "TlsFiles",
    "credential_problem",
    "link_options",
    "make_client",
    "redact_url",
    "validate_redis_url",
]
