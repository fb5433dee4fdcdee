"""Reading single keys of a Redis Cluster wherever each key is, while a reshard moves them.

A reshard moves a slot key by key; until it ends, a multi-key command (an ``MGET``, a script's
keys) of that slot is answered TRYAGAIN, while a single-key command is answered where its key
is: the old node, or an ASK / MOVED redirect to the new one. ``read_each_key`` sends such
reads (the caches' Cluster read, the feature store's key-by-key read) in a few round trips
however many keys moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.cluster import ClusterNode, ClusterPipeline, PipelineCommand, RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["EachKeyReplies", "is_unreachable", "read_each_key"]


class EachKeyReplies(NamedTuple):
    """``read_each_key``'s answer: a reply per command, and the pipelines it took to follow
    the redirects of those whose key was elsewhere (``redirect_pipelines`` in stats)."""

    replies: list[Any]
    redirect_pipelines: int


def read_each_key(client: RedisCluster, commands: Sequence[tuple[Any, ...]]) -> EachKeyReplies:
    """The replies of single-key read ``commands`` (``("HMGET", key, field, ...)``), each
    read where its key is: MOVED to its new node, or ASK (with ASKING) to the node a migrating
    slot's key has already moved to. The way to read keys of a moving slot correctly: only a
    multi-key command (an ``MGET``, a script's keys) is answered TRYAGAIN while its keys are
    split between two nodes.

    A few round trips however many keys moved: one pipeline where the slot table says each
    key is, then one per node the redirects point to. redis-py's pipeline follows each
    redirect alone instead, two or three round trips a key (1,000 keys, half moved: ~1,500).
    What is still not answered after that (a node unreachable, a redirect to a node this
    client does not know yet) is left to redis-py, as before.

    A key's own error comes back as its reply (an exception); an unreachable node fails the
    read, as a cache write's does, so the breaker counts it. Also used by the feature store."""
    replies = _send_unfollowed(client, commands)
    targets = _redirect_targets(client, replies)
    for node, positions in targets.values():
        for position, reply in zip(positions, _send_asking(client, node, commands, positions),
                                   strict=True):
            replies[position] = reply
    left = [i for i, reply in enumerate(replies)
            if isinstance(reply, ClusterPipeline.ERRORS_ALLOW_RETRY)]
    if left:  # rare: redis-py follows these itself, one command at a time
        for position, reply in zip(left, _send_followed(client, commands, left), strict=True):
            replies[position] = reply
    unreachable = next((r for r in replies if is_unreachable(r)), None)
    if unreachable is not None:
        raise unreachable
    return EachKeyReplies(replies, len(targets) + bool(left))


def _send_unfollowed(client: RedisCluster, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """One cluster pipeline (one round trip per node, all nodes at once) that hands back a
    redirect as the command's reply (an ``AskError`` or ``MovedError``) instead of following
    it. ``send_cluster_commands`` is the pipeline's own sender; ``execute`` always follows."""
    stack = [PipelineCommand(command, {}, position) for position, command in enumerate(commands)]
    pipe = client.pipeline(transaction=False)
    return list(pipe.send_cluster_commands(stack, raise_on_error=False, allow_redirections=False))


def _redirect_targets(client: RedisCluster, replies: list[Any]
                      ) -> dict[str, tuple[ClusterNode, list[int]]]:
    """The nodes the redirected replies point to, by name, each with those replies'
    positions. A node this client does not know (new, or behind an address remap) is left
    out: redis-py finds it when it follows that redirect itself."""
    targets: dict[str, tuple[ClusterNode, list[int]]] = {}
    for position, reply in enumerate(replies):
        if not isinstance(reply, AskError):  # a MovedError is an AskError too
            continue
        node = client.get_node(host=reply.host, port=reply.port)
        if node is None:
            continue
        if isinstance(reply, MovedError):  # the slot's new owner, for every later read too,
            client.nodes_manager.move_slot(reply)  # as redis-py records a MOVED it follows
        targets.setdefault(node.name, (node, []))[1].append(position)
    return targets


def _send_asking(client: RedisCluster, node: ClusterNode, commands: Sequence[tuple[Any, ...]],
                 positions: list[int]) -> list[Any]:
    """The replies of ``commands`` at ``positions`` from ``node``, in one pipeline. ASKING
    before each: a node importing a slot answers for a key of it only right after one (ASK);
    the slot's owner (MOVED) answers either way. A node that cannot be reached answers each
    with its error, for redis-py to retry."""
    pipe = client.get_redis_connection(node).pipeline(transaction=False)
    for position in positions:
        pipe.execute_command("ASKING")
        pipe.execute_command(*commands[position])
    try:
        return list(pipe.execute(raise_on_error=False))[1::2]
    except (RedisConnectionError, RedisTimeoutError) as exc:
        return [exc] * len(positions)


def _send_followed(client: RedisCluster, commands: Sequence[tuple[Any, ...]],
                   positions: list[int]) -> list[Any]:
    """The replies of ``commands`` at ``positions`` through redis-py's pipeline, which
    retries an unreachable node's commands and follows every redirect itself (refreshing the
    slot table, remapping addresses): the cluster pipeline's ``execute``."""
    pipe = client.pipeline(transaction=False)
    for position in positions:
        pipe.execute_command(*commands[position])
    return list(pipe.execute(raise_on_error=False))


def is_unreachable(result: Any) -> bool:
    """A node or the cluster not serving (a read of its keys fails whole, and feeds the
    breaker), as opposed to one key's own error."""
    return isinstance(result, (RedisConnectionError, RedisTimeoutError, ClusterDownError))
