"""redis-py client construction and script calls shared by the Redis store's reader and writer."""

from __future__ import annotations

import hashlib
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from redis.retry import Retry

AnyRedis = redis.Redis | RedisCluster


def make_client(url: str, cluster: bool, socket_timeout_s: float, connect_timeout_s: float
                ) -> AnyRedis:
    """A client with bounded timeouts and no client-side retries.

    No retries: on the request path a retry doubles the worst case (the breaker and the next
    request are the retry); in a batch job the scheduler re-runs the whole job. RESP2 and no
    CLIENT SETINFO keep a reconnect to a bare handshake, as in ``retrieval.cache``.
    """
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "driver_info": None,
        "decode_responses": False,
    }
    if cluster:
        # require_full_coverage=False: a view lives in one slot; serve it while others are down.
        return RedisCluster.from_url(url, require_full_coverage=False, **options)
    return redis.Redis.from_url(url, **options)


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
