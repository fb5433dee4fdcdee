"""Sharded search: a sharded build opened by ``Retriever.load`` is one build whose parts fan out
to its shards (``whole``); on Ray Serve a router fans out to shard deployments
(``retrieval.sharding.ray_serve``, imported only on demand)."""

from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.local import LocalShards, load_shards
from retrieval.sharding.merge import LateScores, Merged, merge_answers
from retrieval.sharding.router import RouterFeatures, ShardCalls, ShardRouter
from retrieval.sharding.shard import FinalHits, Shard, ShardAnswer, ShardQuery
from retrieval.sharding.whole import ShardedBuild, open_build

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
    "ShardedBuild",
    "load_shards",
    "merge_answers",
    "open_build",
]
