"""A per-search time budget: what is left of it decides whether a stage waits or degrades."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Deadline:
    """``budget_ms`` from creation on ``clock`` (seconds), less ``spent_ms`` already spent
    (waiting for a thread); None = no deadline.

    Stages ask ``remaining()`` (seconds, never negative; None without a deadline) for how long
    they may wait, and ``expired()`` whether to skip work that can be skipped.
    """

    __slots__ = ("_clock", "_end")

    def __init__(self, budget_ms: float | None,
                 clock: Callable[[], float] = time.perf_counter, spent_ms: float = 0.0) -> None:
        self._clock = clock
        self._end = None if budget_ms is None else clock() + (budget_ms - spent_ms) / 1e3

    @property
    def active(self) -> bool:
        return self._end is not None

    def remaining(self) -> float | None:
        if self._end is None:
            return None
        return max(0.0, self._end - self._clock())

    def expired(self) -> bool:
        return self._end is not None and self._clock() >= self._end


NO_DEADLINE = Deadline(None)
# The deadline of the search running in this context (``within``): for what the request
# path reaches only through an index's methods, as the calls to Ray shard deployments.
CURRENT: ContextVar[Deadline] = ContextVar("retrieval_deadline", default=NO_DEADLINE)


@contextmanager
def within(deadline: Deadline) -> Iterator[None]:
    """``deadline`` as this context's ``CURRENT`` while the block runs."""
    token = CURRENT.set(deadline)
    try:
        yield
    finally:
        CURRENT.reset(token)


class DeadlineBound:
    """Mixed into an error class whose failures a search's own deadline may cause: a wait on
    another machine (a Ray shard's answer) cut short when the budget ran out, where the
    other side may only be slower than that budget. ``by_deadline`` says whether this one
    was; each instance sets it (``False``: a failure of its own, another search would meet
    it too)."""

    by_deadline: bool = False


def caused_by_deadline(error: BaseException) -> bool:
    """Whether ``error`` is a failure its search's deadline caused (``DeadlineBound``): a
    search with more time left may not meet it, so it is not to be shared with one
    (``RequestPath``'s single flight)."""
    return isinstance(error, DeadlineBound) and error.by_deadline
