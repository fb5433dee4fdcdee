"""Redis key layout, record format and Lua scripts of ``RedisStore`` (shared by the online
reads and the offline writer).

Keys of one view (every key carries the view's hash tag, so in a Cluster they all live in one
slot and a single script may touch them all)::

    <ns>:fs1:{<view>}:live                 the live snapshot id (no TTL)
    <ns>:fs1:{<view>}:snapshots            ZSET snapshot id -> created_at (every started job)
    <ns>:fs1:{<view>}:retired              HASH snapshot id -> time it stopped being live
    <ns>:fs1:{<view>}:s:<snapshot>:meta    HASH fields (comma list), width (record bytes),
                                           schema (SnapshotMeta JSON)
    <ns>:fs1:{<view>}:s:<snapshot>:e:<id>  HASH feature name -> value, "_t" -> event time

Values are little-endian binary (float32 4 bytes, float64/int64 8, bool 1), so a read's records
have a fixed width and decode with one ``np.frombuffer`` instead of thousands of float parses.
Snapshot and meta keys expire (TTL set by the same script call that writes them).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np
from redis.exceptions import NoScriptError

from retrieval.features.view import WIRE_DTYPES, FeatureView

if TYPE_CHECKING:
    from retrieval.resilience.redis_link import AnyRedis

EVENT_FIELD = "_t"  # feature names start with a letter, so this never collides
KEY_VERSION = "fs1"


class ViewKeys:
    """Key builders of one view."""

    def __init__(self, namespace: str, view_name: str) -> None:
        self.base = f"{namespace}:{KEY_VERSION}:{{{view_name}}}"
        self.live = f"{self.base}:live"
        self.registry = f"{self.base}:snapshots"
        self.retired = f"{self.base}:retired"

    def snapshot(self, snapshot_id: str) -> str:
        return f"{self.base}:s:{snapshot_id}"

    def meta(self, snapshot_id: str) -> str:
        return f"{self.snapshot(snapshot_id)}:meta"

    def entity_prefix(self, snapshot_id: str) -> str:
        return f"{self.snapshot(snapshot_id)}:e:"


# One round trip, one snapshot: the pointer and every entity are read inside one atomic script,
# so a flip (or a garbage collection) can never land between them. The entity keys depend on
# the snapshot id read here, so they cannot be passed in KEYS; they share the pointer's hash
# tag, i.e. its slot, so the node of the pointer holds them all (scripts replicate by
# effects), except while a reshard moves that slot: ``redis_store`` then reads key by key.
# The values come back as ONE bulk string of fixed-width records (a presence byte, then each
# field's bytes in the meta's order): building a 6,000-element reply for 1,000 entities costs
# the server several times more than one concatenation, and the client decodes the blob with a
# single np.frombuffer.
# KEYS[1] live pointer; ARGV[1] view key base; ARGV[2] snapshot id whose schema the caller
# already holds ("" for none); ARGV[3..] entity ids.
# Reply: {} no live snapshot | {snap} its meta is gone | {snap, schema|nil, records}.
READ_SCRIPT = """
local snap = redis.call('GET', KEYS[1])
if not snap then return {} end
local base = ARGV[1] .. ':s:' .. snap
local meta = redis.call('HMGET', base .. ':meta', 'fields', 'schema', 'width')
if not meta[1] then return {snap} end
local fields = {}
for name in string.gmatch(meta[1], '[^,]+') do fields[#fields + 1] = name end
local nf = #fields
local absent = string.rep('\\0', tonumber(meta[3]) + 1)
local prefix = base .. ':e:'
local parts = {}
for i = 3, #ARGV do
  local values = redis.call('HMGET', prefix .. ARGV[i], unpack(fields))
  local record = absent
  if values[nf] and values[1] then record = '\\1' .. table.concat(values) end
  parts[i - 2] = record
end
local schema = false
if ARGV[2] ~= snap then schema = meta[2] end
return {snap, schema, table.concat(parts)}
"""

# Writes one chunk: HSET and PEXPIRE of each entity in the same call, so no key is ever left
# without its TTL even if the job is killed. HSET of a fresh key reports every field as new;
# a report of 0 means the id was already written to this snapshot: a duplicate in the source.
# KEYS entity keys; ARGV[1] ttl ms; ARGV[2] number of fields F; ARGV[3..2+F] field names;
# then the values field-major (all entities' field 1, then field 2, ...).
# Reply: 0, or the 1-based position of the first duplicate.
WRITE_SCRIPT = """
local nf = tonumber(ARGV[2])
local n = #KEYS
local args = {}
for i = 1, n do
  for j = 1, nf do
    args[2 * j - 1] = ARGV[2 + j]
    args[2 * j] = ARGV[2 + nf + (j - 1) * n + i]
  end
  if redis.call('HSET', KEYS[i], unpack(args)) == 0 then return i end
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return 0
"""

# Publishes a complete snapshot atomically. Refuses a snapshot that garbage collection has
# already removed from the registry (a job running longer than the grace period).
# KEYS[1] live, KEYS[2] registry, KEYS[3] retired, KEYS[4] meta of the new snapshot;
# ARGV[1] snapshot id, ARGV[2] now, ARGV[3] final schema JSON. Reply: the previous live id.
FLIP_SCRIPT = """
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return redis.error_reply('snapshot ' .. ARGV[1] .. ' is no longer registered (collected)')
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  return redis.error_reply('snapshot ' .. ARGV[1] .. ' has no metadata (expired)')
end
redis.call('HSET', KEYS[4], 'schema', ARGV[3])
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1])
if old and old ~= ARGV[1] then redis.call('HSET', KEYS[3], old, ARGV[2]) end
redis.call('HDEL', KEYS[3], ARGV[1])
return old
"""


def record_layout(view: FeatureView, has_event_time: bool) -> np.dtype:
    """The packed record of one entity in a read reply: presence byte, then every field."""
    fields = [("present", "u1")] + [(f.name, WIRE_DTYPES[f.dtype]) for f in view.features]
    if has_event_time:
        fields.append((EVENT_FIELD, np.dtype("<f8")))
    return np.dtype(fields)


def record_width(view: FeatureView, has_event_time: bool) -> int:
    """Bytes of the fields of one record (without the presence byte)."""
    return record_layout(view, has_event_time).itemsize - 1


class LuaScript:
    """A Lua script called by SHA, loaded on demand (``NOSCRIPT`` falls back to ``EVAL``)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()

    def __call__(self, client: AnyRedis, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # EVAL also caches the script on that node, so the next call hits EVALSHA.
            return client.eval(self.source, len(keys), *keys, *args)
