"""Errors of sharded search (drawn in the tree of ``indexes.errors``)."""

from __future__ import annotations

from indexes.errors import RetrievalError


class ShardUnavailableError(RetrievalError):
    """A shard has no live replica to answer; ``shard`` names it.

    Retry later, add replicas, or configure partial answers (``allow_partial=True``): the
    other shards then answer and the result is flagged ``partial:<shard>`` in ``degraded``.
    """

    def __init__(self, message: str, shard: str) -> None:
        super().__init__(message)
        self.shard = shard
