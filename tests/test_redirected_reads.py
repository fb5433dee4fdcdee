"""Key-by-key reads of keys a Cluster reshard moved, partly or wholly (``read_each_key``).

redis-py's cluster pipeline follows each redirected command alone: two or three round trips
per moved key (1,000 entities of a view, half moved, took ~170 ms instead of ~5). These reads
follow every redirect to one node in one pipeline, so the round trips stay bounded by the
nodes involved, whatever the number of moved keys.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster, key_slot
from redis_servers import RedisClusterProcesses
from test_cache_review import finish_migrating, own_cluster, start_migrating  # noqa: F401
from test_features_migration import cluster_store, move_keys
from test_features_support import quality_rows, quality_view

from retrieval.cache import RedisCache, result_key
from retrieval.features import FeatureStatus, materialize

ENTITIES = 40
IDS = [f"doc-{i}" for i in range(ENTITIES)]


def reads_processed(node: redis.Redis) -> int:
    """The socket reads a node has served its clients: one per round trip it answered (a
    small pipeline arrives in one read), whatever the number of commands in it."""
    return int(node.info("stats")["total_reads_processed"])


def half_moved_view(cluster: RedisClusterProcesses, store: Any, moved: list[str]
                    ) -> tuple[Any, Any, str]:
    """Materialize the quality view, then start moving its slot and move the entity keys of
    ``moved``: (the slot's source node, its target node, the live snapshot id)."""
    materialize(quality_view(), lambda: quality_rows(ENTITIES), store, progress=False)
    keys = store.keys("quality")
    snapshot = store.live_snapshot_id("quality")
    assert snapshot is not None
    steady = store.read("quality", IDS).values["quality"].tolist()  # before the move
    assert steady == [float(i) for i in range(ENTITIES)]
    source, target = start_migrating(cluster, key_slot(keys.live.encode()))
    move_keys(source, target, [keys.entity_prefix(snapshot) + i for i in moved])
    return source, target, snapshot


def test_a_view_read_with_half_its_keys_moved_takes_one_pipeline_for_them(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    store = cluster_store(own_cluster)
    try:
        expected = [float(i) for i in range(ENTITIES)]  # as read before the move
        moved = IDS[::2]
        _, target, snapshot = half_moved_view(own_cluster, store, moved)

        probe = target.client()  # one connection: its own reads are one per call
        for read in range(1, 3):
            before = reads_processed(probe)
            batch = store.read("quality", [*IDS, "never-written"])
            assert batch.available and batch.snapshot_id == snapshot
            assert batch.status.tolist() == [FeatureStatus.PRESENT] * ENTITIES + \
                [FeatureStatus.MISSING]
            assert batch.values["quality"].tolist() == [*expected, -1.0]
            assert batch.values["clicks"].tolist() == [10 * i for i in range(ENTITIES)] + [0]
            stats = store.stats()
            # Every moved key is on one node: one pipeline follows all their redirects.
            assert (stats["redirected_reads"], stats["redirect_pipelines"]) == (read, read)
            assert (stats["errors"], stats["breaker_state"]) == (0, "closed"), stats
        # Not one round trip (ASKING, then the read) per moved key, as redis-py's own.
        assert reads_processed(probe) - before < len(moved), "a round trip per moved key"
        probe.close()
    finally:
        store.close()


def test_a_view_read_whose_moved_keys_node_is_down_fails_and_is_counted(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    """The pipeline to the node the keys moved to cannot be sent: the read fails whole (not
    half its entities missing from a healthy view) and the breaker counts it."""
    store = cluster_store(own_cluster)
    try:
        _, target, _ = half_moved_view(own_cluster, store, IDS[::2])
        target.stop()

        batch = store.read("quality", IDS)
        assert not batch.available
        assert batch.status.tolist() == [FeatureStatus.MISSING] * ENTITIES
        assert store.stats()["errors"] == 1
    finally:
        store.close()


def test_cache_keys_of_a_moved_slot_are_read_in_one_pipeline_then_directly(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    """Keys of several slots (a GET each), one slot moved since the client read the slot
    table: every MOVED key is read in one pipeline, and the client learns the slot's new
    node, so the next read is not redirected. A key of another type there is its own miss."""
    cache = RedisCache(own_cluster.url, cluster=True, socket_timeout_ms=1000,
                       connect_timeout_ms=1000)
    try:
        moving = [result_key("t", "build", "", "cfg", "heat transfer", "", k)
                  for k in range(1, 21)]
        slot = key_slot(moving[0].encode())
        assert {key_slot(key.encode()) for key in moving} == {slot}
        elsewhere = [result_key("t", "build", "", "cfg", f"query {i}", "", 10)
                     for i in range(20)]
        values = {key: key.encode()[-12:] for key in [*moving, *elsewhere]}
        cache.set_many(values, 60)
        assert cache.flush_writes(5)
        foreign = moving.pop()  # another program's list, under a key of the moving slot
        with RedisCluster.from_url(own_cluster.url) as setup:
            setup.delete(foreign)
            setup.rpush(foreign, b"x")
        keys = [*moving, foreign, *elsewhere]
        expected = [*(values[key] for key in moving), None, *(values[k] for k in elsewhere)]
        assert cache.get_many(keys) == expected
        source, target = start_migrating(own_cluster, slot)
        finish_migrating(own_cluster, slot, source, target)

        assert cache.get_many(keys) == expected
        stats = cache.stats()
        assert (stats["redirect_pipelines"], stats["errors"]) == (1, 2), stats
        assert cache.get_many(keys) == expected
        stats = cache.stats()
        assert (stats["redirect_pipelines"], stats["errors"]) == (1, 3), stats
        assert (stats["cross_slot_reads"], stats["breaker_state"]) == (3, "closed"), stats
    finally:
        cache.close()
