"""``RedisStore``: feature snapshots in Redis (standalone or Cluster), read fail-open.

Reads are ONE round trip and see ONE snapshot: a Lua script (``redis_layout.READ_SCRIPT``)
reads the live pointer and ``HMGET``s every requested entity of that snapshot atomically, so
neither a flip nor a garbage collection can land in the middle of a read. All keys of a view
share a Cluster hash tag, hence one slot and one node, which is what lets one script do it.
The price: a view must fit on one node (1M documents x 5 features is ~150 MB); a larger one
can be split into several views.

A reshard moves a view's slot whole, but key by key: while it moves, some keys of the view are
on the old node and some on the new, and the script (which declares only the pointer) cannot
run on either. Such a read is answered key by key instead, following each key's redirect
(``_read_each_key``): correct values, a few round trips, no failure counted. Serving defaults
for the whole move (minutes for a large view) would rank without the view's features all that
time, and counting the failures opened the breaker, serving defaults for every view.

The snapshot's schema (its ``SnapshotMeta``) comes back with the values the first time a
process reads a snapshot, so a reader needs nothing but the view name, and values are always
decoded with the schema they were written with.

Failure model, as in ``retrieval.cache`` and through the same ``RedisLink``
(``retrieval.resilience``): short socket timeouts, no client retries, errors counted and logged
once per outage, and a circuit breaker that skips a dead server; an unreachable store gives
defaults with ``available=False``, never an exception. Every call a search makes (feature
reads, the live pointer for cache keys) goes through that link; only admin calls
(``live_snapshot_id``, ``live_view``, ``snapshot_ids``) and the nightly job's writer
(``offline.redis_writer``, which takes its URL, TTL, chunk size, grace period and how long to wait
out a reshard of a view's slot from here) use a client with the batch job's long timeouts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ClusterError, ResponseError

from retrieval.cache.base import CacheCounters, check_ttl
from retrieval.cache.cluster_reads import read_each_key
from retrieval.cache.keys import validate_namespace
from retrieval.cache.redis_backend import refuse_decoded_replies
from retrieval.features.errors import FeatureConfigError, FeatureRequestError, FeatureStoreError
from retrieval.features.reads import (
    FeatureBatch,
    FeatureStatus,
    assemble_batch,
    check_entity_ids,
    unavailable_batch,
)
from retrieval.features.redis_layout import (
    EVENT_FIELD,
    READ_SCRIPT,
    LuaScript,
    ViewKeys,
    record_layout,
    record_width,
)
from retrieval.features.store import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_ENTITIES,
    OnlineStore,
    check_grace,
)
from retrieval.features.view import VIEW_NAME, FeatureView, SnapshotMeta
from retrieval.resilience import (
    NO_TLS,
    BurstLogger,
    LinkSettings,
    RedisLink,
    TlsFiles,
    make_client,
    redact_url,
)
from retrieval.resilience.redis_link import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_SOCKET_TIMEOUT_MS,
    AnyRedis,
    Failure,
)

logger = logging.getLogger(__name__)
READ = LuaScript(READ_SCRIPT)
_SCHEMAS_KEPT = 4  # per view: enough for readers racing across a couple of flips

# Timeouts as the cache's (resilience.redis_link): a 1,000-entity script answers in ~1 ms on
# loopback, and the tail on a busy host is the scheduler's, not the script's.
DEFAULT_KEY_TTL_SECONDS = 30 * 86400.0
# How long a materialization step waits for a reshard moving its view's slot to end
# (``offline.slot_moves``). redis-cli moves ~100,000 entities in 7 s on loopback, so a view near
# its size limit (1M documents) takes a minute or more, longer across a network; a slot left
# half moved still fails the job within minutes.
DEFAULT_SLOT_MOVE_WAIT_SECONDS = 300.0


class RedisStore(OnlineStore):
    """Feature snapshots in Redis; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        cluster: bool = False,
        namespace: str = "retrieval",
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        key_ttl_seconds: float = DEFAULT_KEY_TTL_SECONDS,
        socket_timeout_ms: float = DEFAULT_SOCKET_TIMEOUT_MS,
        connect_timeout_ms: float = DEFAULT_CONNECT_TIMEOUT_MS,
        breaker_failures: int = 5,
        breaker_cooldown_seconds: float = 1.0,
        write_timeout_seconds: float = 60.0,
        write_chunk: int = 1000,
        slot_move_wait_seconds: float = DEFAULT_SLOT_MOVE_WAIT_SECONDS,
        views: Sequence[FeatureView] = (),
        max_entities_per_read: int = DEFAULT_MAX_ENTITIES,
        log_quiet_seconds: float = 60.0,
        tls: TlsFiles = NO_TLS,
    ) -> None:
        super().__init__(views, max_entities_per_read)
        self.link = RedisLink(url, LinkSettings(
            cluster, socket_timeout_ms, connect_timeout_ms, breaker_failures,
            breaker_cooldown_seconds, log_quiet_seconds, tls), logger=logger,
            what="feature store", fallback="serving feature defaults", section="feature_store",
            error=FeatureConfigError)
        # Records and schemas are bytes: a decoded reply failed every read (as the cache's).
        refuse_decoded_replies(url, FeatureConfigError)
        self.url = self.link.url
        self.cluster = cluster
        self.namespace = validate_namespace(namespace)
        self.grace_seconds = check_grace(grace_seconds)
        if not key_ttl_seconds >= 60:
            raise FeatureConfigError(
                f"key_ttl_seconds must be >= 60 (it bounds how long a snapshot survives "
                f"without a new materialization), got {key_ttl_seconds}")
        check_ttl(key_ttl_seconds, "key_ttl_seconds", FeatureConfigError)  # else every write fails
        if not write_timeout_seconds > 0:
            raise FeatureConfigError("write_timeout_seconds must be > 0")
        if write_chunk < 1:
            raise FeatureConfigError(f"write_chunk must be >= 1, got {write_chunk}")
        if not 0 < slot_move_wait_seconds < math.inf:  # forever would hang on a stuck reshard
            raise FeatureConfigError(
                "slot_move_wait_seconds must be a finite number of seconds > 0 (how long a "
                f"materialization waits for a reshard of its view's slot), got "
                f"{slot_move_wait_seconds}")
        self.slot_move_wait_seconds = float(slot_move_wait_seconds)
        self.key_ttl_ms = int(key_ttl_seconds * 1000)
        self.write_chunk = write_chunk
        self._write_timeout = write_timeout_seconds
        self._counters = CacheCounters(("reads", "entities", "missing", "stale", "errors",
                                        "short_circuits", "redirected_reads",
                                        "redirect_pipelines"))
        self._schemas: dict[str, dict[str, SnapshotMeta]] = {}
        self._served: set[str] = set()  # views this process has read a snapshot of
        self._lost = BurstLogger(logger, f"{self.link.what} data", fallback="serving defaults "
                                 "until the view is materialized again")

    def describe(self) -> str:
        return f"RedisStore({redact_url(self.url)!r}, cluster={self.cluster})"

    def keys(self, view_name: str) -> ViewKeys:
        if not VIEW_NAME.match(view_name):
            raise FeatureRequestError(f"invalid view name {view_name!r}")
        return ViewKeys(self.namespace, view_name)

    def admin_client(self) -> AnyRedis:
        """A client with batch-job timeouts (materialization and admin calls)."""
        return make_client(self.url, self.cluster, self._write_timeout, self._write_timeout,
                           self.link.tls)

    # -- reads ----------------------------------------------------------------------------

    def read(self, view_name: str, entity_ids: Sequence[str], *, now: float | None = None
             ) -> FeatureBatch:
        ids = check_entity_ids(entity_ids, self.max_entities_per_read)
        keys = self.keys(view_name)
        at = time.time() if now is None else now
        batch = self.link.call(lambda client: self._read(client, view_name, keys, ids, at),
                               lambda failure: self._failed_read(view_name, ids, failure))
        if batch.available:
            missing = int(np.count_nonzero(batch.mask(FeatureStatus.MISSING)))
            stale = int(np.count_nonzero(batch.mask(FeatureStatus.STALE)))
            self._counters.add(reads=1, entities=len(ids), missing=missing, stale=stale)
        return batch

    def _failed_read(self, view_name: str, ids: tuple[str, ...], failure: Failure
                     ) -> FeatureBatch:
        self._counters.add(reads=1, entities=len(ids), missing=len(ids),
                           errors=int(failure == "error"),
                           short_circuits=int(failure == "short_circuit"))
        return unavailable_batch(view_name, ids, self._fallback_view(view_name))

    def _read(self, client: AnyRedis, view_name: str, keys: ViewKeys, ids: tuple[str, ...],
              now: float) -> FeatureBatch:
        known = self._schemas.get(view_name, {})
        latest = next(reversed(known), "") if known else ""
        try:
            reply = _call_read_script(client, keys, latest, ids)
        except _SlotMoving:
            assert isinstance(client, RedisCluster)  # only a Cluster's slots move
            self._counters.add(redirected_reads=1)
            return self._read_each_key(client, view_name, keys, ids, now)
        if not reply:  # never materialized, or the pointer is gone (a restart that kept no
            # data, a delete by hand): lost data only where this process read a snapshot
            return self._no_data(view_name, ids, None, view_name in self._served)
        snapshot_id = _text(reply[0])
        if len(reply) == 1:  # the live snapshot's keys expired: its data is gone
            return self._no_data(view_name, ids, snapshot_id, True)
        meta = self._schema(view_name, snapshot_id, reply[1])
        if meta is None:  # schema evicted by racing readers: ask again with no known schema
            self._schemas.pop(view_name, None)
            return self._read(client, view_name, keys, ids, now)
        batch = _decode(meta, ids, reply[2], now)
        self._remember(meta.view, snapshot_id)
        self._served.add(view_name)
        return batch

    def _read_each_key(self, client: RedisCluster, view_name: str, keys: ViewKeys,
                       ids: tuple[str, ...], now: float) -> FeatureBatch:
        """The read of a view whose slot is moving: the pointer, then the snapshot's schema
        (parsed unless known) and its entities, each key read where it is now
        (``read_each_key``).

        Not atomic as the script is, and need not be: a snapshot's keys never change once it
        is live, and a flip between the pointer and the entities leaves the snapshot just read
        readable for ``grace_seconds``, as for any reader racing a flip."""
        pointer = _checked(self._read_keys(client, [("GET", keys.live)])[0])
        if pointer is None:
            return self._no_data(view_name, ids, None, view_name in self._served)
        snapshot_id = _text(pointer)
        # Read even when known, as the script checks it: a snapshot whose keys expired has
        # none, and is lost, not a healthy view of entities all missing.
        raw = _checked(self._read_keys(client, [("HGET", keys.meta(snapshot_id), "schema")])[0])
        if raw is None:
            return self._no_data(view_name, ids, snapshot_id, True)
        meta = self._schemas.get(view_name, {}).get(snapshot_id) or \
            self._schema(view_name, snapshot_id, raw)
        assert meta is not None  # a schema just read is never None
        fields = meta.view.feature_names + ([EVENT_FIELD] if meta.has_event_time else [])
        prefix = keys.entity_prefix(snapshot_id)
        rows = self._read_keys(client, [("HMGET", prefix + entity_id, *fields)
                                        for entity_id in ids])
        width = record_width(meta.view, meta.has_event_time)
        batch = _decode(meta, ids, b"".join(_record(row, width) for row in rows), now)
        self._remember(meta.view, snapshot_id)
        self._served.add(view_name)
        return batch

    def _read_keys(self, client: RedisCluster, commands: list[tuple[Any, ...]]) -> list[Any]:
        """``read_each_key``'s replies; the pipelines it took to follow redirects are counted
        (``redirect_pipelines``: one per node the moved keys are on, however many moved)."""
        reads = read_each_key(client, commands)
        self._counters.add(redirect_pipelines=reads.redirect_pipelines)
        return reads.replies

    def _no_data(self, view_name: str, ids: tuple[str, ...], snapshot_id: str | None,
                 lost: bool) -> FeatureBatch:
        """Defaults for a view with nothing to serve: a healthy answer for a view never
        materialized; a lost snapshot is unavailable (results say so and are not cached),
        not its features' real values."""
        if lost:
            self._counters.add(reads=1, entities=len(ids), missing=len(ids), errors=1)
            self._lost.error(FeatureStoreError(f"the data of feature view {view_name!r} is "
                                               f"gone (snapshot {snapshot_id})"))
        return unavailable_batch(view_name, ids, self._fallback_view(view_name), snapshot_id,
                                 not lost)

    def _schema(self, view_name: str, snapshot_id: str, raw: bytes | None) -> SnapshotMeta | None:
        known = self._schemas.setdefault(view_name, {})
        if raw is None:
            return known.get(snapshot_id)
        meta = SnapshotMeta.model_validate_json(raw)
        known = {sid: m for sid, m in known.items() if sid != snapshot_id}
        known[snapshot_id] = meta
        while len(known) > _SCHEMAS_KEPT:
            known.pop(next(iter(known)))
        self._schemas[view_name] = known  # replaced whole: readers iterate a stable dict
        return meta

    # -- request-path-safe checks ---------------------------------------------------------------

    def online_snapshot_id(self, view_name: str) -> str | None:
        """The live pointer through the request-path link (ms timeouts, behind the breaker);
        raises ``FeatureStoreError`` when the store cannot answer."""
        live = self.keys(view_name).live
        found = self.link.call(lambda client: (True, _read_one(client, ("GET", live))),
                               lambda failure: (False, failure))
        if not found[0]:
            raise FeatureStoreError(f"{self.link.what}: live pointer of {view_name!r} "
                                    f"unavailable ({found[1]!r})")
        return _text(found[1]) if found[1] is not None else None

    def online_view(self, view_name: str) -> FeatureView | None:
        """The live snapshot's view, read with the request-path timeouts (for load checks)."""
        snapshot_id = self.online_snapshot_id(view_name)
        if snapshot_id is None:
            return None
        meta_key = self.keys(view_name).meta(snapshot_id)
        found = self.link.call(lambda client: (True, _read_one(client, ("HGET", meta_key,
                                                                          "schema"))),
                               lambda failure: (False, failure))
        if not found[0] or found[1] is None:
            raise FeatureStoreError(f"{self.link.what}: schema of {view_name!r} unavailable")
        return SnapshotMeta.model_validate_json(found[1]).view

    def probe(self) -> bool:
        return self.link.probe()

    def view_names(self) -> list[str]:
        """Views with a live pointer in this namespace (one bounded SCAN; load time only)."""
        pattern = ViewKeys(self.namespace, "*").live
        found = self.link.call(
            lambda client: [_text(key) for key in client.scan_iter(match=pattern, count=1000)],
            lambda failure: [])
        names = {key.split("{", 1)[1].split("}", 1)[0] for key in found if "{" in key}
        return sorted(names | set(super().view_names()))

    # -- admin reads (the CLI, the job) ------------------------------------------------------

    def _admin_call(self, what: str, call: Any) -> Any:
        client = None
        try:
            client = self.admin_client()
            return call(client)
        except FeatureStoreError:
            raise
        except Exception as exc:
            raise FeatureStoreError(f"{what} failed on {redact_url(self.url)}: {exc}") from exc
        finally:
            if client is not None:
                client.close()

    def live_snapshot_id(self, view_name: str) -> str | None:
        keys = self.keys(view_name)
        value = self._admin_call("reading the live pointer", lambda c: c.get(keys.live))
        return _text(value) if value is not None else None

    def live_view(self, view_name: str) -> FeatureView | None:
        snapshot_id = self.live_snapshot_id(view_name)
        if snapshot_id is None:
            return None
        meta_key = self.keys(view_name).meta(snapshot_id)
        raw = self._admin_call("reading snapshot metadata", lambda c: c.hget(meta_key, "schema"))
        if raw is None:
            raise FeatureStoreError(f"live snapshot {snapshot_id} of {view_name!r} has expired")
        return SnapshotMeta.model_validate_json(raw).view

    def snapshot_ids(self, view_name: str) -> list[str]:
        keys = self.keys(view_name)
        ids = self._admin_call("listing snapshots", lambda c: c.zrange(keys.registry, 0, -1))
        return sorted(_text(value) for value in ids)

    # -- lifecycle ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {"backend": "redis", "cluster": self.cluster, **self._counters.snapshot(),
                **self.link.stats()}

    def close(self) -> None:
        self.link.close()


