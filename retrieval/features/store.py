"""The ``OnlineStore`` contract shared by the local-file and Redis stores: the reads.

Snapshots are written by the nightly job (``retrieval.features.offline``: its writers publish a
snapshot by flipping the live pointer); every read returns values of exactly one snapshot.

Readers: ``read`` never raises for an unreachable or broken store: it returns defaults with
``available=False``, counts the error and lets a circuit breaker skip a dead backend. It raises
only for caller bugs (``FeatureRequestError``: non-string ids, too many ids).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from retrieval.features.errors import FeatureConfigError
from retrieval.features.reads import FeatureBatch
from retrieval.features.view import FeatureView

DEFAULT_GRACE_SECONDS = 3600.0
DEFAULT_MAX_ENTITIES = 10_000


def check_grace(grace_seconds: float) -> float:
    if not grace_seconds >= 0:
        raise FeatureConfigError(f"grace_seconds must be >= 0, got {grace_seconds}")
    return float(grace_seconds)


class OnlineStore(ABC):
    """Where materialized snapshots live and where the request path reads them."""

    def __init__(self, views: Sequence[FeatureView] = (),
                 max_entities_per_read: int = DEFAULT_MAX_ENTITIES) -> None:
        if max_entities_per_read < 1:
            raise FeatureConfigError("max_entities_per_read must be >= 1")
        self.max_entities_per_read = max_entities_per_read
        self._views: dict[str, FeatureView] = {view.name: view for view in views}
        self._last_ids: dict[str, str | None] = {}
        self._lock = threading.Lock()

    # -- request path -----------------------------------------------------------------------

    @abstractmethod
    def read(self, view_name: str, entity_ids: Sequence[str], *, now: float | None = None
             ) -> FeatureBatch:
        """Features of ``entity_ids`` in input order from one snapshot; one round trip.

        ``now`` (epoch seconds, default the wall clock) decides staleness. Never raises for
        store failures (``available=False``, defaults); raises ``FeatureRequestError`` for bad
        arguments.
        """

    def last_snapshot_id(self, view_name: str) -> str | None:
        """The snapshot id the latest successful read of ``view_name`` returned (no I/O).

        Meant for result-cache keys: it may lag one read behind a flip.
        """
        return self._last_ids.get(view_name)

    def register(self, view: FeatureView) -> None:
        """Declare a view so reads can fill its defaults even before any snapshot is readable."""
        with self._lock:
            self._views[view.name] = view

    def _fallback_view(self, view_name: str) -> FeatureView | None:
        return self._views.get(view_name)

    def _remember(self, view: FeatureView, snapshot_id: str | None) -> None:
        self._last_ids[view.name] = snapshot_id
        if self._views.get(view.name) != view:  # the latest schema seen fills future defaults
            with self._lock:
                self._views[view.name] = view

    # -- admin reads (the CLI and the job; may use long timeouts) --------------------------

    @abstractmethod
    def live_snapshot_id(self, view_name: str) -> str | None:
        """The live snapshot id, read from the store (raises ``FeatureStoreError``)."""

    @abstractmethod
    def live_view(self, view_name: str) -> FeatureView | None:
        """The view definition stored with the live snapshot (raises ``FeatureStoreError``)."""

    @abstractmethod
    def snapshot_ids(self, view_name: str) -> list[str]:
        """Every stored snapshot of the view, published or not, sorted by id (oldest first)."""

    # -- request-path-safe checks (bounded by the store's read timeouts) -------------------------

    def online_snapshot_id(self, view_name: str) -> str | None:
        """The live snapshot id, fast enough for a background refresher next to the request
        path (raises ``FeatureStoreError`` when the store cannot answer)."""
        return self.live_snapshot_id(view_name)

    def online_view(self, view_name: str) -> FeatureView | None:
        """The live snapshot's view, for load-time checks (raises ``FeatureStoreError``)."""
        return self.live_view(view_name)

    def view_names(self) -> list[str]:
        """Views this store knows of (best effort, for "did you mean" hints)."""
        return sorted(self._views)

    def probe(self) -> bool:
        """Can the store be reached now? Raises ``ConfigError`` for bad credentials."""
        return True

    # -- lifecycle ----------------------------------------------------------------------------

    def describe(self) -> str:
        return type(self).__name__

    def stats(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def close(self) -> None:
        """Release connections and mappings; later calls stay safe."""

    def __enter__(self) -> OnlineStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
