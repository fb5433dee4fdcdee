"""Redis cache failure modes found in review: a Cluster slot migration, a slow server's writes
and reads, settings Redis cannot honour (decoded replies, TTLs past its longest expiry)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from polling import wait_until
from pydantic import ValidationError
from redis.cluster import RedisCluster, key_slot
from redis_servers import RedisClusterProcesses, RedisProcess, start_cluster
from small_index import QUERIES as SMALL_QUERIES
from small_index import index_fixture, query_encoder_fixture  # noqa: F401
from test_features_support import quality_rows, quality_view

from indexes.encoders import Encoder
from retrieval import Retriever
from retrieval.cache import (
    CacheConfig,
    CacheConfigError,
    MemoryCache,
    RedisCache,
    embedding_key,
    encode_embedding,
    make_cache,
    result_key,
)
from retrieval.config import RetrieverConfig
from retrieval.errors import ConfigError
from retrieval.features import FeatureConfigError, FeatureStoreConfig, RedisStore, materialize
from retrieval.request_path.cache_lookup import RequestCache
from retrieval.request_path.deadline import Deadline

MB = 1 << 20
LONGEST_TTL_SECONDS = 9e15  # what the refusals name (``MAX_TTL_SECONDS``)


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterProcesses]:
    """A private cluster: these tests move slots, which the session cluster must not see."""
    cluster = start_cluster()
    yield cluster
    cluster.cleanup()


def node_ids(cluster: RedisClusterProcesses) -> dict[int, str]:
    ids = {}
    for node in cluster.nodes:
        with node.client() as client:
            ids[node.port] = client.execute_command("CLUSTER", "MYID").decode()
    return ids


def start_migrating(cluster: RedisClusterProcesses, slot: int) -> tuple[RedisProcess, RedisProcess]:
    """Mark ``slot`` as moving from its node to another, as ``redis-cli --cluster reshard``
    does before it moves the keys; returns (source, target)."""
    ids = node_ids(cluster)
    source = owner(cluster, slot)
    target = next(n for n in cluster.nodes if n is not source)
    with target.client() as client:
        client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
    with source.client() as client:
        client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
    return source, target


def owner(cluster: RedisClusterProcesses, slot: int) -> RedisProcess:
    with cluster.nodes[0].client() as client:
        ranges = client.execute_command("CLUSTER", "SLOTS")
    port = next(int(master[1]) for start, end, master, *_ in ranges if start <= slot <= end)
    return next(n for n in cluster.nodes if n.port == port)


def finish_migrating(cluster: RedisClusterProcesses, slot: int, source: RedisProcess,
                     target: RedisProcess) -> None:
    """Move the slot's keys to ``target`` and give it the slot on every node."""
    with source.client() as client:
        keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if keys:
            client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                   "KEYS", *keys)
    target_id = node_ids(cluster)[target.port]
    for node in cluster.nodes:
        with node.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def test_reads_of_a_migrating_slot_are_answered(own_cluster: RedisClusterProcesses) -> None:
    """While a slot migrates, a key in it may be on either node: an MGET of a request's two
    keys (a new k for a query whose embedding is cached: the result key absent, the
    embedding key present) is answered TRYAGAIN, which redis-py retried 16 times, sleeping
    50 ms from the 9th on: ~400 ms, then an error. Every such read waited that long and
    missed, and each counted towards opening the breaker for every search."""
    cache = RedisCache(own_cluster.url, cluster=True, socket_timeout_ms=500,
                       connect_timeout_ms=500)
    try:
        ekey = embedding_key("t", "enc", "heat transfer")
        rkey = result_key("t", "build", "", "cfg", "heat transfer", "", 10)
        elsewhere = [result_key("t", "build", "", "cfg", f"query {i}", "", 10)
                     for i in range(20)]
        cache.set_many({ekey: b"E", **dict.fromkeys(elsewhere, b"O")}, 60)
        assert cache.flush_writes(5)
        foreign = result_key("t", "build", "", "cfg", "another program's list", "", 10)
        with RedisCluster.from_url(own_cluster.url) as setup:
            setup.rpush(foreign, b"x")
        slot = key_slot(ekey.encode())
        assert key_slot(rkey.encode()) == slot
        source, target = start_migrating(own_cluster, slot)

        assert cache.get_many([rkey, ekey]) == [None, b"E"]
        assert cache.get_many([rkey, ekey, *elsewhere]) == [None, b"E", *[b"O"] * 20]
        # A key holding another type is a miss (and an error), not a failed read.
        assert cache.get_many([foreign, ekey, *elsewhere]) == [None, b"E", *[b"O"] * 20]
        assert cache.stats()["errors"] == 1
        cache.set_many({rkey: b"R"}, 60)  # a new key of a migrating slot goes to the target
        assert cache.flush_writes(5)
        assert cache.get_many([rkey, ekey]) == [b"R", b"E"]

        finish_migrating(own_cluster, slot, source, target)
        assert cache.get_many([rkey, ekey]) == [b"R", b"E"]  # MOVED: the client follows
        assert cache.get_many([ekey, *elsewhere]) == [b"E", *[b"O"] * 20]
        stats = cache.stats()
        assert stats["errors"] == 1 and stats["breaker_state"] == "closed", stats
    finally:
        cache.close()


