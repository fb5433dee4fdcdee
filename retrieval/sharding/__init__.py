"""Sharded search: one router, one merge, two runtimes (in-process threads; Ray Serve in
``retrieval.sharding.ray_serve``, imported only on demand)."""

from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.local import LocalShards, ShardedRetriever, load_shards
from retrieval.sharding.merge import merge_answers
from retrieval.sharding.router import ShardCalls, ShardRouter
from retrieval.sharding.shard import HitRequest, Shard, ShardAnswer

__all__ = [
    "HitRequest",
    "LocalShards",
    "Shard",
    "ShardAnswer",
    "ShardCalls",
    "ShardRouter",
    "ShardUnavailableError",
    "ShardedRetriever",
    "load_shards",
    "merge_answers",
]
