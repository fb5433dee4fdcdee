"""Feature-store contract against LocalStore, RedisStore and RedisStore on a Cluster (no mocks).

One test body per behaviour, run against every store: materialize and read, consistency under
concurrent materialization, failed and killed jobs, and fail-open reads of a dead Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_servers import RedisProcess
from test_features_support import (
    make_store,
    quality_rows,
    quality_view,
    version_rows,
    version_view,
    wait_until,
)

import retrieval.features as features
from retrieval.features import (
    FeatureSchemaError,
    FeatureStatus,
    LocalStore,
    OnlineStore,
    RedisStore,
    materialize,
)

PRESENT, STALE, MISSING = FeatureStatus.PRESENT, FeatureStatus.STALE, FeatureStatus.MISSING
TESTS = Path(__file__).resolve().parent


@pytest.fixture(params=["local", "redis", "cluster"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OnlineStore]:
    made = make_store(request.param, tmp_path, request)
    yield made
    made.close()


def test_public_names_are_sorted() -> None:
    assert features.__all__ == sorted(features.__all__)
    for name in features.__all__:
        assert hasattr(features, name)


# -- the contract ------------------------------------------------------------------------------


def test_materialize_then_read_in_input_order(store: OnlineStore) -> None:
    view = quality_view(max_age_seconds=60)
    now = time.time()
    rows = quality_rows(50, event_time=now)
    rows[7]["event_time"] = now - 3600  # older than max_age: stale
    report = materialize(view, lambda: rows, store, progress=False, batch_rows=16)
    assert report.rows == 50 and report.rows_per_s > 0 and report.view == "quality"

    wanted = ["doc-9", "nope", "doc-7", "doc-0", "doc-9"]
    batch = store.read("quality", wanted, now=now)
    assert batch.available and batch.snapshot_id == report.snapshot_id
    assert batch.entity_ids == tuple(wanted)
    assert batch.status.tolist() == [PRESENT, MISSING, STALE, PRESENT, PRESENT]
    expected = np.array([9, -1, 7, 0, 9], dtype=np.float32)
    np.testing.assert_array_equal(batch.values["quality"], expected)
    np.testing.assert_array_equal(batch.values["clicks"], [90, 0, 70, 0, 90])
    np.testing.assert_allclose(batch.values["authority"], [9 / 50, 0.5, 7 / 50, 0, 9 / 50])
    assert batch.values["spam"].tolist() == [True, False, False, True, True]
    assert batch.values["quality"].dtype == np.float32 and batch.values["spam"].dtype == bool
    assert batch.event_time[0] == pytest.approx(now) and np.isnan(batch.event_time[1])
    assert batch.row(0) == {"quality": 9.0, "clicks": 90.0, "authority": 9 / 50, "spam": 1.0}
    assert store.last_snapshot_id("quality") == report.snapshot_id
    assert store.live_view("quality") == view


def test_rematerialization_changes_snapshot_and_keeps_previous(store: OnlineStore) -> None:
    view = quality_view()
    first = materialize(view, lambda: quality_rows(20), store, progress=False)
    second = materialize(view, lambda: quality_rows(20, offset=100), store, progress=False)
    assert second.snapshot_id != first.snapshot_id
    batch = store.read("quality", ["doc-3"])
    assert batch.snapshot_id == second.snapshot_id and batch.values["quality"][0] == 103
    assert store.live_snapshot_id("quality") == second.snapshot_id
    # grace 0: the live and the previous snapshot are kept, older ones are collected
    third = materialize(view, lambda: quality_rows(20, offset=200), store, progress=False)
    assert third.deleted_snapshots == [first.snapshot_id]
    assert store.snapshot_ids("quality") == sorted([second.snapshot_id, third.snapshot_id])


def test_without_timestamps_staleness_is_the_materialization_time(store: OnlineStore) -> None:
    view = quality_view(max_age_seconds=60)
    before = time.time()
    materialize(view, lambda: quality_rows(5), store, progress=False)
    fresh = store.read("quality", ["doc-1", "doc-2"])
    assert fresh.status.tolist() == [PRESENT, PRESENT]
    assert fresh.event_time[0] >= before
    later = store.read("quality", ["doc-1", "doc-2"], now=time.time() + 120)
    assert later.status.tolist() == [STALE, STALE]
    assert later.values["quality"].tolist() == [1, 2]  # stale values are still served


def test_unknown_view_and_empty_reads(store: OnlineStore) -> None:
    batch = store.read("never", ["a", "b"])
    assert batch.available and batch.snapshot_id is None and batch.values == {}
    assert batch.status.tolist() == [MISSING, MISSING]
    store.register(quality_view("never"))
    assert store.read("never", ["a"]).values["quality"].tolist() == [-1]
    materialize(quality_view(), lambda: quality_rows(3), store, progress=False)
    empty = store.read("quality", [])
    assert len(empty) == 0 and empty.available and empty.values["quality"].shape == (0,)
    with pytest.raises(features.FeatureRequestError):
        store.read("quality", [1, 2])  # type: ignore[list-item]
    with pytest.raises(features.FeatureRequestError):
        store.read("bad/name", ["a"])


def test_an_id_ending_in_nul_is_not_the_id_without_it(store: OnlineStore) -> None:
    """numpy's fixed-width bytes drop trailing NULs: the local store read "doc-1\\x00" as
    doc-1 (its features, "present"), where Redis found no such entity."""
    materialize(quality_view(), lambda: quality_rows(3), store, progress=False)
    batch = store.read("quality", ["doc-1\x00", "doc-1"])
    assert batch.status.tolist() == [MISSING, PRESENT]
    assert batch.values["quality"].tolist() == [-1, 1]


def test_duplicate_entity_fails_and_keeps_previous(store: OnlineStore) -> None:
    view = quality_view()
    live = materialize(view, lambda: quality_rows(10), store, progress=False).snapshot_id
    rows = quality_rows(10, offset=50) + [quality_rows(5)[4]]
    with pytest.raises(FeatureSchemaError, match="doc-4") as caught:
        materialize(view, lambda: rows, store, progress=False, batch_rows=4)
    assert caught.value.column == "doc_id"
    assert store.read("quality", ["doc-4"]).values["quality"][0] == 4
    assert store.snapshot_ids("quality") == [live]


# -- consistency under concurrent materialization ----------------------------------------------


def test_readers_never_see_two_snapshots(store: OnlineStore) -> None:
    """Snapshot v has version == v for every entity: one read must hold exactly one version."""
    view, n = version_view(), 600
    versions = {materialize(view, lambda: version_rows(n, 0), store, progress=False,
                            batch_rows=100).snapshot_id: 0}
    stop = threading.Event()
    seen: list[tuple[str | None, frozenset[int]]] = []
    failures: list[BaseException] = []
    reads = [0] * 8

    def reader(slot: int) -> None:
        rng = np.random.default_rng(slot)
        try:
            while not stop.is_set():
                ids = [f"doc-{i}" for i in rng.choice(n, size=200, replace=False)]
                batch = store.read("versions", ids)
                assert batch.available and batch.found.all(), batch.status
                seen.append((batch.snapshot_id, frozenset(batch.values["version"].tolist())))
                reads[slot] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(slot,)) for slot in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: all(reads))
        for version in range(1, 7):
            report = materialize(view, partial(version_rows, n, version), store,
                                 progress=False, batch_rows=100)
            versions[report.snapshot_id] = version
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures, failures[0]
    assert len({snapshot_id for snapshot_id, _ in seen}) >= 2  # reads overlapped the flips
    for snapshot_id, found in seen:
        assert len(found) == 1, f"a read mixed versions {sorted(found)}"
        assert snapshot_id is not None
        assert found == {versions[snapshot_id]}  # ... and it is the snapshot it claims


# -- failed and killed jobs --------------------------------------------------------------------


def test_bad_row_half_way_leaves_previous_live(store: OnlineStore) -> None:
    view = version_view()
    live = materialize(view, lambda: version_rows(3000, 1), store, progress=False).snapshot_id

    def rows() -> Iterator[dict[str, Any]]:
        for i, row in enumerate(version_rows(3000, 2)):
            if i == 2500:
                row["score"] = "oops"  # chunks 0 and 1 are already written by now
            yield row

    with pytest.raises(FeatureSchemaError, match="'score'") as caught:
        materialize(view, rows, store, progress=False, batch_rows=1000)
    assert caught.value.column == "score" and caught.value.row == 2500
    assert store.live_snapshot_id("versions") == live
    batch = store.read("versions", ["doc-0", "doc-2999"])
    assert batch.snapshot_id == live and batch.values["version"].tolist() == [1, 1]
    assert store.snapshot_ids("versions") == [live]  # the aborted snapshot was removed


CHILD = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_features_support import version_rows, version_view
from retrieval.features import LocalStore, RedisStore, materialize
mode, location, namespace, marker = sys.argv[1:5]
if location.startswith("redis://"):
    store = RedisStore(location, namespace=namespace, grace_seconds=0)
else:
    store = LocalStore(location, grace_seconds=0)

def rows():
    for i, row in enumerate(version_rows(3000, 2)):
        if mode == "hang" and i == 2500:
            Path(marker).write_text("written")
            time.sleep(600)  # killed here, half-way through the source
        yield row

if mode == "flip":  # die at the last instant: every file written, pointer not yet replaced
    real_replace = os.replace
    def replace(src, dst):
        if Path(dst).name == "CURRENT":
            Path(marker).write_text("flip")
            time.sleep(600)
        real_replace(src, dst)
    os.replace = replace
materialize(version_view(), rows, store, progress=False, batch_rows=1000)
"""