def test_writes_queued_for_a_slow_redis_stay_within_the_caches_bytes() -> None:
    """The write queue was bounded by its number of batches alone (1,024 by default): a
    Redis that stopped answering let it hold 1,024 results, ~1.5 GB at k=1000, far past
    ``max_bytes``, the bytes the cache may hold in this process."""
    server = RedisProcess()
    server.start()
    config = CacheConfig(backend="redis", url=server.url, max_bytes=4 * MB,
                         socket_timeout_ms=30_000, connect_timeout_ms=30_000)
    cache = make_cache(config)
    assert isinstance(cache, RedisCache)
    try:
        cache.set_many({"first": b"x"}, 60)
        assert cache.flush_writes(5)  # connected
        server.pause()  # the writer's next pipeline waits for an answer that does not come
        value = b"v" * MB
        for i in range(20):
            cache.set_many({f"big{i}": value}, 60)
        stats = cache.stats()
        assert stats["dropped_writes"] >= 20 - 4 - 1, stats  # one may be in the writer's hands
        assert stats["queued_bytes"] <= 4 * MB
        server.resume()
        assert cache.flush_writes(30)
        assert cache.stats()["queued_bytes"] == 0
    finally:
        server.resume()
        cache.close()
        server.cleanup()


def test_a_cluster_down_opens_the_breaker(own_cluster: RedisClusterProcesses) -> None:
    """With a master gone, every node answers CLUSTERDOWN, and redis-py waits 0.25 s before
    raising it. The read's fallback to one GET per key took that error for a migrating slot's
    and answered misses, so the breaker never counted a failure: every search paid 0.25 s for
    as long as the cluster was down, single-slot and batch reads alike."""
    import time

    cache = RedisCache(own_cluster.url, cluster=True, socket_timeout_ms=500,
                       connect_timeout_ms=500, breaker_failures=3,
                       breaker_cooldown_seconds=60)
    try:
        keys = [result_key("t", "build", "", "cfg", f"query {i}", "", 10) for i in range(30)]
        cache.set_many(dict.fromkeys(keys, b"R"), 60)
        assert cache.flush_writes(5)
        gone = owner(own_cluster, key_slot(keys[0].encode()))
        alive = next(n for n in own_cluster.nodes if n is not gone)
        held = [k for k in keys if owner(own_cluster, key_slot(k.encode())) is alive]
        gone.stop()
        deadline = time.monotonic() + 30
        with alive.client() as client:
            while b"cluster_state:fail" not in client.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the cluster never noticed its lost master"
                time.sleep(0.2)
        reads = [held[:1], keys]  # a key a live node holds, and a batch across slots
        for read in (reads * 2)[:3]:
            assert cache.get_many(read) == [None] * len(read)
        assert cache.stats()["breaker_state"] == "open"
    finally:
        cache.close()


@pytest.fixture
def own_server() -> Iterator[RedisProcess]:
    """A private server: these tests pause it, which the session server must not see."""
    server = RedisProcess()
    server.start()
    yield server
    server.cleanup()


