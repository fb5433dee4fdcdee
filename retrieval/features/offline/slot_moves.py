"""Waiting out a reshard of a view's Redis Cluster slot, for the nightly job's writes.

A reshard moves a slot key by key (``redis-cli --cluster reshard`` migrates 10 keys a round
trip: about 7 s per 100,000 entities on loopback, so a minute or more for a view near its
size limit). Until the move ends the view's keys are split between two nodes, and none of
the writer's steps can run: each declares several keys or writes new ones (the registration
transaction, a chunk script, the flip). The old node answers ASK (none of the keys is there)
or TRYAGAIN (some are), the new node TRYAGAIN to a command whose keys are not all there yet,
and once the move has ended the old node answers MOVED. The writer talks to the slot's node
with a plain client, which follows none of these: a job met by a reshard failed at once and
had to start over.

``ViewNode.run`` sends a step again, on the slot's current owner, until it runs: at once
after a MOVED, else after a pause that doubles up to a second, for at most
``slot_move_wait_seconds`` (then ``FeatureStoreError``). A step that met the move did not
run (a script or a transaction runs whole or not at all), and a step made of several (a
pipeline of chunk scripts) sends again only those that did not run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.cluster import RedisCluster, key_slot
from redis.exceptions import AskError, MovedError, TryAgainError

from retrieval.features.errors import FeatureStoreError
from retrieval.resilience.redis_link import AnyRedis

logger = logging.getLogger(__name__)
T = TypeVar("T")
SLOT_MOVING = (AskError, TryAgainError)  # a MovedError is an AskError
FIRST_PAUSE_SECONDS = 0.05
LONGEST_PAUSE_SECONDS = 1.0


class ViewNode:
    """The node that owns one view's slot, followed while a reshard moves it."""

    def __init__(self, client: AnyRedis, key: str, view_name: str, wait_seconds: float,
                 on_new_node: Callable[[redis.Redis], object]) -> None:
        self.client = client
        self.key = key
        self.slot = key_slot(key.encode("utf-8"))
        self.view_name = view_name
        self.wait_seconds = wait_seconds
        self.on_new_node = on_new_node  # e.g. load the scripts the steps call by SHA
        self.node = owner_client(client, key)
        on_new_node(self.node)

    def run(self, step: Callable[[redis.Redis], T]) -> T:
        """``step(node)``'s result, sent again while it raises one of ``SLOT_MOVING``."""
        wait: _Wait | None = None
        while True:
            try:
                result = step(self.node)
            except SLOT_MOVING as exc:
                wait = wait or _Wait(self.wait_seconds)
                self._before_next_try(exc, wait)
                continue
            if wait is not None and wait.announced:
                logger.info("feature view %r: slot %d settled after %.1f s; going on",
                            self.view_name, self.slot, wait.elapsed())
            return result

    def _before_next_try(self, exc: redis.RedisError, wait: _Wait) -> None:
        """Fail once the wait is over; else go to the slot's new owner after a MOVED (the
        move has ended: at once the first time, after a pause if nodes keep sending the step
        on, as in a topology still settling after a failover), or pause, announcing the wait
        before its first pause (every try of a move answers alike: once is enough)."""
        if wait.expired():
            raise self._outlasted(exc) from exc
        if isinstance(exc, MovedError) and self._follow(exc) and not wait.followed:
            wait.followed = True
            return
        if not wait.announced:
            self._announce(exc)
            wait.announced = True
        wait.pause()

    def _follow(self, moved: MovedError) -> bool:
        """Take the slot's new owner from ``moved``, as redis-py records a MOVED it follows;
        False when that is the node already asked (nothing to gain by asking it at once)."""
        if isinstance(self.client, RedisCluster):
            self.client.nodes_manager.move_slot(moved)
        node = owner_client(self.client, self.key)
        if node is self.node:
            return False
        self.node = node
        self.on_new_node(node)
        return True

    def _announce(self, exc: redis.RedisError) -> None:
        logger.warning(
            "feature view %r: its Redis Cluster slot %d is moving between nodes (a reshard: "
            "%s); waiting up to %g s (feature store setting slot_move_wait_seconds) for the "
            "move to end before going on", self.view_name, self.slot, _first_word(exc),
            self.wait_seconds)

    def _outlasted(self, exc: redis.RedisError) -> FeatureStoreError:
        return FeatureStoreError(
            f"feature view {self.view_name!r}: its Redis Cluster slot {self.slot} was still "
            f"moving between nodes (a reshard; Redis answered {_first_word(exc)}) after "
            f"{self.wait_seconds:g} s, the longest a write waits for it (feature store setting "
            "slot_move_wait_seconds); nothing was published and the previous snapshot stays "
            "live. Run the job again once the reshard has ended, or raise "
            "slot_move_wait_seconds above how long the move takes")


class _Wait:
    """One wait for a moving slot: its deadline and its doubling pauses."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + seconds
        self.next_pause = FIRST_PAUSE_SECONDS
        self.announced = False
        self.followed = False  # a MOVED followed at once already: later ones pause first

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def pause(self) -> None:
        """Sleep the next pause, never past the deadline."""
        time.sleep(max(0.0, min(self.next_pause, self.deadline - time.monotonic())))
        self.next_pause = min(2 * self.next_pause, LONGEST_PAUSE_SECONDS)


def owner_client(client: AnyRedis, key: str) -> redis.Redis:
    """The plain client of the node that owns ``key``'s slot in ``client``'s slot table (the
    client itself standalone)."""
    if not isinstance(client, RedisCluster):
        return client
    node = client.get_node_from_key(key)
    if node is None:
        raise redis.ConnectionError(f"no cluster node serves the slot of {key!r}")
    return client.get_redis_connection(node)  # a node a MOVED named may have no client yet


def _first_word(exc: redis.RedisError) -> str:
    """ASK, MOVED or TRYAGAIN: what Redis answered, without redis-py's pipeline wording."""
    if isinstance(exc, MovedError):
        return "MOVED"
    return "ASK" if isinstance(exc, AskError) else "TRYAGAIN"