@pytest.mark.parametrize(("kind", "mode"), [("local", "hang"), ("local", "flip"),
                                            ("redis", "hang")])
def test_killed_materialization_leaves_previous_live(
    kind: str, mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store(kind, tmp_path, request)
    view = version_view()
    live = materialize(view, lambda: version_rows(3000, 1), store, progress=False).snapshot_id
    if isinstance(store, LocalStore):
        location, namespace = str(store.directory), "-"
    else:
        assert isinstance(store, RedisStore)
        location, namespace = store.url, store.namespace
    marker = tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(tests=str(TESTS)), mode, location, namespace,
         str(marker)],
        cwd=TESTS.parent,
    )
    try:
        assert wait_until(lambda: marker.exists() or child.poll() is not None, timeout=60)
        assert child.poll() is None, "the child finished instead of reaching the kill point"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert store.live_snapshot_id("versions") == live
    batch = store.read("versions", ["doc-0", "doc-2999"])
    assert batch.available and batch.values["version"].tolist() == [1, 1]
    leftovers = set(store.snapshot_ids("versions")) - {live}
    assert len(leftovers) == 1  # the killed job's partial snapshot, invisible to readers
    report = materialize(view, lambda: version_rows(3000, 3), store, progress=False)
    assert leftovers <= set(report.deleted_snapshots)  # collected by the next job (grace 0)
    assert store.read("versions", ["doc-5"]).values["version"].tolist() == [3]
    store.close()


