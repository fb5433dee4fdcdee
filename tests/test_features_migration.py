"""Feature reads while a Redis Cluster reshard moves a view's slot, key by key.

Every key of a view shares its hash tag, so a reshard moves the view whole, but one key (or
batch of keys) at a time: until the move ends, some keys are on the old node and some on the
new. The read script declares only the live pointer, so it cannot run on either node then;
these reads are answered key by key, where each key is.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.cluster import key_slot
from redis_servers import RedisClusterProcesses, RedisProcess
from test_cache_review import finish_migrating, own_cluster, start_migrating  # noqa: F401
from test_features_support import RELAXED_MS, quality_rows, quality_view, version_rows, version_view

from retrieval.features import FeatureBatch, FeatureStatus, RedisStore, materialize

IDS = [f"doc-{i}" for i in range(5)]


def cluster_store(cluster: RedisClusterProcesses, **options: float) -> RedisStore:
    return RedisStore(cluster.url, cluster=True, namespace="moving", grace_seconds=0,
                      socket_timeout_ms=RELAXED_MS, connect_timeout_ms=RELAXED_MS, **options)


def move_keys(source: RedisProcess, target: RedisProcess, keys: Sequence[str]) -> None:
    """Move ``keys`` of a migrating slot, as ``redis-cli --cluster reshard`` does in batches."""
    with source.client() as client:
        client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)


def features(batch: FeatureBatch) -> tuple[bool, list[int], list[float] | None]:
    values = batch.values.get("quality")  # none when the view's schema is unknown
    return batch.available, batch.status.tolist(), None if values is None else values.tolist()


EXPECTED = (True, [FeatureStatus.PRESENT] * 5, [0.0, 1.0, 2.0, 3.0, 4.0])


def test_a_view_read_while_some_of_its_keys_moved_is_answered_and_counts_no_failure(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    """Once some entity keys had moved but the pointer had not, the script failed ("non local
    key"): the view served defaults, and each read counted against the breaker, which opened
    and served defaults for every view of the store until the reshard ended."""
    store = cluster_store(own_cluster, breaker_failures=2, breaker_cooldown_seconds=60)
    try:
        materialize(quality_view(), lambda: quality_rows(6), store, progress=False)
        materialize(version_view(), lambda: version_rows(2, 7), store, progress=False)
        keys = store.keys("quality")
        assert features(store.read("quality", IDS)) == EXPECTED  # a steady slot: the script
        source, target = start_migrating(own_cluster, key_slot(keys.live.encode()))
        snapshot = store.live_snapshot_id("quality")
        assert snapshot is not None
        move_keys(source, target, [keys.entity_prefix(snapshot) + i for i in ("doc-1", "doc-3")])

        for _ in range(3):
            batch = store.read("quality", [*IDS, "never-written"])
            assert batch.available and batch.snapshot_id == snapshot
            assert batch.status.tolist() == [*EXPECTED[1], FeatureStatus.MISSING]
            assert batch.values["quality"].tolist() == [*EXPECTED[2], -1.0]
        assert store.read("versions", ["doc-1"]).values["version"].tolist() == [7]
        stats = store.stats()
        assert (stats["errors"], stats["breaker_state"], stats["redirected_reads"]) == \
            (0, "closed", 3), stats
    finally:
        store.close()


def test_a_view_read_whose_pointer_moved_ahead_of_its_entities_is_complete(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    """Once the pointer had moved and some entities had not, the script ran on the new node
    (redis-py follows the ASK) and read them as missing from an available store: ranked on
    defaults, and cached as if the features were there. With the schema not moved yet either,
    a reader that had not read it before logged the view's data as gone and served defaults."""
    store = cluster_store(own_cluster)
    fresh = cluster_store(own_cluster)  # a process started during the reshard
    try:
        materialize(quality_view(), lambda: quality_rows(6), store, progress=False)
        keys = store.keys("quality")
        snapshot = store.live_snapshot_id("quality")
        assert snapshot is not None
        assert features(store.read("quality", IDS)) == EXPECTED
        slot = key_slot(keys.live.encode())
        source, target = start_migrating(own_cluster, slot)

        move_keys(source, target, [keys.live])
        assert features(fresh.read("quality", IDS)) == EXPECTED
        assert features(store.read("quality", IDS)) == EXPECTED
        move_keys(source, target, [keys.meta(snapshot)])
        assert features(store.read("quality", IDS)) == EXPECTED
        assert fresh.online_snapshot_id("quality") == snapshot  # what result-cache keys use
        assert fresh.online_view("quality") == quality_view()

        finish_migrating(own_cluster, slot, source, target)
        assert features(store.read("quality", IDS)) == EXPECTED  # MOVED, read key by key
        redirected = store.stats()["redirected_reads"]
        assert features(store.read("quality", IDS)) == EXPECTED
        assert store.stats()["redirected_reads"] == redirected  # the script again
        for reader in (store, fresh):
            assert (reader.stats()["errors"], reader.stats()["breaker_state"]) == (0, "closed")
    finally:
        store.close()
        fresh.close()


def test_a_snapshot_expired_while_its_slot_moves_is_lost_not_all_missing(
        own_cluster: RedisClusterProcesses) -> None:  # noqa: F811
    """The key-by-key read skipped the snapshot's schema once this process knew it: a snapshot
    whose keys had expired read as a healthy view of entities all missing, where the script
    reads it as lost (unavailable, so results on its defaults are not cached)."""
    store = cluster_store(own_cluster)
    try:
        materialize(quality_view(), lambda: quality_rows(6), store, progress=False)
        keys = store.keys("quality")
        assert features(store.read("quality", IDS)) == EXPECTED  # the schema is now known
        snapshot = store.live_snapshot_id("quality")
        assert snapshot is not None
        source, _ = start_migrating(own_cluster, key_slot(keys.live.encode()))
        with source.client() as client:  # expired, all but the pointer
            client.delete(keys.meta(snapshot), *(keys.entity_prefix(snapshot) + f"doc-{i}"
                                                  for i in range(6)))
        batch = store.read("quality", IDS)
        assert not batch.available
        assert store.stats()["redirected_reads"] == 1
    finally:
        store.close()
