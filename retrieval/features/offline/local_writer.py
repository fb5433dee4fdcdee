"""Materialization into a ``LocalStore`` directory: snapshot files, the pointer flip, GC.

The writer collects chunks in memory, writes the sorted columns into a hidden directory,
renames it into place and only then flips ``CURRENT`` (an atomic replace); the format is
``retrieval.features.local_files``. A failure at any point leaves the previous snapshot live.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from indexes.storage import fsync_path, fsync_write, mint_id
from retrieval.features.errors import FeatureSchemaError, FeatureStoreError
from retrieval.features.local import LocalStore
from retrieval.features.local_files import (
    EVENT_TIME,
    IDS,
    META,
    POINTER,
    SNAPSHOTS,
    TMP_PREFIX,
    encode_ids,
    feature_file,
    read_meta,
    read_pointer,
)
from retrieval.features.offline.writer_base import (
    SnapshotWriter,
    snapshots_to_delete,
)
from retrieval.features.reads import FeatureColumns
from retrieval.features.view import WIRE_DTYPES, FeatureView, SnapshotMeta

logger = logging.getLogger(__name__)


def atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    """Replace ``path`` with ``payload``: readers see the old or the new file, never a mix."""
    fsync_write(path, json.dumps(payload).encode("utf-8"))


def _save(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def write_snapshot(
    directory: Path,
    meta: SnapshotMeta,
    ids: np.ndarray,
    values: dict[str, np.ndarray],
    event_time: np.ndarray | None,
) -> None:
    """Write every file of a snapshot into ``directory`` (already created) durably."""
    _save(directory / IDS, ids)
    for feature in meta.view.features:
        column = values[feature.name].astype(WIRE_DTYPES[feature.dtype], copy=False)
        _save(directory / feature_file(feature.name), column)
    if event_time is not None:
        _save(directory / EVENT_TIME, event_time.astype("<f8", copy=False))
    with (directory / META).open("w", encoding="utf-8") as handle:
        handle.write(meta.model_dump_json())
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(directory)


def collect_garbage(store: LocalStore, view_name: str, now: float | None = None) -> list[str]:
    """Delete snapshots past the grace period (see ``writer_base``); returns their ids."""
    view_dir = store.view_dir(view_name)
    root = view_dir / SNAPSHOTS
    try:
        pointer = read_pointer(view_dir / POINTER)
    except FileNotFoundError:
        pointer = {"snapshot_id": None, "retired": {}}
    created = {sid: _created_at(path) for sid, path in _snapshot_dirs(root).items()}
    doomed = snapshots_to_delete(created, pointer.get("retired", {}), pointer["snapshot_id"],
                                 time.time() if now is None else now, store.grace_seconds)
    for sid in doomed:
        for path in (root / sid, root / f"{TMP_PREFIX}{sid}"):
            shutil.rmtree(path, ignore_errors=True)
    return doomed

def publish(store: LocalStore, view_name: str, snapshot_id: str, published_at: float) -> None:
    """Flip the live pointer to ``snapshot_id`` (atomic replace of ``CURRENT``)."""
    view_dir = store.view_dir(view_name)
    try:
        old = read_pointer(view_dir / POINTER)
    except FileNotFoundError:
        old = {"snapshot_id": None, "retired": {}}
    present = set(store.snapshot_ids(view_name))
    retired = {sid: at for sid, at in old.get("retired", {}).items() if sid in present}
    if old["snapshot_id"] and old["snapshot_id"] != snapshot_id:
        retired[old["snapshot_id"]] = published_at
    retired.pop(snapshot_id, None)
    atomic_write_json(view_dir / POINTER, {
        "snapshot_id": snapshot_id, "published_at": published_at, "retired": retired,
    })



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


class LocalWriter(SnapshotWriter):
    """Collects chunks in memory, then writes sorted columns and publishes in ``commit``."""

    def __init__(self, store: LocalStore, view: FeatureView, created_at: float,
                 has_event_time: bool) -> None:
        self.store = store
        self.view = view
        self.created_at = created_at
        self.has_event_time = has_event_time
        self.snapshot_id = mint_id(created_at)  # the same ids as index builds
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
            fsync_path(self.root)
            publish(self.store, self.view.name, self.snapshot_id, time.time())
        except OSError as exc:
            raise FeatureStoreError(f"writing snapshot {final} failed: {exc}") from exc
        self.published = True
        self.chunks = []
        try:
            return collect_garbage(self.store, self.view.name)
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
