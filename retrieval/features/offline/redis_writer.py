"""Materialization into Redis: chunked writes, the atomic flip, garbage collection.

The writer talks to the node that owns the view's slot with generous timeouts: a batch job
should fail loudly on errors (``FeatureStoreError``), not fail open like the request path.
A failed job leaves the previous snapshot live (the pointer is only flipped by ``commit``);
``abort`` removes what it wrote, and a killed job's keys expire by TTL or are collected by the
next job once older than the grace period. A reshard moving the view's slot is waited out
(``slot_moves``): each step is sent again, where the slot is, once it can run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import redis

from indexes.storage import mint_id
from retrieval.features.errors import FeatureSchemaError, FeatureStoreError
from retrieval.features.offline.slot_moves import SLOT_MOVING, ViewNode
from retrieval.features.offline.writer_base import (
    SnapshotWriter,
    snapshots_to_delete,
)
from retrieval.features.reads import FeatureColumns
from retrieval.features.redis_layout import (
    EVENT_FIELD,
    FLIP_SCRIPT,
    WRITE_SCRIPT,
    LuaScript,
    ViewKeys,
    record_width,
)
from retrieval.features.view import WIRE_DTYPES, FeatureView, SnapshotMeta
from retrieval.resilience.redis_link import AnyRedis

logger = logging.getLogger(__name__)
WRITE = LuaScript(WRITE_SCRIPT)
FLIP = LuaScript(FLIP_SCRIPT)
SCRIPTS_PER_ROUND_TRIP = 8  # pipelined chunk scripts: fewer round trips, bounded replies


def encode_field(values: np.ndarray, dtype: str) -> list[bytes]:
    """One little-endian bytes value per entity (``V`` views keep trailing zero bytes)."""
    wire = WIRE_DTYPES[dtype]
    return list(np.ascontiguousarray(values, dtype=wire).view(f"V{wire.itemsize}").tolist())




class RedisWriter(SnapshotWriter):
    """Writes one snapshot of ``view``; see the module docstring."""

    def __init__(self, client: AnyRedis, keys: ViewKeys, view: FeatureView, created_at: float,
                 has_event_time: bool, ttl_ms: int, chunk: int, grace_seconds: float,
                 slot_move_wait_seconds: float) -> None:
        self.client = client
        self.keys = keys
        self.view = view
        self.created_at = created_at
        self.has_event_time = has_event_time
        self.ttl_ms = ttl_ms
        self.chunk = chunk
        self.grace_seconds = grace_seconds
        self.snapshot_id = mint_id(created_at)  # the same ids as index builds
        self.fields = view.feature_names + ([EVENT_FIELD] if has_event_time else [])
        self.rows = 0
        self.published = False
        self.prefix = keys.entity_prefix(self.snapshot_id)
        try:
            self.at = self._guard(lambda: ViewNode(
                client, keys.live, view.name, slot_move_wait_seconds,
                lambda node: node.script_load(WRITE.source)))  # chunks call it by SHA
            self._guard(lambda: self.at.run(self._register))
        except BaseException:
            client.close()  # no writer is returned, so nobody else would close it
            raise

    @property
    def node(self) -> redis.Redis:
        """The client of the node that owns the view's slot now."""
        return self.at.node

    def _guard(self, call: Any) -> Any:
        try:
            return call()
        except redis.RedisError as exc:
            raise FeatureStoreError(
                f"redis failed while materializing view {self.view.name!r} "
                f"(snapshot {self.snapshot_id}): {type(exc).__name__}: {exc}"
            ) from exc

    def _meta(self) -> SnapshotMeta:
        return SnapshotMeta(snapshot_id=self.snapshot_id, view=self.view,
                            created_at=self.created_at, rows=self.rows,
                            has_event_time=self.has_event_time)

    def _register(self, node: redis.Redis) -> None:
        """Registry entry (for GC) and metadata first, then data; all in the view's slot."""
        meta_key = self.keys.meta(self.snapshot_id)
        pipe = node.pipeline(transaction=True)
        pipe.zadd(self.keys.registry, {self.snapshot_id: self.created_at})
        pipe.hset(meta_key, mapping={"fields": ",".join(self.fields), "width": record_width(
            self.view, self.has_event_time), "schema": self._meta().model_dump_json()})
        pipe.pexpire(meta_key, self.ttl_ms)
        pipe.execute()

    def write(self, columns: FeatureColumns) -> None:
        encoded = [encode_field(columns.values[f.name], f.dtype) for f in self.view.features]
        if self.has_event_time:
            assert columns.event_time is not None  # materialize passes it whenever declared
            encoded.append(encode_field(columns.event_time, "float64"))
        ids = columns.entity_ids
        starts = list(range(0, len(ids), self.chunk))
        for group in range(0, len(starts), SCRIPTS_PER_ROUND_TRIP):
            unsent = starts[group:group + SCRIPTS_PER_ROUND_TRIP]
            self._guard(lambda chunks=unsent: self.at.run(
                lambda node: self._write_chunks(node, ids, encoded, chunks)))
        self.rows += len(ids)

    def _write_chunks(self, node: redis.Redis, ids: list[str], encoded: list[list[bytes]],
                      unsent: list[int]) -> None:
        """Send the chunks starting at ``unsent`` in one pipeline and drop those that ran from
        it; raise the slot move any other met, for ``ViewNode.run`` to send them again. Never
        a chunk twice: its second HSETs would read as duplicate ids."""
        pipe = node.pipeline(transaction=False)
        header = [self.ttl_ms, len(self.fields), *self.fields]
        for start in unsent:
            stop = start + self.chunk
            keys = [self.prefix + entity_id for entity_id in ids[start:stop]]
            args: list[Any] = list(header)
            for column in encoded:
                args.extend(column[start:stop])
            pipe.evalsha(WRITE.sha, len(keys), *keys, *args)
        moving: list[tuple[int, redis.RedisError]] = []
        for start, reply in zip(unsent, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, SLOT_MOVING):
                moving.append((start, reply))
            elif isinstance(reply, Exception):
                raise reply
            elif reply:
                self._refuse_duplicate(ids[start + int(reply) - 1])
        unsent[:] = [start for start, _ in moving]
        if moving:
            raise moving[0][1]

    def _refuse_duplicate(self, entity_id: str) -> None:
        raise FeatureSchemaError(
            f"entity id {entity_id!r} appears more than once in column "
            f"{self.view.entity_key!r}; a snapshot holds one row per document "
            "(deduplicate the source, e.g. keep the latest row)",
            self.view.entity_key,
        )

    def commit(self) -> list[str]:
        meta = self.keys.meta(self.snapshot_id)
        keys = [self.keys.live, self.keys.registry, self.keys.retired, meta]
        args = [self.snapshot_id, repr(time.time()), self._meta().model_dump_json()]
        try:
            self._guard(lambda: self.at.run(lambda node: FLIP(node, keys, args)))
            self.published = True
            try:
                return collect_garbage(self.node, self.keys, self.grace_seconds)
            except redis.RedisError as exc:  # published already: a failed cleanup is not fatal
                logger.warning("garbage collection of view %r failed: %s", self.view.name, exc)
                return []
        finally:
            self.client.close()

    def abort(self) -> None:
        if self.published:  # never delete a snapshot that readers may be using
            return
        try:
            if _text(self.node.get(self.keys.live) or b"") == self.snapshot_id:
                return  # the flip went through even though its reply was lost
            self.node.zrem(self.keys.registry, self.snapshot_id)
            delete_snapshot(self.node, self.keys, self.snapshot_id)
        except Exception:  # best effort: the TTL removes what this could not
            pass
        finally:
            self.client.close()


