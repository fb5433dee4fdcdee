"""Background polling of an index root's ``CURRENT``: new builds are swapped in while serving."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

log = logging.getLogger(__name__)


class Reloadable(Protocol):
    def reload(self) -> bool: ...


class Reloader:
    """Calls ``target.reload()`` every ``interval`` seconds on a daemon thread until stopped,
    or until the target is collected: the thread holds it weakly, so a retriever dropped
    without ``close()`` is freed (its build unmapped) and the thread ends, as the log
    follower's does."""

    def __init__(self, target: Reloadable, interval: float) -> None:
        self._target = weakref.ref(target)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-reloader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            target = self._target()
            if target is None:
                return
            try:
                target.reload()
            except Exception as exc:  # noqa: BLE001 (e.g. CURRENT names a vanished build;
                # any failure: a dead thread would stop following CURRENT without a word)
                log.error("index reload check failed: %s", exc)
            del target  # not held while waiting

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
