"""``open_writer``: the snapshot writer for a store's location.

The online stores only read; the job takes from them where the snapshots live (directory, or
Redis URL, namespace and the batch settings: TTL, chunk size, grace period, write timeout,
how long to wait out a reshard of a view's slot).
"""

from __future__ import annotations

from retrieval.features.errors import FeatureConfigError, FeatureStoreError
from retrieval.features.local import LocalStore
from retrieval.features.offline.local_writer import LocalWriter
from retrieval.features.offline.redis_writer import RedisWriter
from retrieval.features.offline.writer_base import SnapshotWriter
from retrieval.features.redis_store import RedisStore
from retrieval.features.store import OnlineStore
from retrieval.features.view import FeatureView
from retrieval.resilience import redact_url


def open_writer(store: OnlineStore, view: FeatureView, *, created_at: float,
                has_event_time: bool) -> SnapshotWriter:
    """Start a new snapshot of ``view`` where ``store`` reads its snapshots."""
    if isinstance(store, LocalStore):
        return LocalWriter(store, view, created_at, has_event_time)
    if isinstance(store, RedisStore):
        try:
            client = store.admin_client()
        except Exception as exc:
            raise FeatureStoreError(f"cannot connect to {redact_url(store.url)}: {exc}") from exc
        return RedisWriter(client, store.keys(view.name), view, created_at, has_event_time,
                           store.key_ttl_ms, store.write_chunk, store.grace_seconds,
                           store.slot_move_wait_seconds)
    raise FeatureConfigError(
        f"cannot materialize into {store.describe()}: use a LocalStore or a RedisStore")
