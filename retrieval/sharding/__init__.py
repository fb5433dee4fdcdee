"""Sharded search: a sharded build opened by ``Retriever.load`` is one build whose parts fan out
to its shards in this process (``whole``); served by Ray Serve deployments, the parts are calls
to them (``retrieval.sharding.ray_serve``, imported only on demand: ``Retriever.connect``)."""

from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.whole import ShardedBuild, open_build

__all__ = ["ShardUnavailableError", "ShardedBuild", "open_build"]
