"""Circuit breaker and burst-suppressed error logging for a remote dependency (cache, store).

An outage must cost the request path (almost) nothing: once ``failures_to_open``
consecutive calls have failed the breaker opens and callers skip the backend entirely. After
``cooldown_seconds`` exactly one probe call is let through (half-open); its success closes the
breaker, its failure re-opens it for another cooldown. ``record_failure`` says when a call
tripped a closed breaker, so the caller can log the outage once, when it starts (a failed
probe re-opening the breaker is the same outage).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from retrieval.errors import ConfigError

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Thread-safe consecutive-failure breaker with a single half-open probe."""

    def __init__(
        self,
        failures_to_open: int = 5,
        cooldown_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures_to_open < 1:
            raise ConfigError(f"breaker failures_to_open must be >= 1, got {failures_to_open}")
        if not cooldown_seconds > 0:
            raise ConfigError(f"breaker cooldown_seconds must be > 0, got {cooldown_seconds}")
        self.failures_to_open = failures_to_open
        self.cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probe: int | None = None  # the thread granted the half-open probe
        self.opens = 0
        self.short_circuits = 0

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """May the caller use the backend now? Every ``True`` must be followed by a record_*."""
        # Lock-free fast path: reading one attribute is atomic and closed is the common case.
        if self._state == "closed":
            return True
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open" and self._clock() - self._opened_at >= self.cooldown_seconds:
                self._state = "half_open"  # this caller is the single probe
                self._probe = threading.get_ident()
                return True
            self.short_circuits += 1
            return False

    def record_success(self) -> None:
        """The backend answered: close (a success proves it is reachable again)."""
        if self._state == "closed" and self._failures == 0:
            return
        with self._lock:
            self._state = "closed"
            self._failures = 0

    def record_failure(self) -> bool:
        """The backend failed: count it; open on threshold or when the probe failed.

        True when this failure tripped a closed breaker (a new outage), False otherwise.
        """
        with self._lock:
            self._failures += 1
            tripped = self._state == "closed" and self._failures >= self.failures_to_open
            if tripped or self._state == "half_open":
                self._state = "open"
                self._opened_at = self._clock()
                self.opens += 1
            return tripped

    def record_skip(self) -> None:
        """An allowed caller did not reach the backend after all (the connect it waited for,
        another caller's, did not come; that caller counts the failure): a short circuit. A
        half-open probe hands its turn back (the cool-down is over: the next caller probes)."""
        with self._lock:
            self.short_circuits += 1
            # Only the probe's own skip: another caller's (let in before the breaker opened)
            # would end a probe still in flight and let a second one in.
            if self._state == "half_open" and self._probe == threading.get_ident():
                self._state = "open"

    def stats(self) -> dict[str, object]:
        return {
            "breaker_state": self._state,
            "breaker_opens": self.opens,
            "short_circuits": self.short_circuits,
        }


class BurstLogger:
    """At most one WARNING per ``quiet_seconds``: the first error of a burst, then silence.

    A dead cache fails every request; logging each one would flood the logs and cost latency.
    Errors inside the quiet period are only counted, and the count is reported by the next
    warning. The window spans bursts, so a flapping backend (timeouts every few seconds under
    load) is also logged once per window rather than once per blip. A recovery is logged at
    INFO when the burst that ends was itself logged. ``level`` is that of the error lines: a
    Redis link logs them at INFO because its WARNING is the breaker opening.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        quiet_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        fallback: str = "serving cache misses",
        level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._level = level
        self._what = what
        self._fallback = fallback
        self._quiet_seconds = quiet_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._in_burst = False
        self._burst_logged = False
        self._last_logged: float | None = None
        self._suppressed = 0

    def error(self, exc: BaseException, fallback: str | None = None) -> None:
        """Record one failure; log it unless a warning was emitted within the quiet period.
        ``fallback`` replaces the usual one for this failure (what was served instead)."""
        with self._lock:
            now = self._clock()
            self._in_burst = True
            last = self._last_logged
            if last is not None and now - last < self._quiet_seconds:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._last_logged = now
            self._burst_logged = True
        self._logger.log(
            self._level,
            "%s unavailable: %s: %s; %s%s",
            self._what,
            type(exc).__name__,
            exc,
            self._fallback if fallback is None else fallback,
            f" ({suppressed} more errors suppressed since the last warning)" if suppressed else "",
        )

    def logged_elsewhere(self) -> None:
        """The caller logged this burst itself (a breaker opening): its recovery is logged,
        and error lines stay quiet for a window, as after one of ours."""
        with self._lock:
            self._in_burst = self._burst_logged = True
            self._last_logged = self._clock()

    def success(self) -> None:
        """Record a success; ends the burst (and logs the recovery if the burst was logged)."""
        if not self._in_burst:  # fast path, no lock on the hot path
            return
        with self._lock:
            if not self._in_burst:
                return
            self._in_burst = False
            logged, self._burst_logged = self._burst_logged, False
        if logged:
            self._logger.info("%s recovered", self._what)