# -- fail-open ---------------------------------------------------------------------------------


@pytest.fixture
def private_redis() -> Iterator[RedisProcess]:
    server = RedisProcess()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def test_unreachable_redis_serves_defaults_then_recovers(private_redis: RedisProcess) -> None:
    store = RedisStore(private_redis.url, namespace="failopen", socket_timeout_ms=200,
                       connect_timeout_ms=200, breaker_failures=2, breaker_cooldown_seconds=0.5)
    view = quality_view()
    materialize(view, lambda: quality_rows(10), store, progress=False)
    assert store.read("quality", ["doc-1"]).values["quality"].tolist() == [1]

    private_redis.stop()
    for _ in range(5):  # errors, then the open breaker short-circuits
        batch = store.read("quality", ["doc-1", "doc-2"])
        assert not batch.available and batch.snapshot_id is None
        assert batch.status.tolist() == [MISSING, MISSING]
        assert batch.values["quality"].tolist() == [-1, -1]  # defaults of the last seen schema
    stats = store.stats()
    assert stats["errors"] >= 2 and stats["short_circuits"] >= 1
    with pytest.raises(features.FeatureStoreError):  # the batch job fails loudly instead
        materialize(view, lambda: quality_rows(10), store, progress=False)
    assert stats["breaker_state"] in ("open", "half_open")

    private_redis.start()  # no persistence: the server comes back empty, the view's data lost
    assert wait_until(lambda: store.read("quality", ["doc-1"]) is not None
                      and store.stats()["breaker_state"] == "closed")
    lost = store.read("quality", ["doc-1"])  # answered, but nothing of what was served
    assert not lost.available and lost.values["quality"].tolist() == [-1]
    materialize(view, lambda: quality_rows(10, offset=5), store, progress=False)
    again = store.read("quality", ["doc-1"])
    assert again.available and again.values["quality"].tolist() == [6]
    store.close()


