"""Materializing a feature view while a Redis Cluster reshard moves its slot, key by key.

Until the move ends a view's keys are split between two nodes, and none of the writer's steps
can run there: the registration transaction, a chunk script and the flip each declare several
keys or write new ones (ASK or TRYAGAIN from either node; MOVED from the old one once the move
has ended). Each step is sent again where the slot is once it can run, for at most
``slot_move_wait_seconds``. Here the move begins before the job, between two chunks or just
before the publish, and ends when the writer announces that it is waiting (its log record is
the hook: no sleep decides the order).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from redis.cluster import key_slot
from redis_servers import RedisClusterProcesses
from test_cache_review import finish_migrating, own_cluster, start_migrating  # noqa: F401
from test_features_support import RELAXED_MS, quality_rows, quality_view

from retrieval.features import (
    FeatureConfigError,
    FeatureStoreConfig,
    FeatureStoreError,
    RedisStore,
    make_store,
    materialize,
)
from retrieval.features.offline.cli import main as features_main

IDS = [f"doc-{i}" for i in range(6)]
BATCH_ROWS = 3  # two chunks: the move can begin between them
MOMENTS = ("before the job", "between chunks", "before the publish")
WAIT_ANNOUNCED = "is moving between nodes"
UNUSED_URL = "redis://127.0.0.1:1"  # the settings checks connect nowhere


class Reshard:
    """The reshard of one view's slot: begun (half its keys moved) and ended on demand."""

    def __init__(self, cluster: RedisClusterProcesses, store: RedisStore, view: str) -> None:
        self.cluster = cluster
        self.slot = key_slot(store.keys(view).live.encode())
        self.nodes: Any = None

    def begin(self) -> None:
        """Mark the slot migrating and move every other key of it, as a reshard half done."""
        source, target = self.nodes = start_migrating(self.cluster, self.slot)
        with source.client() as client:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
            client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                   "KEYS", *keys[::2])

    def end(self) -> None:
        source, target = self.nodes
        finish_migrating(self.cluster, self.slot, source, target)


class EndMoveOnWait(logging.Handler):
    """Ends the reshard when the writer announces it waits for it (counts the announcements)."""

    def __init__(self, reshard: Reshard) -> None:
        super().__init__(logging.WARNING)
        self.reshard = reshard
        self.waits = 0

    def emit(self, record: logging.LogRecord) -> None:
        if WAIT_ANNOUNCED in record.getMessage():
            self.waits += 1
            self.reshard.end()


def rows_beginning_the_move(moment: str, reshard: Reshard) -> Callable[[], Iterator[dict]]:
    """Rows of the new snapshot (quality = i + 10); the generator begins the move when the job
    asks for the row after the first chunk (written by then), or for the row after the last."""
    def rows() -> Iterator[dict[str, Any]]:
        for position, row in enumerate(quality_rows(len(IDS), offset=10.0)):
            if moment == "between chunks" and position == BATCH_ROWS:
                reshard.begin()
            yield row
        if moment == "before the publish":
            reshard.begin()
    return rows


def cluster_store(cluster: RedisClusterProcesses, **options: Any) -> RedisStore:
    return RedisStore(cluster.url, cluster=True, namespace="resharded", grace_seconds=0,
                      socket_timeout_ms=RELAXED_MS, connect_timeout_ms=RELAXED_MS,
                      write_chunk=2, **options)  # two chunk scripts per pipeline


