"""Redis helpers of the feature store's batch side: node routing and Lua script calls.

Client construction, timeouts and the fail-open read live in ``retrieval.resilience``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from retrieval.resilience.redis_link import AnyRedis

__all__ = ["AnyRedis", "LuaScript", "node_client"]


def node_client(client: AnyRedis, key: str) -> redis.Redis:
    """The plain client of the node that owns ``key``'s slot (the client itself standalone).

    Batch work on one view (chunk writes, SCAN for garbage collection) talks to that node
    directly: every key of a view shares its slot.
    """
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)
        connection = node.redis_connection if node is not None else None
        if connection is None:
            raise redis.ConnectionError(f"no cluster node serves the slot of {key!r}")
        return connection
    return client


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