def test_a_redis_snapshot_whose_data_expired_is_unavailable(private_redis: RedisProcess) -> None:
    """The pointer outlived its snapshot's keys (no materialization within their TTL): the
    defaults are served as unavailable, not as the view's values; a view never materialized
    is a healthy empty answer."""
    store = RedisStore(private_redis.url, namespace="expired")
    materialize(quality_view(), lambda: quality_rows(10), store, progress=False)
    assert store.read("quality", ["doc-1"]).available
    client = private_redis.client()
    live = "expired:fs1:{quality}:live"
    client.delete(*[k for k in client.keys("expired:*") if k.decode() != live])
    for reader in (store, RedisStore(private_redis.url, namespace="expired",
                                     views=[quality_view()])):
        batch = reader.read("quality", ["doc-1"])
        assert not batch.available and batch.values["quality"].tolist() == [-1]
        assert reader.stats()["errors"] == 1
        reader.close()
    never = RedisStore(private_redis.url, namespace="never", views=[quality_view()])
    assert never.read("quality", ["doc-1"]).available
    never.close()


def test_hung_redis_read_is_bounded_and_fails_open(private_redis: RedisProcess) -> None:
    store = RedisStore(private_redis.url, namespace="hung", socket_timeout_ms=50,
                       connect_timeout_ms=50, views=[quality_view()])
    private_redis.pause()  # accepts TCP, never answers
    try:
        batch = store.read("quality", ["doc-1"])
        assert not batch.available and batch.values["quality"].tolist() == [-1]
    finally:
        private_redis.resume()
    assert wait_until(lambda: store.read("quality", ["doc-1"]).available)
    store.close()


def test_broken_local_snapshot_fails_open(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "fs")
    report = materialize(quality_view(), lambda: quality_rows(10), store, progress=False)
    (tmp_path / "fs" / "quality" / "snapshots" / report.snapshot_id / "f.quality.npy").unlink()
    fresh = LocalStore(tmp_path / "fs", views=[quality_view()])
    batch = fresh.read("quality", ["doc-1"])
    assert not batch.available and batch.values["quality"].tolist() == [-1]
    assert fresh.stats()["errors"] == 1


def test_vanished_local_pointer_is_unavailable_not_defaults(tmp_path: Path) -> None:
    """A materialized view whose pointer file is gone serves its defaults as unavailable, in a
    process that had read it and in a fresh one; a view never materialized stays healthy."""
    store = LocalStore(tmp_path / "fs", views=[quality_view()])
    materialize(quality_view(), lambda: quality_rows(10), store, progress=False)
    assert store.read("quality", ["doc-1"]).available
    (tmp_path / "fs" / "quality" / "CURRENT").unlink()
    for reader in (store, LocalStore(tmp_path / "fs", views=[quality_view()])):
        batch = reader.read("quality", ["doc-1"])
        assert not batch.available and batch.values["quality"].tolist() == [-1]
        assert reader.stats()["errors"] >= 1
    never = LocalStore(tmp_path / "empty", views=[quality_view()])
    assert never.read("quality", ["doc-1"]).available


def test_no_pickle_on_disk(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "fs")
    report = materialize(quality_view(), lambda: quality_rows(10), store, progress=False)
    directory = tmp_path / "fs" / "quality" / "snapshots" / report.snapshot_id
    for path in directory.glob("*.npy"):
        np.load(path, allow_pickle=False)  # raises if any file needed pickle
    assert sorted(os.listdir(directory)) == [
        "f.authority.npy", "f.clicks.npy", "f.quality.npy", "f.spam.npy", "ids.npy", "meta.json"]
