"""A worker's life: load the build in the background, be ready, drain on SIGTERM.

The server accepts connections at once (``/healthz`` answers while the build loads); the
retriever is loaded, verified and warmed on a thread, and only then is ``/readyz`` 200.
SIGTERM turns ``/readyz`` to 503 and keeps serving for ``drain_seconds`` (so load balancers
stop sending), then hands the signal to uvicorn, which stops accepting connections and waits
for accepted requests up to the rest of the grace period.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from indexes.errors import RetrievalError
from indexes.history import rollback_target
from retrieval.config import RetrieverConfig
from retrieval.errors import ConfigError
from retrieval.retriever import Retriever
from retrieval.service.errors import ServiceUnavailableError

log = logging.getLogger("retrieval.service")

Loader = Callable[[], Retriever]


class ServiceState:
    """Readiness, draining and the one retriever of this worker process."""

    def __init__(self, index_root: Path, config: RetrieverConfig,
                 loader: Loader | None = None,
                 named_filters: Mapping[str, dict[str, Any] | str] | None = None,
                 retry_seconds: float = 30.0) -> None:
        self.index_root = index_root
        self._config = config
        self._loader = loader or (lambda: Retriever.load(index_root, config))
        self._may_fall_back = loader is None  # a loader of its own (Ray, tests) decides itself
        self.named_filters = dict(named_filters or {})  # registered once loaded
        self._retriever: Retriever | None = None
        self.load_error: str | None = None
        self.fallback: str | None = None  # the last good build served while the live one fails
        self.retry_seconds = retry_seconds
        self.draining = threading.Event()
        self._closed = threading.Event()
        self._loaded = threading.Event()
        self._thread: threading.Thread | None = None

    # -- loading ----------------------------------------------------------------------------

    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._load, name="retriever-load", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        """Load the live build; on failure serve the build that was live before it (when the
        flip history names one) and try the live one again, backing off to ``retry_seconds``,
        until it loads: a restored ``CURRENT`` is picked up without a restart."""
        delay = min(0.5, self.retry_seconds)
        while not self._closed.is_set():
            retriever = self._attempt(self._loader, f"the index under {self.index_root}")
            if retriever is not None:
                self._serve(retriever, fallback=None)
                return
            if self._retriever is None and self._may_fall_back:
                self._fall_back()
            self._closed.wait(delay)
            delay = min(delay * 2, self.retry_seconds)

    def _attempt(self, loader: Loader, what: str) -> Retriever | None:
        try:
            retriever = loader()
            register_named_filters(retriever, self.named_filters)
        except RetrievalError as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("cannot load %s: %s", what, exc)
            return None
        except Exception as exc:  # noqa: BLE001 (reported by /readyz; the worker stays up)
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("unexpected error loading %s", what)
            return None
        return retriever

    def _fall_back(self) -> None:
        """Serve the build live before the failing one, from its own directory."""
        try:
            previous = rollback_target(self.index_root)
        except RetrievalError:
            previous = None
        if previous is None:
            return
        directory = self.index_root / "builds" / previous
        error = self.load_error
        retriever = self._attempt(lambda: Retriever.load(directory, self._config),
                                  f"the last good build {previous}")
        self.load_error = error
        if retriever is not None:
            log.warning("serving the last good build %s while the live one fails to load",
                        previous)
            self._serve(retriever, fallback=previous)

    def _serve(self, retriever: Retriever, fallback: str | None) -> None:
        old, self._retriever, self.fallback = self._retriever, retriever, fallback
        if fallback is None:
            self.load_error = None
        self._loaded.set()
        if old is not None:  # requests holding it finish on it first; then its threads stop
            closer = threading.Timer(10.0, old.close)
            closer.daemon = True
            closer.start()
        log.info("ready: serving build %s", retriever.build_id)

    def wait_loaded(self, timeout: float) -> bool:
        return self._loaded.wait(timeout)

    @property
    def ready(self) -> bool:
        return self._retriever is not None and not self.draining.is_set()

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for ``/readyz``, an open route: the index root's absolute path is
        written ``INDEX_ROOT`` (the server's filesystem is not the caller's business)."""
        ready, reason = self._readiness()
        return ready, self.hide_root(reason)

    def hide_root(self, text: str) -> str:
        """``text`` with the index root's absolute path written ``INDEX_ROOT``: error bodies
        and ``/readyz`` name files under it so, not where they lie on the server."""
        # Absolute paths only: a relative root ("index") is a word a message may hold too.
        roots = {str(self.index_root.resolve())} | (
            {str(self.index_root)} if self.index_root.is_absolute() else set())
        for root in sorted(roots, key=len, reverse=True):
            text = text.replace(root, "INDEX_ROOT")
        return text

    def _readiness(self) -> tuple[bool, str]:
        if self.draining.is_set():
            return False, "draining: the server is shutting down"
        if self._retriever is not None and self.fallback is not None:
            return True, (f"ready: serving the last good build {self.fallback} while the live "
                          f"build fails to load ({self.load_error})")
        if self._retriever is not None:
            failure = self._retriever.log_failure
            if failure is not None:
                return False, f"the write-ahead log cannot be applied: {failure}"
            return True, "ready"
        if self.load_error is not None:
            return False, f"the index could not be loaded: {self.load_error}"
        return False, "loading: the build is being verified and the encoder warmed"

    def retriever(self) -> Retriever:
        """The live retriever, or ServiceUnavailableError while loading (or after a failure).

        Draining does not refuse requests: those that still arrive in the drain window are
        served; readiness is what tells balancers to stop sending.
        """
        if self._retriever is None:
            raise ServiceUnavailableError(self.readiness()[1])
        return self._retriever

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a load still running is a daemon: exit anyway
        if self._retriever is not None:
            self._retriever.flush_cache_writes(2.0)
            self._retriever.close()

    # -- draining ---------------------------------------------------------------------------

    def install_drain_handler(self, drain_seconds: float) -> None:
        """Wrap the server's SIGTERM handler: first drain, then let the server shut down.

        Called from the lifespan (main thread, after uvicorn installed its handlers). A
        second SIGTERM skips the rest of the drain window.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        server_handler = signal.getsignal(signal.SIGTERM)
        if not callable(server_handler):
            return

        def shut_down(sig: int, frame: FrameType | None) -> None:
            server_handler(sig, frame)

        def on_sigterm(sig: int, frame: FrameType | None) -> None:
            if self.draining.is_set():
                shut_down(sig, frame)
                return
            self.draining.set()
            log.info("SIGTERM: draining for %.1f s, then finishing accepted requests",
                     drain_seconds)
            timer = threading.Timer(drain_seconds, shut_down, args=(sig, frame))
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, on_sigterm)


def register_named_filters(retriever: Retriever,
                           named_filters: Mapping[str, dict[str, Any] | str]) -> None:
    """Register the config's named filters; on a bad one the retriever is closed and the error
    (which names the filter) raised, so /readyz reports it."""
    for name, spec in named_filters.items():
        try:
            retriever.register_filter(name, spec)
        except RetrievalError as exc:
            retriever.close()
            raise ConfigError(f"named filter {name!r} in the service config: {exc}") from exc


def describe_index(retriever: Retriever) -> dict[str, Any]:
    """``GET /v1/index``: what the live build is, from its manifest."""
    snapshot = retriever.snapshot
    manifest = snapshot.manifest
    return {
        "build_id": snapshot.build_id,
        "documents": manifest.n_docs,
        "created_at": manifest.created_at,
        "encoder": manifest.encoder.model_dump(mode="json"),
        "metadata_fields": dict(snapshot.metadata.kinds),
    }