def quality(store: RedisStore) -> tuple[str | None, list[float]]:
    batch = store.read("quality", IDS)
    assert batch.available
    return batch.snapshot_id, batch.values["quality"].tolist()


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_materialization_met_by_a_reshard_publishes_once_the_move_ends(
        own_cluster: RedisClusterProcesses, moment: str) -> None:  # noqa: F811
    """The writer sends its steps to the slot's node with a client that follows no redirect:
    the first ASK failed the job at once (or, once the move had ended, the MOVED of the node it
    had started on), and the batch had to run it again from scratch. Now the step waits and
    the job publishes the snapshot it was writing: the chunks written before the move (since
    moved with the slot) are published with the rest, and none was written twice (a second
    write of a chunk fails the job as a duplicate id)."""
    store = cluster_store(own_cluster)
    reshard = Reshard(own_cluster, store, "quality")
    hook = EndMoveOnWait(reshard)
    waits = logging.getLogger("retrieval.features.offline.slot_moves")
    waits.addHandler(hook)
    try:
        before = materialize(quality_view(), lambda: quality_rows(len(IDS)), store,
                             progress=False)
        if moment == "before the job":
            reshard.begin()
        report = materialize(quality_view(), rows_beginning_the_move(moment, reshard), store,
                             progress=False, batch_rows=BATCH_ROWS)
        assert hook.waits == 1
        assert report.rows == len(IDS)
        assert store.live_snapshot_id("quality") == report.snapshot_id != before.snapshot_id
        assert quality(store) == (report.snapshot_id, [10.0 + i for i in range(len(IDS))])
    finally:
        waits.removeHandler(hook)
        store.close()


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_reshard_outlasting_the_wait_fails_the_job_and_keeps_the_previous_snapshot(
        own_cluster: RedisClusterProcesses, moment: str) -> None:  # noqa: F811
    """A move that does not end within ``slot_move_wait_seconds`` fails the job with an error
    naming the view, its slot and the setting; the previous snapshot stays live and served,
    during the move and after it."""
    store = cluster_store(own_cluster, slot_move_wait_seconds=0.2)
    reshard = Reshard(own_cluster, store, "quality")
    try:
        before = materialize(quality_view(), lambda: quality_rows(len(IDS)), store,
                             progress=False)
        served = (before.snapshot_id, [float(i) for i in range(len(IDS))])
        if moment == "before the job":
            reshard.begin()
        with pytest.raises(FeatureStoreError) as failed:
            materialize(quality_view(), rows_beginning_the_move(moment, reshard), store,
                        progress=False, batch_rows=BATCH_ROWS)
        message = str(failed.value)
        for named in ("'quality'", f"slot {reshard.slot}", "slot_move_wait_seconds",
                      "previous snapshot stays live"):
            assert named in message, message
        assert quality(store) == served  # read key by key while the slot is split
        reshard.end()
        assert store.live_snapshot_id("quality") == before.snapshot_id
        assert quality(store) == served
    finally:
        store.close()


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_the_wait_is_a_validated_setting(bad: float, capsys: pytest.CaptureFixture[str]) -> None:
    """The wait reaches the store from the config, and a wait that is not a finite positive
    number of seconds (forever would hang the job on a reshard left half done) is refused by
    the config, the store and the job's flag, naming the setting. Nothing connects."""
    config = FeatureStoreConfig(location=UNUSED_URL, cluster=True)
    with make_store(config) as store:
        assert isinstance(store, RedisStore) and store.slot_move_wait_seconds == 300
    with make_store(config.model_copy(update={"slot_move_wait_seconds": 12.5})) as store:
        assert isinstance(store, RedisStore) and store.slot_move_wait_seconds == 12.5
    with pytest.raises(ValidationError, match="slot_move_wait_seconds"):
        FeatureStoreConfig(location=UNUSED_URL, cluster=True, slot_move_wait_seconds=bad)
    with pytest.raises(FeatureConfigError, match="slot_move_wait_seconds"):
        RedisStore(UNUSED_URL, cluster=True, slot_move_wait_seconds=bad)
    code = features_main(["materialize", "--view", "quality", "--source", "rows.parquet",
                          "--store", UNUSED_URL, "--cluster", "--slot-move-wait-seconds",
                          str(bad)])
    assert code == 2
    assert "--slot-move-wait-seconds:" in capsys.readouterr().err