def test_a_cache_read_waits_no_longer_than_the_deadline_leaves(own_server: RedisProcess) -> None:
    """A read was bounded by the socket timeout alone: a slow Redis held a search with 20 ms
    of its deadline left for the whole timeout (50 ms by default, 5 s here). It is now a miss
    once the deadline is spent, counted as late; with nothing left it is not sent at all. The
    late read ends on its own, and an answer after the deadline is no failure of Redis."""
    cache = RedisCache(own_server.url, socket_timeout_ms=5000, connect_timeout_ms=5000)
    requests = RequestCache(cache, CacheConfig(backend="redis", url=own_server.url))
    keys = requests.keys(build_id="build", snapshot_id="", config_key="cfg",
                         query="heat transfer", filter_key="", k=10, encoder_id="enc")
    ekey = keys[1]
    assert ekey is not None
    try:
        vector = encode_embedding(np.ones(4, dtype=np.float32))
        cache.set_many({ekey: vector}, 60)
        assert cache.flush_writes(5)
        assert requests.lookup_many([keys], "build", 4, Deadline(5000))[0].embedding is not None
        own_server.pause()  # answers nothing until resumed

        looked_up = requests.lookup_many([keys], "build", 4, Deadline(20))[0]
        assert looked_up.result is None and looked_up.embedding is None
        stats = cache.stats()
        assert (stats["late_reads"], stats["errors"], stats["skipped_reads"]) == (1, 0, 0)
        assert requests.lookup_many([keys], "build", 4, Deadline(0))[0].embedding is None
        assert cache.stats()["skipped_reads"] == 1

        own_server.resume()
        assert wait_until(lambda: cache.get_many_within([ekey], 5) == [vector], 10)
        stats = cache.stats()
        assert stats["errors"] == 0 and stats["breaker_state"] == "closed", stats
    finally:
        own_server.resume()
        cache.close()


def test_reads_queued_when_the_cache_closes_are_misses(own_server: RedisProcess) -> None:
    """Reads past the reader pool's size queue behind the running ones; ``close()`` cancels
    those, and each raised ``CancelledError`` into its search, where a cache read never
    raises."""
    from concurrent.futures import ThreadPoolExecutor

    from retrieval.cache.redis_backend import MAX_READS_WAITED_FOR

    cache = RedisCache(own_server.url, socket_timeout_ms=5000, connect_timeout_ms=5000)
    assert cache.get_many(["warm"]) == [None]  # connected before the pause
    own_server.pause()
    try:
        with ThreadPoolExecutor(MAX_READS_WAITED_FOR + 8) as callers:
            reads = [callers.submit(cache.get_many_within, [f"k{i}"], 3.0)
                     for i in range(MAX_READS_WAITED_FOR + 8)]
            assert wait_until(lambda: cache._readers._work_queue.qsize() >= 8, 10)
            cache.close()
            assert [read.result(30) for read in reads] == [[None]] * len(reads)
    finally:
        own_server.resume()


def test_an_in_process_cache_is_read_whatever_the_deadline_leaves() -> None:
    """Reading memory costs microseconds: a hit is worth more than skipping it."""
    cache = MemoryCache()
    cache.set_many({"key": b"value"}, 60)
    assert cache.get_many_within(["key"], 0.0) == [b"value"]


@pytest.mark.parametrize("value", ["true", "false"])
def test_decoded_replies_are_refused_at_construction(redis_server: RedisProcess,
                                                     value: str) -> None:
    """``?decode_responses=`` in the URL wins over the client's own option and reaches
    redis-py as text, so even ``false`` decodes: every value came back as str, and every
    cache read was a miss (a feature read, an error)."""
    url = f"{redis_server.url}?decode_responses={value}"
    with redis.Redis.from_url(url, decode_responses=False) as client:
        client.set("decoded", b"bytes")
        assert client.get("decoded") == "bytes"  # why "false" is refused too
    with pytest.raises(CacheConfigError, match="remove it from the URL") as refused:
        RedisCache(url)
    assert refused.value.key == "url"
    with pytest.raises(ConfigError, match="decode_responses") as refused:
        RetrieverConfig(cache={"backend": "redis", "url": url})
    assert refused.value.key == "cache.url"
    with pytest.raises(FeatureConfigError, match="remove it from the URL"):
        RedisStore(url)


