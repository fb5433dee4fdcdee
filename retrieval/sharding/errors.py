"""Errors of sharded search (drawn in the tree of ``indexes.errors``)."""

from __future__ import annotations

from indexes.errors import RetrievalError
from retrieval.request_path.deadline import DeadlineBound


class ShardUnavailableError(RetrievalError, DeadlineBound):
    """A shard has no live replica to answer; ``shard`` names it.

    Retry later, add replicas, or configure partial answers (``allow_partial=True``): the
    other shards then answer and the result is flagged ``partial:<shard>`` in ``degraded``.
    ``by_deadline``: the search's deadline ended the wait before the shard calls' own
    ``timeout_seconds`` / ``retry_seconds`` did; the shard may be alive, only slower than
    that budget (a search with more time left may get its answer).
    """

    def __init__(self, message: str, shard: str, by_deadline: bool = False) -> None:
        super().__init__(message)
        self.shard = shard
        self.by_deadline = by_deadline
