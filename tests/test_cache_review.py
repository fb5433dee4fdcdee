"""Redis cache failure modes found in review: a Cluster slot migration, a slow server's writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster, key_slot
from redis_servers import RedisClusterProcesses, RedisProcess, start_cluster

from retrieval.cache import CacheConfig, RedisCache, embedding_key, make_cache, result_key

MB = 1 << 20


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