@pytest.mark.parametrize("key", ["result_ttl_seconds", "embedding_ttl_seconds"])
def test_a_ttl_past_what_redis_accepts_is_refused(redis_server: RedisProcess, key: str) -> None:
    """Redis refuses an expiry whose milliseconds, plus the current time, overflow a signed
    64-bit integer: with a longer TTL, every write of the cache was refused, and dropped."""
    with pytest.raises(ConfigError, match=r"at most 9e\+15 seconds") as refused:
        RetrieverConfig(cache={key: 1e16})
    assert refused.value.key == f"cache.{key}"
    assert getattr(CacheConfig(**{key: LONGEST_TTL_SECONDS}), key) == LONGEST_TTL_SECONDS

    cache = RedisCache(redis_server.url, socket_timeout_ms=500, connect_timeout_ms=500)
    try:
        cache.set_many({"longest": b"kept"}, LONGEST_TTL_SECONDS)  # the longest: Redis takes it
        cache.set_many({"too-long": b"dropped"}, 1e16)  # dropped unsent, not refused
        assert cache.flush_writes(5)
        assert cache.get_many(["longest", "too-long"]) == [b"kept", None]
        stats = cache.stats()
        assert (stats["dropped_writes"], stats["errors"]) == (1, 0), stats
    finally:
        cache.close()


def test_a_feature_ttl_past_what_redis_accepts_is_refused(redis_server: RedisProcess) -> None:
    """The feature store's ``PEXPIRE`` has the same bound: a longer ``key_ttl_seconds``
    failed every materialization."""
    with pytest.raises(FeatureConfigError, match=r"key_ttl_seconds must be at most 9e\+15"):
        RedisStore(redis_server.url, key_ttl_seconds=1e16)
    store = RedisStore(redis_server.url, namespace="longest-ttl", grace_seconds=0,
                       key_ttl_seconds=LONGEST_TTL_SECONDS, socket_timeout_ms=1000,
                       connect_timeout_ms=1000)
    try:
        materialize(quality_view(), lambda: quality_rows(3), store, progress=False)
        assert store.read("quality", ["doc-1"]).values["quality"].tolist() == [1.0]
    finally:
        store.close()


def test_a_search_spends_no_more_than_its_deadline_on_a_slow_cache(
        own_server: RedisProcess, index: Path, query_encoder: Encoder) -> None:
    """A search's cache lookup waited on a paused Redis for the whole socket timeout (5 s
    here) whatever its deadline left. It now goes on with a miss once its deadline is spent,
    the read counted as late and no failure of Redis; so does a batch's one lookup."""
    config = {"cache": {"backend": "redis", "url": own_server.url, "socket_timeout_ms": 5000,
                        "connect_timeout_ms": 5000}, "live_lag_seconds": None}
    with Retriever.load(index, config, encoder=query_encoder) as cached:
        assert cached.search(SMALL_QUERIES[0], k=5).cache.result == "miss"  # connected
        own_server.pause()
        try:
            result = cached.search(SMALL_QUERIES[1], k=5, deadline_ms=50)
            batch = cached.search_batch(SMALL_QUERIES[2:4], k=5, deadline_ms=50)
        finally:
            own_server.resume()
        assert [r.cache.result for r in (result, *batch)] == ["miss"] * 3
        assert result.hits and all(r.hits for r in batch)
        backend = cached.stats()["cache"]["backend"]
        assert (backend["late_reads"], backend["errors"]) == (2, 0), backend


@pytest.mark.parametrize(("setting", "key", "refusal"), [
    ({"location": "redis://127.0.0.1:6379/0?decode_responses=false"}, "location",
     "remove it from the URL"),
    ({"location": "redis://127.0.0.1:6379/0", "key_ttl_seconds": 1e16}, "key_ttl_seconds",
     r"at most 9e\+15 seconds"),
])
def test_feature_store_settings_redis_cannot_honour_are_refused_at_load(
        setting: dict[str, object], key: str, refusal: str) -> None:
    """``FeatureStoreConfig`` took both, as the cache's config no longer did: a config check
    passed, and only building the store refused them (once loaded, every read failed, or
    every materialization)."""
    with pytest.raises(ConfigError, match=refusal) as refused:
        RetrieverConfig(feature_store=setting)
    assert refused.value.key == f"feature_store.{key}"
    with pytest.raises(ValidationError, match=refusal):
        FeatureStoreConfig.model_validate(setting)
    longest = FeatureStoreConfig(location="redis://127.0.0.1:6379/0",
                                 key_ttl_seconds=LONGEST_TTL_SECONDS)
    assert longest.key_ttl_seconds == LONGEST_TTL_SECONDS
