"""Fail-open Redis cache (standalone or Cluster) for the request path.

Design rules, each because a cache must never make a request slower or fail it:

* Reads are one ``MGET`` with short socket timeouts and no client-side retries; any error or
  timeout is a miss, counted, and fed to a circuit breaker that skips Redis while it is down.
* Writes go to a bounded queue drained by one background thread (one pipeline of
  ``SET key value PX ttl`` per drained batch, so each TTL is set atomically with its value).
  A full queue drops the write and counts it; the caller never waits on the network.
* The client is created lazily on first use: construction succeeds while Redis is down
  (``RedisCluster`` would otherwise contact the cluster in its constructor).
* Errors are logged once per outage (``BurstLogger``), never per request.

The URL carries host, port, ``user:password@``, db number (``/0``; Cluster has only db 0) and
TLS (``rediss://``). Query-string options in the URL (e.g. ``?ssl_cert_reqs=none``) are passed
to redis-py and take precedence over the settings below.

Default timeouts: 5 ms read (``socket_timeout_ms``) and 10 ms connect (``connect_timeout_ms``).
A loopback or same-zone ``MGET`` answers in well under 1 ms; 5 ms leaves headroom for server
hiccups while bounding the worst case. For Cluster, a timeout also triggers one inline
topology refresh inside redis-py (``CLUSTER SLOTS`` against each known node, each bounded by
the same timeouts), so an unresponsive 3-node cluster costs about 4 read timeouts per call
until the breaker opens; see ``tests/test_cache.py`` for the measured bound.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster, key_slot
from redis.retry import Retry

from retrieval.cache.base import (
    COUNTER_NAMES,
    BackgroundWriter,
    Cache,
    CacheConfigError,
    CacheCounters,
    CacheError,
    WriteBatch,
    clean_items,
    ttl_to_ms,
)
from retrieval.cache.breaker import BurstLogger, CircuitBreaker

logger = logging.getLogger(__name__)

DEFAULT_SOCKET_TIMEOUT_MS = 5.0
DEFAULT_CONNECT_TIMEOUT_MS = 10.0
DEFAULT_WRITE_QUEUE_SIZE = 1024
MAX_PIPELINE_COMMANDS = 512  # coalesce queued batches, but keep each pipeline reply small
URL_SCHEMES = ("redis", "rediss")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and errors)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparseable url>"


def validate_redis_url(url: str, cluster: bool = False) -> str:
    """Return ``url`` or raise ``CacheConfigError`` naming the ``url`` setting."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
    except (ValueError, TypeError, AttributeError) as exc:
        raise CacheConfigError(f"url {shown!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in URL_SCHEMES:
        raise CacheConfigError(
            f"url {shown!r} must use redis:// or rediss:// (TLS), got scheme {parts.scheme!r}"
        )
    if not parts.hostname:
        raise CacheConfigError(f"url {shown!r} has no host; use redis://host:6379/0")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise CacheConfigError(f"url {shown!r}: the path must be a db number, got {db!r}")
    if cluster and db and int(db) != 0:
        raise CacheConfigError(f"url {shown!r}: Redis Cluster only has db 0, got db {db}")
    return url


class RedisCache(Cache):
    """Fail-open Redis cache; see the module docstring for the failure model."""

    def __init__(
        self,
        url: str,
        *,
        cluster: bool = False,
        socket_timeout_ms: float = DEFAULT_SOCKET_TIMEOUT_MS,
        connect_timeout_ms: float = DEFAULT_CONNECT_TIMEOUT_MS,
        breaker_failures: int = 5,
        breaker_cooldown_seconds: float = 1.0,
        write_queue_size: int = DEFAULT_WRITE_QUEUE_SIZE,
        log_quiet_seconds: float = 60.0,
    ) -> None:
        self.url = validate_redis_url(url, cluster)
        self.cluster = cluster
        if not (socket_timeout_ms > 0 and connect_timeout_ms > 0):
            raise CacheConfigError("socket_timeout_ms and connect_timeout_ms must be > 0")
        if write_queue_size < 1:
            raise CacheConfigError(f"write_queue_size must be >= 1, got {write_queue_size}")
        self._socket_timeout = socket_timeout_ms / 1000.0
        self._connect_timeout = connect_timeout_ms / 1000.0
        self._breaker = CircuitBreaker(breaker_failures, breaker_cooldown_seconds)
        self._log = BurstLogger(logger, f"redis cache {redact_url(url)}", log_quiet_seconds)
        self._counters = CacheCounters((*COUNTER_NAMES, "cross_slot_reads"))
        self._client: redis.Redis | RedisCluster | None = None
        self._connect_lock = threading.Lock()
        self._closing = False  # set first by close(): new reads miss, new writes are dropped
        self._closed = False  # set once queued writes are done: no client may be created
        self._writer = BackgroundWriter(
            self._write_batches, write_queue_size, MAX_PIPELINE_COMMANDS, "redis-cache-writer"
        )

    # -- client ---------------------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        return {
            "socket_timeout": self._socket_timeout,
            "socket_connect_timeout": self._connect_timeout,
            # No retries inside redis-py: a retry doubles the worst case; the breaker and
            # the next request are our retry.
            "retry": Retry(NoBackoff(), 0),
            # RESP2 and no CLIENT SETINFO: a (re)connect is a bare TCP/TLS handshake plus
            # AUTH/SELECT when configured, instead of 3+ extra round trips (HELLO, SETINFO).
            "protocol": 2,
            "driver_info": None,
            "decode_responses": False,
        }

    def _make_client(self) -> redis.Redis | RedisCluster:
        if self.cluster:
            # require_full_coverage=False: serve the slots we can reach during a partial outage.
            return RedisCluster.from_url(
                self.url, require_full_coverage=False, **self._client_options()
            )
        return redis.Redis.from_url(self.url, **self._client_options())

    def _ensure_client(self) -> redis.Redis | RedisCluster:
        client = self._client
        if client is not None:
            return client
        with self._connect_lock:
            if self._closed:
                raise CacheError("redis cache is closed")
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _on_success(self) -> None:
        self._breaker.record_success()
        self._log.success()

    def _on_failure(self, exc: BaseException) -> None:
        self._breaker.record_failure()
        self._log.error(exc)

    # -- reads ----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        try:
            wanted = list(keys)
        except Exception:
            self._counters.add(errors=1)
            return []
        if not wanted:
            return []
        misses: list[bytes | None] = [None] * len(wanted)
        if self._closing or not self._breaker.allow():
            self._counters.add(misses=len(wanted))
            return misses
        try:
            values = self._fetch(wanted)
        except Exception as exc:
            self._on_failure(exc)
            self._counters.add(misses=len(wanted), errors=1)
            return misses
        except BaseException:
            self._breaker.record_failure()  # never leave a half-open probe dangling
            raise
        self._on_success()
        return self._count_reads(values, len(wanted))

    def _fetch(self, keys: list[str]) -> list[Any]:
        client = self._ensure_client()
        if isinstance(client, RedisCluster) and len(keys) > 1 and _slots(keys) > 1:
            # Keys from keys.py share a slot; foreign key sets still work, just slower.
            self._counters.add(cross_slot_reads=1)
            return list(client.mget_nonatomic(keys))
        return list(client.mget(keys))

    def _count_reads(self, values: list[Any], expected: int) -> list[bytes | None]:
        if len(values) != expected:  # a protocol surprise is an error, not a wrong answer
            self._counters.add(misses=expected, errors=1)
            return [None] * expected
        out = [value if isinstance(value, bytes) else None for value in values]
        found = [value for value in out if value is not None]
        self._counters.add(
            hits=len(found),
            misses=expected - len(found),
            bytes_read=sum(len(value) for value in found),
        )
        return out

    # -- writes ---------------------------------------------------------------------------

    def set_many(self, items: Mapping[str, bytes], ttl_seconds: float) -> None:
        try:
            self._submit(items, ttl_seconds)
        except Exception:  # the contract: a cache write never raises
            self._counters.add(errors=1)

    def _submit(self, items: Mapping[str, bytes], ttl_seconds: float) -> None:
        clean = clean_items(items)
        ttl_ms = ttl_to_ms(ttl_seconds)
        dropped = len(items) - len(clean)
        if clean and ttl_ms is not None and not self._closing:
            if not self._writer.submit(WriteBatch(clean, ttl_ms)):
                dropped += len(clean)  # queue full: shed load rather than block the caller
        else:
            dropped += len(clean)
        if dropped:
            self._counters.add(dropped_writes=dropped)

    def _write_batches(self, batches: list[WriteBatch]) -> None:
        """Writer thread: one pipeline for the drained batches (errors counted, never raised)."""
        total = sum(len(batch.items) for batch in batches)
        if not self._breaker.allow():
            self._counters.add(dropped_writes=total)
            return
        try:
            results = self._pipeline_set(batches)
        except Exception as exc:
            self._on_failure(exc)
            self._counters.add(errors=1, dropped_writes=total)
            return
        self._on_success()
        sizes = [len(value) for batch in batches for value in batch.items.values()]
        failed = [size for size, res in zip(sizes, results, strict=True) if _is_error(res)]
        self._counters.add(
            bytes_written=sum(sizes) - sum(failed),
            errors=len(failed),
            dropped_writes=len(failed),
        )

    def _pipeline_set(self, batches: list[WriteBatch]) -> list[Any]:
        client = self._ensure_client()
        pipe = client.pipeline(transaction=False)
        for batch in batches:
            for key, value in batch.items.items():
                pipe.set(key, value, px=batch.ttl_ms)  # TTL set atomically with the value
        return list(pipe.execute(raise_on_error=False))

    def flush_writes(self, timeout: float = 5.0) -> bool:
        return self._writer.flush(timeout)

    # -- lifecycle --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "cluster": self.cluster,
            **self._counters.snapshot(),
            **self._breaker.stats(),
            "queued_writes": self._writer.pending(),
        }

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (bounded by ``timeout``), then close connections."""
        if self._closing:
            return
        self._closing = True
        self._writer.close(timeout)
        with self._connect_lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # closing a dead connection is not worth an error
                logger.debug("closing redis client failed: %s", exc)


def _slots(keys: list[str]) -> int:
    return len({key_slot(key.encode("utf-8", "surrogatepass")) for key in keys})


def _is_error(result: Any) -> bool:
    return isinstance(result, Exception)