class _SlotMoving(Exception):
    """The view's slot is moving: a key the read script needs is on another node."""


def _call_read_script(client: AnyRedis, keys: ViewKeys, latest: str, ids: tuple[str, ...]
                      ) -> Any:
    """``READ_SCRIPT``'s reply, from the node holding every key it reads (one round trip);
    ``_SlotMoving`` when the view's slot is moving and no node holds them all.

    The script declares only the pointer: the entity keys depend on the snapshot id it reads.
    On a node whose slot is migrating away, a key of it that is not there (moved, or never
    written) fails the script ("non local key"). The node the slot is importing into runs it
    when asked (ASK), and there every key not moved yet would read as missing: the features
    of a read that looked complete. So the script is sent once and follows no redirect.
    Declaring every key instead would not help: Redis answers TRYAGAIN while they are split,
    for the whole move, and redis-py sleeps 50 ms before it gives up."""
    args = [keys.base, latest, *ids]
    if not isinstance(client, RedisCluster):
        return READ(client, [keys.live], args)
    client.RedisClusterRequestTTL = 1  # one attempt: an ASK or MOVED raises "TTL exhausted"
    try:
        return READ(client, [keys.live], args)
    except ClusterDownError:  # a cluster down is the breaker's to count
        raise
    except ClusterError as exc:
        raise _SlotMoving from exc
    except ResponseError as exc:
        if "non local key" in str(exc):
            raise _SlotMoving from exc
        raise


