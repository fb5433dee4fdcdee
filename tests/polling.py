"""Waiting in tests for something a background thread does (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
