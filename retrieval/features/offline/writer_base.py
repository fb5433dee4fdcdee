"""The ``SnapshotWriter`` contract and the garbage-collection rule shared by both writers.

A job ``begin``s a snapshot (``writers.open_writer``), ``write``s chunks, then ``commit``s
(which publishes it by flipping the live pointer, then garbage-collects) or ``abort``s. Nothing
a writer does is visible to readers before ``commit`` flips the pointer.

Garbage collection (``snapshots_to_delete``): the live snapshot and the previous one are always
kept; any other snapshot is deleted once it has been retired (or, if it was never published
because its job failed or was killed, once it was started) at least ``grace_seconds`` ago. The
grace period protects readers that looked up the pointer just before a flip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from retrieval.features.reads import FeatureColumns


def snapshots_to_delete(
    created: Mapping[str, float],
    retired: Mapping[str, float],
    live: str | None,
    now: float,
    grace_seconds: float,
) -> list[str]:
    """Snapshot ids that garbage collection may delete (see the module docstring)."""
    known_retired = {sid: at for sid, at in retired.items() if sid in created and sid != live}
    previous = max(known_retired, key=lambda sid: known_retired[sid], default=None)
    doomed = []
    for sid, created_at in created.items():
        if sid in (live, previous):
            continue
        since = known_retired.get(sid, created_at)
        if now - since >= grace_seconds:
            doomed.append(sid)
    return sorted(doomed)


class SnapshotWriter(ABC):
    """Writes one snapshot of one view; invisible to readers until ``commit``."""

    snapshot_id: str

    @abstractmethod
    def write(self, columns: FeatureColumns) -> None:
        """Add a chunk of rows (raises ``FeatureSchemaError`` for a duplicate entity id)."""

    @abstractmethod
    def commit(self) -> list[str]:
        """Publish the snapshot (atomic pointer flip); returns the snapshot ids deleted by GC."""

    @abstractmethod
    def abort(self) -> None:
        """Best-effort removal of what was written; never raises."""
