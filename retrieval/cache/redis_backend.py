"""Fail-open Redis cache (standalone or Cluster) for the request path.

Design rules, each because a cache must never make a request slower or fail it:

* Reads are one ``MGET`` with short socket timeouts and no client-side retries; any error or
  timeout is a miss, counted, and fed to a circuit breaker that skips Redis while it is down.
  A read for a search with a deadline (``get_many_within``) shorter than a call's budget is
  waited for no longer than what is left of it: with nothing left it is not sent
  (``skipped_reads``); past it the search goes on with misses (``late_reads``) while the
  read ends in a reader thread, still reporting to the breaker (a socket timeout is a
  failure, a late answer is not).
  On a Cluster, keys of several slots, or of a slot that moved or is moving (the ``MGET`` is
  redirected or answered TRYAGAIN), are read with one ``GET`` each in one pipeline, and those
  redirected elsewhere in one more pipeline per node they point to (``redirect_pipelines``).
* Writes go to a queue bounded in batches and bytes, drained by one background thread (one
  pipeline of ``SET key value PX ttl`` per drained batch, so each TTL is set atomically with
  its value). A full queue drops the write and counts it; the caller never waits on the
  network.
* Client creation, URL checks, the breaker and burst logging live in
  ``retrieval.resilience.redis_link`` (shared with the Redis feature store).

Default timeouts (shared with the feature store, ``resilience.redis_link``): 50 ms read
(``socket_timeout_ms``) and 100 ms connect (``connect_timeout_ms``). A loopback ``MGET``
answers in ~0.1 ms, but on a busy host (6 busy processes on 2 cores) its p99.9 reached ~20 ms
and 5 ms timed out 1-2% of calls, enough to open the breaker on a healthy Redis
(``python -m benchmarks.redis_timeouts``). For Cluster, a timeout also triggers one inline
topology refresh inside redis-py (``CLUSTER SLOTS`` against each known node, each bounded by
the same timeouts), so an unresponsive 3-node cluster costs about 4 read timeouts per call
until the breaker opens; see ``tests/test_cache.py`` for the measured bound.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeoutError
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from redis.cluster import RedisCluster, key_slot
from redis.exceptions import ClusterDownError, ClusterError

from retrieval.cache.base import (
    COUNTER_NAMES,
    BackgroundWriter,
    Cache,
    CacheConfigError,
    CacheCounters,
    WriteBatch,
    clean_items,
    ttl_to_ms,
)
from retrieval.cache.cluster_reads import is_unreachable, read_each_key
from retrieval.errors import ConfigError
from retrieval.resilience import (
    NO_TLS,
    LinkSettings,
    RedisLink,
    TlsFiles,
    redact_url,
    validate_redis_url,
)
from retrieval.resilience.redis_link import DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_SOCKET_TIMEOUT_MS

__all__ = ["DEFAULT_CONNECT_TIMEOUT_MS", "DEFAULT_SOCKET_TIMEOUT_MS", "RedisCache", "redact_url",
           "refuse_decoded_replies", "validate_redis_url"]

logger = logging.getLogger(__name__)

DEFAULT_WRITE_QUEUE_SIZE = 1024
DEFAULT_WRITE_QUEUE_BYTES = 256 * 1024 * 1024  # CacheConfig.max_bytes' default
MAX_PIPELINE_COMMANDS = 512  # coalesce queued batches, but keep each pipeline reply small
# Reads a deadline waits for at once. Each holds its thread at most a call's budget (a slow
# Redis); past this many, reads queue, and one whose search gave up is cancelled unsent, so
# a struggling Redis is not sent more reads than this.
MAX_READS_WAITED_FOR = 32


def refuse_decoded_replies(url: str, error: type[ConfigError] = CacheConfigError,
                           key: str = "url") -> str:
    """``url``, or ``error`` naming ``key`` when its query sets ``decode_responses``.

    Refused rather than overridden: redis-py lets a URL's options win over the client's and
    hands this one on as the text it reads, so even ``decode_responses=false`` decodes. Replies
    then come back as str, and every read of bytes (a cached value, a feature record) misses
    or fails. Dropping the option unasked would hide it from whoever wrote it for other code
    sharing the URL; an error at load says at once what to change."""
    if "decode_responses" in dict(parse_qsl(urlsplit(url).query)):
        raise error(f"{key} {redact_url(url)!r} sets decode_responses: remove it from the "
                    "URL (values are bytes, and decoded replies made every read a miss)", key)
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
        write_queue_bytes: int = DEFAULT_WRITE_QUEUE_BYTES,
        log_quiet_seconds: float = 60.0,
        tls: TlsFiles = NO_TLS,
    ) -> None:
        if write_queue_size < 1:
            raise CacheConfigError(f"write_queue_size must be >= 1, got {write_queue_size}",
                                   "write_queue_size")
        if write_queue_bytes < 1:
            raise CacheConfigError(f"write_queue_bytes must be >= 1, got {write_queue_bytes}",
                                   "write_queue_bytes")
        self.link = RedisLink(url, LinkSettings(
            cluster, socket_timeout_ms, connect_timeout_ms, breaker_failures,
            breaker_cooldown_seconds, log_quiet_seconds, tls), logger=logger, what="redis cache",
            fallback="serving cache misses", section="cache", error=CacheConfigError)
        refuse_decoded_replies(url)
        self.url = self.link.url
        self.cluster = cluster
        self._counters = CacheCounters((*COUNTER_NAMES, "cross_slot_reads", "redirected_reads",
                                        "redirect_pipelines", "skipped_reads", "late_reads"))
        self._closing = False  # set first by close(): new reads miss, new writes are dropped
        self._readers = ThreadPoolExecutor(MAX_READS_WAITED_FOR, "redis-cache-reader")
        self._writer = BackgroundWriter(
            self._write_batches, write_queue_size, MAX_PIPELINE_COMMANDS, "redis-cache-writer",
            write_queue_bytes,
        )

    def probe(self) -> bool:
        """PING at load; see ``RedisLink.probe`` (raises ``ConfigError`` for bad credentials)."""
        return self.link.probe()

    # -- reads ----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return self.get_many_within(keys, None)

    def get_many_within(self, keys: Sequence[str], timeout: float | None
                        ) -> list[bytes | None]:
        try:
            wanted = list(keys)
        except Exception:
            self._counters.add(errors=1)
            return []
        if not wanted:
            return []
        if self._closing:
            self._counters.add(misses=len(wanted))
            return [None] * len(wanted)
        if timeout is not None and timeout <= 0:  # no time left: not worth a round trip
            self._counters.add(misses=len(wanted), skipped_reads=1)
            return [None] * len(wanted)
        # A deadline leaving a call its whole budget is no tighter than the link's own bound:
        # read here, without the reader thread's hand-off (50-60 us on a busy host).
        if timeout is None or timeout >= self.link.call_budget_s:
            values = self._read(wanted)
        else:
            values = self._read_within(wanted, timeout)
        if values is None:
            self._counters.add(misses=len(wanted))
            return [None] * len(wanted)
        return self._count_reads(values, len(wanted))

    def _read(self, keys: list[str]) -> list[Any] | None:
        """The values, or None when the read failed (counted) or the breaker is open."""
        return self.link.call(lambda client: self._fetch(client, keys), self._failed_read)

    def _failed_read(self, failure: str) -> None:
        self._counters.add(errors=int(failure == "error"))

    def _read_within(self, keys: list[str], timeout: float) -> list[Any] | None:
        """``_read`` in a reader thread, waited for at most ``timeout`` seconds. The socket
        timeout bounds one read, not what a search has left: a slow Redis held a search
        with 5 ms left for the whole 50 ms. A read not answered by then is a miss here and
        ends unwatched, its outcome still the breaker's to count."""
        try:
            future = self._readers.submit(self._read, keys)
        except RuntimeError:  # closed meanwhile: no reader threads any more
            return None
        try:
            return future.result(timeout)
        except WaitTimeoutError:
            future.cancel()  # still queued behind other reads: never sent
            self._counters.add(late_reads=1)
            return None
        except CancelledError:  # queued when close() cancelled the reads not yet sent
            return None

    def _fetch(self, client: Any, keys: list[str]) -> list[Any]:
        if not isinstance(client, RedisCluster):
            return list(client.mget(keys))
        if len(keys) > 1 and _slots(keys) > 1:
            # Keys from keys.py share a slot; foreign key sets (a batch) take a GET each.
            self._counters.add(cross_slot_reads=1)
            return self._get_each(client, keys)
        # One attempt: while a slot migrates, its keys may be on two nodes, and an MGET of
        # both is answered TRYAGAIN until the move ends. redis-py's 16 attempts, sleeping
        # 50 ms each from the 9th, held such a read ~400 ms and then failed it; one attempt
        # sleeps once (50 ms), then the GETs follow each key's redirect (ASK, MOVED).
        client.RedisClusterRequestTTL = 1
        try:
            return list(client.mget(keys))
        except ClusterError as exc:  # "TTL exhausted": redirected or asked to try again
            if isinstance(exc, ClusterDownError):  # a cluster down is the breaker's to count
                raise
            self._counters.add(redirected_reads=1)
            return self._get_each(client, keys)

    def _get_each(self, client: RedisCluster, keys: list[str]) -> list[Any]:
        """One GET per key: a single-key command is never answered TRYAGAIN
        (``read_each_key``).

        A key's own error (WRONGTYPE: another program's list or hash under it) is its miss, as
        ``MGET`` reads it."""
        reads = read_each_key(client, [("GET", key) for key in keys])
        self._counters.add(redirect_pipelines=reads.redirect_pipelines)
        return reads.replies

    def _count_reads(self, values: list[Any], expected: int) -> list[bytes | None]:
        if len(values) != expected:  # a protocol surprise is an error, not a wrong answer
            self._counters.add(misses=expected, errors=1)
            return [None] * expected
        out = [value if isinstance(value, bytes) else None for value in values]
        found = [value for value in out if value is not None]
        self._counters.add(
            hits=len(found),
            misses=expected - len(found),
            errors=sum(map(_is_error, values)),
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
        results = self.link.call(lambda client: self._pipeline_set(client, batches),
                                 lambda failure: self._failed_write(failure, total))
        if results is None:
            return
        sizes = [len(value) for batch in batches for value in batch.items.values()]
        failed = [size for size, res in zip(sizes, results, strict=True) if _is_error(res)]
        self._counters.add(
            bytes_written=sum(sizes) - sum(failed),
            errors=len(failed),
            dropped_writes=len(failed),
        )

    def _failed_write(self, failure: str, total: int) -> None:
        self._counters.add(errors=int(failure == "error"), dropped_writes=total)

    @staticmethod
    def _pipeline_set(client: Any, batches: list[WriteBatch]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for batch in batches:
            for key, value in batch.items.items():
                pipe.set(key, value, px=batch.ttl_ms)  # TTL set atomically with the value
        results = list(pipe.execute(raise_on_error=False))
        # A cluster pipeline hands back a node's timeout or lost connection as a result
        # instead of raising it: that is an outage, and the breaker must count it (a write
        # that "succeeded" against a stopped cluster closed the breaker mid-outage).
        unreachable = next((r for r in results if is_unreachable(r)), None)
        if unreachable is not None:
            raise unreachable
        return results

    def flush_writes(self, timeout: float = 5.0) -> bool:
        return self._writer.flush(timeout)

    # -- lifecycle --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "cluster": self.cluster,
            **self._counters.snapshot(),
            **self.link.stats(),
            "queued_writes": self._writer.pending(),
            "queued_bytes": self._writer.pending_bytes(),
        }

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (bounded by ``timeout``), then close connections."""
        if self._closing:
            return
        self._closing = True
        self._writer.close(timeout)
        self._readers.shutdown(wait=False, cancel_futures=True)
        self.link.close()


def _slots(keys: list[str]) -> int:
    return len({key_slot(key.encode("utf-8", "surrogatepass")) for key in keys})


def _is_error(result: Any) -> bool:
    return isinstance(result, Exception)
