"""``LocalStore``: snapshots as memory-mapped numpy files in a directory (the embedded default).

Reads cost one ``os.stat`` of the pointer file (to notice a flip) plus a binary search of the
sorted id column; a snapshot's arrays are mapped once and shared by all threads until the
pointer changes, which is the store's read-through cache keyed by snapshot id: a read always
uses the snapshot that was live when it started. See ``local_files`` for the on-disk format.

One materialization per view at a time: two concurrent jobs both publish, in some order, but
the ``retired`` bookkeeping of one of them may be lost (the snapshot is then collected by age).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.cache.base import CacheCounters
from retrieval.features.batch import (
    FeatureBatch,
    FeatureColumns,
    check_entity_ids,
    unavailable_batch,
)
from retrieval.features.errors import FeatureRequestError, FeatureSchemaError, FeatureStoreError
from retrieval.features.local_files import (
    POINTER,
    SNAPSHOTS,
    TMP_PREFIX,
    LoadedSnapshot,
    atomic_write_json,
    encode_ids,
    fsync_dir,
    read_meta,
    read_pointer,
    write_snapshot,
)
from retrieval.features.store import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_ENTITIES,
    OnlineStore,
    SnapshotWriter,
    check_grace,
    new_snapshot_id,
    snapshots_to_delete,
)
from retrieval.features.view import VIEW_NAME, FeatureView, SnapshotMeta
from retrieval.resilience import BurstLogger

logger = logging.getLogger(__name__)
_POINTER_RETRIES = 3  # a pointer flipped and its old snapshot collected twice in one read


class LocalStore(OnlineStore):
    """Feature snapshots under ``directory`` (one sub-directory per view)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        views: Sequence[FeatureView] = (),
        max_entities_per_read: int = DEFAULT_MAX_ENTITIES,
        log_quiet_seconds: float = 60.0,
    ) -> None:
        super().__init__(views, max_entities_per_read)
        self.directory = Path(directory)
        self.grace_seconds = check_grace(grace_seconds)
        self._loaded: dict[str, tuple[tuple[int, int, int], LoadedSnapshot]] = {}
        self._counters = CacheCounters(("reads", "entities", "missing", "stale", "errors"))
        self._log = BurstLogger(logger, f"feature store {self.directory}", log_quiet_seconds)

    def describe(self) -> str:
        return f"LocalStore({str(self.directory)!r})"

    def view_dir(self, view_name: str) -> Path:
        if not VIEW_NAME.match(view_name):
            raise FeatureRequestError(f"invalid view name {view_name!r}")
        return self.directory / view_name

    # -- reads ----------------------------------------------------------------------------

    def read(self, view_name: str, entity_ids: Sequence[str], *, now: float | None = None
             ) -> FeatureBatch:
        ids = check_entity_ids(entity_ids, self.max_entities_per_read)
        view_dir = self.view_dir(view_name)
        try:
            loaded = self._live(view_name, view_dir)
        except Exception as exc:  # a broken store must not fail the request: serve defaults
            self._counters.add(reads=1, entities=len(ids), missing=len(ids), errors=1)
            self._log.error(exc)
            return unavailable_batch(view_name, ids, self._fallback_view(view_name))
        self._log.success()
        if loaded is None:  # never materialized: a healthy store with no data for the view
            self._counters.add(reads=1, entities=len(ids), missing=len(ids))
            return unavailable_batch(view_name, ids, self._fallback_view(view_name), None, True)
        batch = loaded.read(ids, time.time() if now is None else now)
        self._remember(loaded.meta.view, loaded.snapshot_id)
        self._count(batch)
        return batch

    def _count(self, batch: FeatureBatch) -> None:
        missing = int(np.count_nonzero(batch.status == 2))
        stale = int(np.count_nonzero(batch.status == 1))
        self._counters.add(reads=1, entities=len(batch), missing=missing, stale=stale)

    def _live(self, view_name: str, view_dir: Path) -> LoadedSnapshot | None:
        """The live snapshot, re-mapped only when the pointer file changed."""
        pointer = view_dir / POINTER
        for _ in range(_POINTER_RETRIES):
            try:
                stat = os.stat(pointer)
            except FileNotFoundError:
                return None
            key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            cached = self._loaded.get(view_name)
            if cached is not None and cached[0] == key:
                return cached[1]
            try:
                snapshot_id = read_pointer(pointer)["snapshot_id"]
                if cached is not None and cached[1].snapshot_id == snapshot_id:
                    loaded = cached[1]
                else:
                    loaded = LoadedSnapshot(view_dir / SNAPSHOTS / snapshot_id)
            except FileNotFoundError:
                continue  # flipped and collected under us: read the new pointer
            self._loaded[view_name] = (key, loaded)
            return loaded
        raise FeatureStoreError(f"{pointer} names a snapshot that does not exist")

    # -- batch side ---------------------------------------------------------------------------

    def begin(self, view: FeatureView, *, created_at: float, has_event_time: bool
              ) -> SnapshotWriter:
        return _LocalWriter(self, view, created_at, has_event_time)

    def live_snapshot_id(self, view_name: str) -> str | None:
        try:
            return str(read_pointer(self.view_dir(view_name) / POINTER)["snapshot_id"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise FeatureStoreError(f"cannot read the pointer of view {view_name!r}: {exc}") \
                from exc

    def live_view(self, view_name: str) -> FeatureView | None:
        snapshot_id = self.live_snapshot_id(view_name)
        if snapshot_id is None:
            return None
        try:
            return read_meta(self.view_dir(view_name) / SNAPSHOTS / snapshot_id).view
        except OSError as exc:
            raise FeatureStoreError(f"live snapshot {snapshot_id} is unreadable: {exc}") from exc

    def view_names(self) -> list[str]:
        found = {p.parent.name for p in self.directory.glob(f"*/{POINTER}")}
        return sorted(found | set(super().view_names()))

    def probe(self) -> bool:
        """A store directory that does not exist is unreachable (nothing was materialized
        there, or the path is wrong); it becomes reachable once a job creates it."""
        return self.directory.is_dir()

    def snapshot_ids(self, view_name: str) -> list[str]:
        root = self.view_dir(view_name) / SNAPSHOTS
        if not root.is_dir():
            return []
        return sorted(entry.name.removeprefix(TMP_PREFIX) for entry in root.iterdir()
                      if entry.is_dir())

    def collect_garbage(self, view_name: str, now: float | None = None) -> list[str]:
        """Delete snapshots past the grace period (see ``store``); returns their ids."""
        view_dir = self.view_dir(view_name)
        root = view_dir / SNAPSHOTS
        try:
            pointer = read_pointer(view_dir / POINTER)
        except FileNotFoundError:
            pointer = {"snapshot_id": None, "retired": {}}
        created = {sid: _created_at(path) for sid, path in _snapshot_dirs(root).items()}
        doomed = snapshots_to_delete(created, pointer.get("retired", {}), pointer["snapshot_id"],
                                     time.time() if now is None else now, self.grace_seconds)
        for sid in doomed:
            for path in (root / sid, root / f"{TMP_PREFIX}{sid}"):
                shutil.rmtree(path, ignore_errors=True)
        return doomed

    def publish(self, view_name: str, snapshot_id: str, published_at: float) -> None:
        """Flip the live pointer to ``snapshot_id`` (atomic replace of ``CURRENT``)."""
        view_dir = self.view_dir(view_name)
        try:
            old = read_pointer(view_dir / POINTER)
        except FileNotFoundError:
            old = {"snapshot_id": None, "retired": {}}
        present = set(self.snapshot_ids(view_name))
        retired = {sid: at for sid, at in old.get("retired", {}).items() if sid in present}
        if old["snapshot_id"] and old["snapshot_id"] != snapshot_id:
            retired[old["snapshot_id"]] = published_at
        retired.pop(snapshot_id, None)
        atomic_write_json(view_dir / POINTER, {
            "snapshot_id": snapshot_id, "published_at": published_at, "retired": retired,
        })

    def stats(self) -> dict[str, Any]:
        return {"backend": "local", **self._counters.snapshot()}

    def close(self) -> None:
        self._loaded.clear()


def _snapshot_dirs(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    return {entry.name.removeprefix(TMP_PREFIX): entry for entry in root.iterdir()
            if entry.is_dir()}


def _created_at(path: Path) -> float:
    """A complete snapshot's start time; for a partial one, its directory's last change."""
    try:
        return read_meta(path).created_at
    except Exception:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0


class _LocalWriter(SnapshotWriter):
    """Collects chunks in memory, then writes sorted columns and publishes in ``commit``."""

    def __init__(self, store: LocalStore, view: FeatureView, created_at: float,
                 has_event_time: bool) -> None:
        self.store = store
        self.view = view
        self.created_at = created_at
        self.has_event_time = has_event_time
        self.snapshot_id = new_snapshot_id(created_at)
        self.root = store.view_dir(view.name) / SNAPSHOTS
        self.tmp = self.root / f"{TMP_PREFIX}{self.snapshot_id}"
        try:
            self.tmp.mkdir(parents=True)
        except OSError as exc:
            raise FeatureStoreError(f"cannot create snapshot directory {self.tmp}: {exc}") \
                from exc
        self.chunks: list[FeatureColumns] = []
        self.published = False

    def write(self, columns: FeatureColumns) -> None:
        self.chunks.append(columns)

    def commit(self) -> list[str]:
        ids = encode_ids([i for chunk in self.chunks for i in chunk.entity_ids])
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        _check_unique(ids, self.view.entity_key)
        values = {name: np.concatenate([c.values[name] for c in self.chunks])[order]
                  for name in self.view.feature_names}
        times = None
        if self.has_event_time:
            times = np.concatenate([c.event_time for c in self.chunks  # type: ignore[misc]
                                    ])[order]
        meta = SnapshotMeta(snapshot_id=self.snapshot_id, view=self.view,
                            created_at=self.created_at, rows=int(ids.shape[0]),
                            has_event_time=self.has_event_time)
        final = self.root / self.snapshot_id
        try:
            write_snapshot(self.tmp, meta, ids, values, times)
            os.rename(self.tmp, final)  # complete snapshot appears under its real name at once
            fsync_dir(self.root)
            self.store.publish(self.view.name, self.snapshot_id, time.time())
        except OSError as exc:
            raise FeatureStoreError(f"writing snapshot {final} failed: {exc}") from exc
        self.published = True
        self.chunks = []
        try:
            return self.store.collect_garbage(self.view.name)
        except OSError as exc:  # published already: a failed cleanup is not fatal
            logger.warning("garbage collection of view %r failed: %s", self.view.name, exc)
            return []

    def abort(self) -> None:
        self.chunks = []
        if self.published:
            return
        shutil.rmtree(self.tmp, ignore_errors=True)


def _check_unique(sorted_ids: np.ndarray, column: str) -> None:
    same = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if same.size:
        duplicate = bytes(sorted_ids[same[0]]).decode("utf-8", "replace")
        raise FeatureSchemaError(
            f"entity id {duplicate!r} appears more than once in column {column!r}; a snapshot "
            "holds one row per document (deduplicate the source, e.g. keep the latest row)",
            column,
        )
