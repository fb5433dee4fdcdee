"""Sharded search: one router, one merge, two runtimes (in-process threads; Ray Serve in
``retrieval.sharding.ray_serve``, imported only on demand)."""

from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.local import LocalShards, ShardedRetriever, load_shards
from retrieval.sharding.merge import LateScores, Merged, merge_answers
from retrieval.sharding.router import RouterFeatures, ShardCalls, ShardRouter
from retrieval.sharding.shard import FinalHits, Shard, ShardAnswer, ShardQuery

__all__ = [
    "FinalHits",
    "LateScores",
    "LocalShards",
    "Merged",
    "RouterFeatures",
    "Shard",
    "ShardAnswer",
    "ShardCalls",
    "ShardQuery",
    "ShardRouter",
    "ShardUnavailableError",
    "ShardedRetriever",
    "load_shards",
    "merge_answers",
]