def collect_garbage(node: redis.Redis, keys: ViewKeys, grace_seconds: float,
                    now: float | None = None) -> list[str]:
    """Delete the view's snapshots past the grace period; returns their ids."""
    pipe = node.pipeline(transaction=True)
    pipe.zrange(keys.registry, 0, -1, withscores=True)
    pipe.hgetall(keys.retired)
    pipe.get(keys.live)
    registry, retired, live = pipe.execute()
    created = {_text(sid): float(score) for sid, score in registry}
    retired_at = {_text(sid): float(at) for sid, at in retired.items()}
    doomed = snapshots_to_delete(created, retired_at, _text(live) if live else None,
                                 time.time() if now is None else now, grace_seconds)
    for sid in doomed:
        # Unregister first: a job still writing this snapshot then cannot publish it.
        pipe = node.pipeline(transaction=True)
        pipe.zrem(keys.registry, sid)
        pipe.hdel(keys.retired, sid)
        pipe.execute()
        delete_snapshot(node, keys, sid)
    return doomed


def delete_snapshot(node: redis.Redis, keys: ViewKeys, snapshot_id: str, batch: int = 1000
                    ) -> int:
    """UNLINK every key of one snapshot (found by SCAN on the node owning the view's slot)."""
    deleted = 0
    pending: list[bytes] = []
    for key in node.scan_iter(match=f"{keys.snapshot(snapshot_id)}:*", count=batch):
        pending.append(key)
        if len(pending) >= batch:
            deleted += int(node.unlink(*pending))
            pending = []
    if pending:
        deleted += int(node.unlink(*pending))
    return deleted


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