def _read_one(client: AnyRedis, command: tuple[Any, ...]) -> Any:
    """The reply of one single-key read; on a Cluster, read where the key is now (the
    client follows no redirect itself, see ``_call_read_script``)."""
    if isinstance(client, RedisCluster):
        return _checked(read_each_key(client, [command]).replies[0])
    return client.execute_command(*command)


def _record(values: Any, width: int) -> bytes:
    """One entity's ``HMGET`` as the script packs it: a presence byte then its fields' bytes,
    or zeros when the entity is not in the snapshot."""
    fields = _checked(values)
    if any(value is None for value in fields):
        return bytes(width + 1)
    return b"\x01" + b"".join(fields)


def _checked(reply: Any) -> Any:
    """``reply``, or its error raised (a key of another type under the view's keys fails the
    read, as it fails the script)."""
    if isinstance(reply, Exception):
        raise reply
    return reply


def _decode(meta: SnapshotMeta, ids: tuple[str, ...], records: bytes, now: float
            ) -> FeatureBatch:
    """The reply's fixed-width records (see ``redis_layout``) -> a batch."""
    layout = record_layout(meta.view, meta.has_event_time)
    if len(records) != len(ids) * layout.itemsize:
        raise FeatureStoreError(
            f"read reply holds {len(records)} bytes, expected {len(ids)} x {layout.itemsize}")
    packed = np.frombuffer(records, dtype=layout)
    found = packed["present"] == 1
    columns = {f.name: packed[f.name] for f in meta.view.features}
    times = packed[EVENT_FIELD] if meta.has_event_time else np.full(len(ids), meta.created_at)
    return assemble_batch(meta.view, ids, found, columns, np.asarray(times, dtype=np.float64),
                          meta.snapshot_id, now)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
