"""``LocalStore``: snapshots as memory-mapped numpy files in a directory (the embedded default).

Reads cost one ``os.stat`` of the pointer file (to notice a flip) plus a binary search of the
sorted id column; a snapshot's arrays are mapped once and shared by all threads until the
pointer changes, which is the store's read-through cache keyed by snapshot id: a read always
uses the snapshot that was live when it started. See ``local_files`` for the on-disk format.

The store only reads; the nightly job writes through ``offline.local_writer``, which takes the
directory and ``grace_seconds`` from here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.errors import MissingArtifactError
from retrieval.cache.base import CacheCounters
from retrieval.features.errors import FeatureRequestError, FeatureStoreError
from retrieval.features.local_files import (
    POINTER,
    SNAPSHOTS,
    TMP_PREFIX,
    LoadedSnapshot,
    read_meta,
    read_pointer,
)
from retrieval.features.reads import (
    FeatureBatch,
    FeatureStatus,
    check_entity_ids,
    unavailable_batch,
)
from retrieval.features.store import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_ENTITIES,
    OnlineStore,
    check_grace,
)
from retrieval.features.view import VIEW_NAME, FeatureView
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
        missing = int(np.count_nonzero(batch.mask(FeatureStatus.MISSING)))
        stale = int(np.count_nonzero(batch.mask(FeatureStatus.STALE)))
        self._counters.add(reads=1, entities=len(batch), missing=missing, stale=stale)

    def _live(self, view_name: str, view_dir: Path) -> LoadedSnapshot | None:
        """The live snapshot, re-mapped only when the pointer file changed."""
        pointer = view_dir / POINTER
        for _ in range(_POINTER_RETRIES):
            key = _pointer_key(pointer)
            if key is None:
                self._check_never_materialized(view_name, view_dir)
                return None
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
            except MissingArtifactError:
                if _pointer_key(pointer) != key:  # flipped, and collected while we loaded it
                    continue
                raise
            self._loaded[view_name] = (key, loaded)
            return loaded
        raise FeatureStoreError(f"{pointer} names a snapshot that does not exist")

    def _check_never_materialized(self, view_name: str, view_dir: Path) -> None:
        """A view with no pointer is healthy only if it never had one: a pointer gone while
        finished snapshots remain (or after this process read one) is a damaged store, whose
        defaults must be served as unavailable, not as the view's real values."""
        snapshots = view_dir / SNAPSHOTS
        finished = snapshots.is_dir() and any(
            entry.is_dir() and not entry.name.startswith(TMP_PREFIX)
            for entry in snapshots.iterdir())
        if finished or view_name in self._loaded:
            raise FeatureStoreError(
                f"{view_dir / POINTER} is missing but view {view_name!r} has been "
                "materialized; publish a snapshot again (`retrieval features materialize`) "
                "or restore the pointer file")

    # -- admin reads (the CLI, the job) ------------------------------------------------------

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

    def stats(self) -> dict[str, Any]:
        return {"backend": "local", **self._counters.snapshot()}

    def close(self) -> None:
        self._loaded.clear()


def _pointer_key(pointer: Path) -> tuple[int, int, int] | None:
    """What identifies one version of the pointer file (None: no pointer yet)."""
    try:
        stat = os.stat(pointer)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
