"""The Retriever: the public front door. It owns the lifecycle (load with its checks against
reality, reload, close, stats) and no algorithm; a search is one pass down the stages of
``request_path.RequestPath`` over the build that is live when it starts.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.docstore import Document
from indexes.encoders import Encoder
from indexes.errors import InvalidQueryError, InvalidWriteError, RetrievalError
from indexes.history import publication_of
from indexes.manifest import CURRENT, resolve_build_dir
from indexes.wal.split import whole_documents
from retrieval.abandon import Abandoned, ThreadWork, unless_abandoned
from retrieval.cache import Cache, make_cache
from retrieval.config import RetrieverConfig
from retrieval.errors import ConfigError, SequenceNotReachedError
from retrieval.features import OnlineStore, make_store
from retrieval.filters.named import NamedFilters, UnknownNamedFilterError
from retrieval.live import LogFollower
from retrieval.loaded_build import LoadedBuild
from retrieval.models import SearchResult
from retrieval.query_encoder import check_encoder, default_encoder
from retrieval.relevance import above, calibration_for, check_min_score
from retrieval.request_path.cache_lookup import RequestCache
from retrieval.request_path.feature_stage import FeatureStage, check_recency
from retrieval.request_path.run import Live, RequestPath
from retrieval.request_path.validate import FilterMemo, check_min_seq, is_light_filter
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.whole import open_build, warm_up_build

log = logging.getLogger(__name__)
# A new build a shard could not prepare (no live replica) is tried again after these pauses.
DEFER_SECONDS = 1.0
DEFER_MAX_SECONDS = 60.0
# How long ``close`` waits for a build the log thread was loading (verifying a large one
# takes seconds); past it the load ends on its own, serving nothing.
LOADER_JOIN_SECONDS = 10.0
# What ``with_ranking`` may change: how candidates are chosen and fused, nothing that loads.
RANKING_SETTINGS = ("fusion", "vector_weight", "rrf_k", "candidate_policy", "candidates",
                    "dense_candidates", "guardrail_min_keyword", "feature_candidates",
                    "typo_tolerance", "typo_weight")


def _config(config: RetrieverConfig | dict[str, Any] | None) -> RetrieverConfig:
    if isinstance(config, RetrieverConfig):
        return config
    return RetrieverConfig(**(config or {}))  # ConfigError, never ValidationError


class Retriever:
    """Two-stage hybrid search over the live build. Thread-safe; one instance serves many."""

    def __init__(
        self, snapshot: LoadedBuild, config: RetrieverConfig, encoder: Encoder | None,
        cache: Cache | None = None, root: Path | None = None,
        feature_store: OnlineStore | None = None,
    ) -> None:
        if encoder is not None:
            check_encoder(encoder, snapshot)
        if config.features and feature_store is None:
            raise ConfigError("features weights feature views, but no feature store is "
                              "configured: set feature_store (a directory or redis:// URL) "
                              "or pass feature_store= to the retriever", "features")
        limit = getattr(feature_store, "max_entities_per_read", None)
        # A search reads the features of its top max(feature_candidates, k) candidates.
        read = max(config.feature_candidates, config.limits.max_k)
        if config.features and limit is not None and read > limit:
            raise ConfigError(f"a search may read the features of {read} candidates "
                              f"(feature_candidates {config.feature_candidates}, limits.max_k "
                              f"{config.limits.max_k}), and the feature store reads at most "
                              f"{limit} entities at once (max_entities_per_read): lower those "
                              "or raise it", "feature_candidates")
        self.config = config
        self.encoder = encoder
        self.root = root
        # Registered filters; their masks are bound per build, before it serves (see reload).
        self._named = NamedFilters(config.limits.max_filter_clauses, config.limits.max_in_values)
        self._swap_lock = threading.Lock()  # a registration and a swap never interleave
        self._live = self._bind(snapshot)
        self._cache = RequestCache(cache, config.cache) if cache is not None else None
        self._features = (FeatureStage(feature_store, config.features, config.recency,
                                       config.feature_snapshot_refresh_seconds)
                          if (feature_store is not None and config.features) or config.recency
                          else None)
        self._path = RequestPath(config, encoder, self._cache, self._features)
        if self._features is not None:  # snapshot ids for cache keys, off the request path
            self._features.start()
        self._reloader: Any = None
        self._refused: tuple[str, int] | None = None  # the CURRENT a reload last refused
        self._deferred: tuple[str, int] | None = None  # the one it last put off (a shard down)
        self._defer_pause, self._retry_at = DEFER_SECONDS, 0.0
        # The log thread and the reload poller both reload: one build is loaded once.
        self._reload_lock = threading.Lock()
        self._loader: threading.Thread | None = None  # a load the log thread started
        # How a published build is opened: here (whole or sharded), or on Ray (``connect``).
        self._open: Callable[[Path], LoadedBuild] = functools.partial(
            open_build, verify=config.verify_checksums, mmap=config.mmap)
        self._log: LogFollower | None = None
        # What a retriever that follows no log serves: its build's writes, or more for a
        # ``with_ranking`` variant over a snapshot with the log's writes applied.
        self._served_seq = snapshot.manifest.log_seq
        now = time.monotonic()
        self.reload_events: list[dict[str, Any]] = [
            {"event": "loaded", "build_id": snapshot.build_id, "swapped_at": (now, now)}]

    @classmethod
    def load(
        cls,
        path: str | Path,
        config: RetrieverConfig | dict[str, Any] | None = None,
        *,
        encoder: Encoder | None = None,
        cache: Cache | None = None,
        feature_store: OnlineStore | None = None,
    ) -> Retriever:
        """Load the live build under ``path`` (or a build directory), whole or sharded,
        verified and mmapped.

        The cache is built from ``config.cache`` (in-process by default) unless one is given.
        """
        config = _config(config)
        snapshot = open_build(path, verify=config.verify_checksums, mmap=config.mmap)
        return cls._start(snapshot, config, Path(path), encoder, cache, feature_store)

    @classmethod
    def connect(
        cls,
        path: str | Path,
        config: RetrieverConfig | dict[str, Any] | None = None,
        *,
        encoder: Encoder | None = None,
        cache: Cache | None = None,
        feature_store: OnlineStore | None = None,
        allow_partial: bool = False,
        **ray_options: Any,
    ) -> Retriever:
        """The sharded build under ``path`` served by Ray Serve shard deployments
        (``retrieval.sharding.ray_serve.serve_shards``; ``ray.init`` first, the ray extra),
        searched here by the same request path as ``load``: same results, same capabilities.
        ``allow_partial``: a shard with no live replica is left out (``partial:<shard>`` in
        ``degraded``) instead of failing the search; ``ray_options``: ``app_name``,
        ``retry_seconds``, ``timeout_seconds``. Given an index root it follows the root as
        ``load`` does: a newly published build of the same shard count is served once every
        shard deployment has loaded it (all shards flip together: each call names its build),
        and the write-ahead log is applied here, over the deployed shards.
        """
        from retrieval.sharding.ray_serve import RayShardedBuild

        config = _config(config)

        def on_ray(build: Path) -> LoadedBuild:
            return RayShardedBuild.connect(build, config, allow_partial=allow_partial,
                                           **ray_options)

        root = Path(path)
        return cls._start(on_ray(root), config, root, encoder, cache, feature_store, on_ray)

    @classmethod
    def _start(cls, snapshot: LoadedBuild, config: RetrieverConfig, root: Path,
               encoder: Encoder | None, cache: Cache | None,
               feature_store: OnlineStore | None,
               opener: Callable[[Path], LoadedBuild] | None = None) -> Retriever:
        """A retriever over ``snapshot``: dependencies checked, warmed up, and under an index
        ``root`` following its write-ahead log and (by config) its published builds, opened
        by ``opener`` (default: in this process)."""
        if encoder is None:
            encoder = default_encoder(snapshot, config, root)
        if feature_store is None and config.feature_store is not None:
            feature_store = make_store(config.feature_store)
        retriever = cls(snapshot, config, encoder, cache or make_cache(config.cache), root,
                        feature_store)
        if opener is not None:
            retriever._open = opener
        try:
            retriever._check_dependencies()
        except BaseException:
            retriever.close()
            raise
        retriever._warm_up()
        if root is not None and (root / CURRENT).is_file():  # follow its write-ahead log
            try:
                retriever._log = LogFollower(root, retriever.snapshot, retriever._serve,
                                             retriever.reload, retriever.load_pending,
                                             config.live_lag_seconds)
                retriever._log.start()
            except BaseException:  # e.g. records a passage build cannot apply
                retriever.close()
                raise
        if config.reload_interval_seconds is not None and root is not None:
            from retrieval.reload import Reloader

            retriever._reloader = Reloader(retriever, config.reload_interval_seconds)
        return retriever

    @property
    def build_id(self) -> str:
        """The build served (a result's ``build_id`` adds the applied log position: ``+seq``);
        it changes with the swap that serves a new build, not before."""
        return self._live.snapshot.build_id.partition("+")[0]

    @property
    def snapshot(self) -> LoadedBuild:
        return self._live.snapshot

    def _bind(self, snapshot: LoadedBuild) -> Live:
        """``snapshot`` with its filter memo and every named filter's mask computed for it;
        ``ConfigError`` when a named filter or the recency field does not fit its fields."""
        check_recency(self.config.recency, snapshot.metadata.kinds)
        named = self._named.bind(snapshot.metadata)  # a spec the build rejects raises here
        return Live(snapshot, FilterMemo(snapshot.metadata.kinds, self.config.limits,
                                         named=named, metadata=snapshot.metadata),
                    calibration_for(self.root, snapshot.manifest))

    def _check_dependencies(self) -> None:
        """Configuration against reality, once at load: Redis credentials and certificates
        (``ConfigError``), weighted views and features (``ConfigError`` with the closest
        match); an unreachable store or cache is logged once and served fail-open."""
        if self._cache is not None:
            self._cache.cache.probe()
        if self._features is not None:
            self._features.check()

    def _warm_up(self) -> None:
        """Load the kernels and run the model once, so the first request is not cold."""
        warm_up_build(self.snapshot)
        if self._features is not None:
            self._features.doc_ids(self.snapshot)
        if self.encoder is not None:
            self.encoder.encode(["warm up"])

    # -- lifecycle --------------------------------------------------------------------------

    def reload(self, wait: bool = True) -> bool:
        """Load the build ``CURRENT`` names if it changed; swap atomically. True if swapped.

        The new build is loaded and verified off the request path; a build that fails
        verification is refused, logged and reported in ``stats()``, and the old one serves on.
        Requests in flight finish on the build they started with. ``wait=False`` (the log
        thread): a build due is loaded in a thread of its own and this returns False at once,
        so writes keep being applied on the build served while it loads (seconds to verify
        at scale); those logged for the new build (another model, another kind) wait for it.
        """
        if self.root is None:
            return False
        if not wait:
            self._load_beside()
            return False
        with self._reload_lock:
            return self._reload()

    def loading(self) -> bool:
        """Whether a thread is loading a newly published build now."""
        return self._reload_lock.locked()

    def load_pending(self) -> bool:
        """Whether a newly published build is loading, or due to (neither refused nor put
        off): writes logged for it wait for it, and are no failure meanwhile."""
        return self.loading() or (self.root is not None and self._due() is not None)

    def _load_beside(self) -> None:
        if self.loading() or self._due() is None:
            return
        self._loader = threading.Thread(target=self._load_in_thread, name="retrieval-load",
                                        daemon=True)
        self._loader.start()

    def _load_in_thread(self) -> None:
        """``reload`` for the log thread. A failure that names no fault of the build (out of
        file handles or memory, say: a refused build is a ``RetrievalError``, handled in
        ``_reload``) is logged and the load tried again later, as a shard down is."""
        try:
            self.reload()
        except Exception as exc:
            self._defer(self._current_marker(), exc)

    def _due(self) -> tuple[str, int] | None:
        """``CURRENT``'s marker when it names a build to load: not the one served, not one
        refused already, not one put off (a shard down) whose retry time has not come."""
        assert self.root is not None
        marker = self._current_marker()
        if marker == self._refused:  # refused already: not every tick
            return None
        if marker == self._deferred and time.monotonic() < self._retry_at:
            return None  # a shard down: each try may wait out the shard calls' timeout
        try:
            if resolve_build_dir(self.root) == self.snapshot.path:
                return None
        except RetrievalError:  # the load refuses it, saying why
            pass
        return marker

    def _reload(self) -> bool:
        assert self.root is not None
        marker = self._due()
        if marker is None:
            return False
        try:
            fresh = self._open(self.root)
            if self.encoder is not None:
                check_encoder(self.encoder, fresh)
            warm_up_build(fresh)
            self._named.bind(fresh.metadata)  # a build that cannot serve a named filter: refused
            check_recency(self.config.recency, fresh.metadata.kinds)
            if self._log is not None:
                self._log.check_fits(fresh)
            swap_started = time.monotonic()
            if self._log is not None:  # the new build plus the log records it did not fold
                self._log.rebase(fresh)  # refused when the log cannot complete it
            else:
                self._serve(fresh)
        except ShardUnavailableError as exc:  # a shard down for now: not the build's fault
            self._defer(marker, exc)
            return False
        except RetrievalError as exc:
            log.error("refused new build under %s: %s", self.root, exc)
            self.reload_events.append({"event": "refused", "error": str(exc)})
            self._refused = marker
            return False
        self.reload_events.append({"event": "loaded", "build_id": fresh.build_id,
                                   "swapped_at": (swap_started, time.monotonic()),
                                   **publication_of(self.root, fresh.build_id)})
        log.info("now serving build %s", fresh.build_id)
        return True

    def _defer(self, marker: tuple[str, int], error: Exception) -> None:
        """Try the build again later, after pauses doubling from ``DEFER_SECONDS`` up to
        ``DEFER_MAX_SECONDS``: each try may wait out the shard calls' timeout (the log thread
        starts them in a thread of their own, and applies writes meanwhile)."""
        if marker != self._deferred:  # said once
            log.warning("new build under %s deferred: %s", self.root, error)
            self.reload_events.append({"event": "deferred", "error": str(error)})
            self._deferred, self._defer_pause = marker, DEFER_SECONDS
        else:
            self._defer_pause = min(self._defer_pause * 2, DEFER_MAX_SECONDS)
        self._retry_at = time.monotonic() + self._defer_pause

    def _current_marker(self) -> tuple[str, int]:
        """(what ``CURRENT`` says, its mtime) under the root, ("", 0) where it cannot be read
        (a build directory has none). A refused build is checked again only once ``CURRENT``
        is rewritten."""
        assert self.root is not None
        try:
            current = self.root / CURRENT
            return current.read_text(encoding="utf-8"), current.stat().st_mtime_ns
        except (OSError, UnicodeDecodeError):
            return ("", 0)  # unreadable: refused once, checked again once it is back

    def _serve(self, snapshot: LoadedBuild) -> None:
        """Serve ``snapshot`` (a build, or a build plus its live delta), every named filter's
        mask computed for it first: not on a request."""
        with self._swap_lock:  # a registration and a swap never interleave
            self._live = self._bind(snapshot)

    def refresh(self) -> bool:
        """Serve a newly published build and every acknowledged write now, without waiting
        for ``live_lag_seconds``; True when anything changed."""
        swapped = self.reload()
        return (self._log.apply_now() if self._log is not None else False) or swapped

    @property
    def applied_seq(self) -> int:
        """The last write-ahead log sequence number this retriever serves (folded into its
        build or applied on top of it)."""
        log = self._log
        return log.applied_seq if log is not None else self._served_seq

    def wait_for_seq(self, seq: int | None) -> None:
        """Serve every write up to ``seq`` (read-your-writes): reads the log now if it is
        behind; ``SequenceNotReachedError`` when no such write is acknowledged on the root."""
        if seq is None or self.applied_seq >= check_min_seq(seq):
            return
        if self._log is not None:  # on the build served: not behind one another thread loads
            with contextlib.suppress(InvalidWriteError):  # logged for it: wait for it below
                self._log.apply_now()
        if self.applied_seq < seq:
            self.refresh()
        if self.applied_seq < seq:
            failure = f"; the log cannot be applied: {self.log_failure}" if self.log_failure \
                else ""
            raise SequenceNotReachedError(
                f"min_seq {seq} is past the last write this index serves (seq "
                f"{self.applied_seq}){failure}; pass the seq a write under this index root "
                "returned")

    def get_documents(self, ids: Sequence[str], *, min_seq: int | None = None
                      ) -> list[Document | None]:
        """The documents with ``ids`` as this retriever serves them (live writes included),
        None where no document has that id; a passage build's are reassembled from their
        passages. ``min_seq`` as in ``search``."""
        self.wait_for_seq(min_seq)
        snapshot = self.snapshot
        ids_of = snapshot.metadata.ids
        assert ids_of is not None  # every snapshot knows its ids
        found: list[Document | None] = []
        for doc_id in ids:
            rows = list(ids_of.rows(doc_id))
            if not rows:
                found.append(None)
            elif snapshot.passages is None:
                found.append(snapshot.docs.get(rows[0]))
            else:
                found.append(whole_documents(snapshot.docs, snapshot.passages, rows)[0])
        return found

    @property
    def log_failure(self) -> str | None:
        """Why the write-ahead log's newest records cannot be applied (a damaged record), or
        None; the last good state serves meanwhile."""
        return self._log.failure if self._log is not None else None

    def live_windows(self) -> dict[str, tuple[float, float]]:
        """Monotonic-clock window in which each build served: from just before its swap to
        just after the next one (a request bound to it started and ended inside)."""
        loads = [e for e in self.reload_events if e["event"] == "loaded"]
        ends = [e["swapped_at"][1] for e in loads[1:]] + [float("inf")]
        return {e["build_id"]: (e["swapped_at"][0] if i else float("-inf"), end)
                for i, (e, end) in enumerate(zip(loads, ends, strict=True))}

    def with_ranking(self, snapshot: LoadedBuild | None = None,
                     encoder: Encoder | None = None, **ranking: Any) -> Retriever:
        """A retriever over this one's current build (or ``snapshot``, with ``encoder`` when
        its model differs) with ranking settings changed, e.g. ``fusion="rrf"``: the same
        feature store, no cache, no reloader. Two configurations side by side (the console's
        compare); close it when done. Only the settings in ``RANKING_SETTINGS`` may change.
        """
        unknown = sorted(set(ranking) - set(RANKING_SETTINGS))
        if unknown:
            raise ConfigError(f"{', '.join(unknown)} cannot change per comparison; ranking "
                              f"settings are {', '.join(RANKING_SETTINGS)}")
        config = _config({**self.config.model_dump(exclude={"cache"}), **ranking,
                          "reload_interval_seconds": None, "cache": {"backend": "none"}})
        store = self._features.store if self._features is not None else None
        served = self.applied_seq  # read before the snapshot: that one holds at least these
        current = self.snapshot
        # The root gives it the root's own calibration (relevance.json); it follows nothing:
        # the reloader and the log's follower start in ``load`` alone.
        variant = Retriever(snapshot or current, config,
                            encoder if encoder is not None else self.encoder, root=self.root,
                            feature_store=store)
        if snapshot is None or snapshot is current:  # the one served now, its writes applied
            variant._served_seq = served
        return variant

    def close(self) -> None:
        """Stop worker threads and the cache's writer (queued cache writes are flushed)."""
        if self._reloader is not None:
            self._reloader.stop()
        if self._log is not None:
            self._log.stop()
        if self._loader is not None:  # a load the log thread started ends before the parts
            self._loader.join(timeout=LOADER_JOIN_SECONDS)
        if self._features is not None:
            self._features.stop()
        self._path.close()
        if self._cache is not None:
            self._cache.cache.close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Rolling p50/p95/p99 per stage, cache counters and breaker state, batching, whether
        stages run in parallel, reloads."""
        return {"build_id": self.build_id, **self._path.stats(),
                "reloads": list(self.reload_events[-20:]),
                "log": self._log.describe() if self._log is not None else None}

    def flush_cache_writes(self, timeout: float = 5.0) -> bool:
        """Wait until queued cache writes are done (tests and orderly shutdown)."""
        return self._cache.cache.flush_writes(timeout) if self._cache is not None else True

    # -- named filters -----------------------------------------------------------------------

    def register_filter(self, name: str, spec: dict[str, Any] | str) -> int:
        """Register ``spec`` under ``name`` (replacing any filter of that name); searches then
        refer to it as ``filters={"$named": name}``, optionally with inline clauses ANDed to
        it. Its mask is computed now and again for each new build, never on a request.
        Returns the number of documents it allows in the live build. A spec the build rejects
        raises the filter's usual error and registers nothing."""
        with self._swap_lock:
            live = self._live
            bound = self._named.register(name, spec, live.filters.named, live.snapshot.metadata)
            live.filters.named = bound
        return bound.get(name).allowed

    def unregister_filter(self, name: str) -> None:
        """Remove a named filter; searches referring to it then raise UnknownNamedFilterError."""
        with self._swap_lock:
            live = self._live
            if name not in live.filters.named.entries:
                raise UnknownNamedFilterError(f"no filter named {name!r} is registered; "
                                              f"registered: {self._named.names()}")
            live.filters.named = self._named.unregister(name, live.filters.named)

    def named_filters(self) -> dict[str, int]:
        """Registered filter names and how many documents each allows in the live build."""
        return {name: e.allowed for name, e in sorted(self._live.filters.named.entries.items())}

    # -- search -----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        filters: dict[str, Any] | str | None = None,
        k: int | None = None,
        *,
        candidates: int | None = None,
        query_vector: np.ndarray | None = None,
        deadline_ms: float | None = None,
        group_by: str | None = None,
        context: int = 0,
        min_seq: int | None = None,
        explain: bool = False,
        min_score: float | None = None,
    ) -> SearchResult:
        """Best ``k`` passages for ``query`` among documents allowed by ``filters``.

        ``deadline_ms`` (default ``config.deadline_ms``): past it the search degrades instead
        of waiting (``result.degraded``). Raises ``OverloadedError`` at once when
        ``config.max_in_flight`` searches are already running. In a passage build,
        ``group_by="document"`` returns each document's best passage only (``k`` counts
        documents) and ``context=n`` adds the ``n`` passages around each hit
        (``retrieval.request_path.grouping``). ``min_seq``: see at least the writes up to
        that sequence number (``wait_for_seq``). ``explain=True``: every hit carries an
        ``Explanation`` of its score (``retrieval.request_path.explain``); free when off.
        ``min_score``: keep only hits whose ``relevance`` (the calibrated probability that a
        hit is relevant, ``retrieval.relevance``) is at least this; the top ``k`` are
        computed first, so fewer (or no) hits come back when the corpus has no good answer.
        """
        return self._searched(0.0, query, filters, k, candidates, query_vector, deadline_ms,
                              group_by, context, min_seq, explain, min_score)

    def _searched(self, queued_ms: float, query: str, filters: Any = None, k: int | None = None,
                  candidates: int | None = None, query_vector: np.ndarray | None = None,
                  deadline_ms: float | None = None, group_by: str | None = None,
                  context: int = 0, min_seq: int | None = None, explain: bool = False,
                  min_score: float | None = None) -> SearchResult:
        """``search``, begun ``queued_ms`` after it was asked for (the wait for a thread),
        which counts in its deadline and its timings."""
        with self._path.failures_traced():
            threshold = self._threshold(min_score)
            self.wait_for_seq(min_seq)
        return above(self._path.search(self._live, query, filters, k, candidates, query_vector,
                                       deadline_ms, group_by, context, explain, queued_ms),
                     threshold)

    def _in_thread(self, call: Callable[..., Any], *args: Any, **options: Any
                   ) -> ThreadWork[Any]:
        """``search``-like ``call`` in the running loop's default executor, with the caller's
        context (its trace span is the parent of the search's) and the time it waited for a
        thread passed as its first argument (``queued_ms``)."""
        submitted = time.perf_counter()

        def queued() -> Any:
            return call((time.perf_counter() - submitted) * 1e3, *args, **options)

        return ThreadWork(functools.partial(contextvars.copy_context().run, queued))

    def _threshold(self, min_score: Any) -> float | None:
        """A valid ``min_score``, on a build whose model has a relevance calibration."""
        threshold = check_min_score(min_score)
        if threshold is not None and self._live.relevance is None:
            raise InvalidQueryError(
                f"min_score needs a relevance calibration for the model "
                f"{self.snapshot.manifest.encoder.model!r}, and this index has none: fit one "
                "on judged queries with `retrieval calibrate ROOT --data FOLDER`")
        return threshold

    def search_batch(
        self,
        queries: Sequence[str],
        filters: dict[str, Any] | str | None = None,
        k: int | None = None,
        *,
        candidates: int | None = None,
        query_vectors: np.ndarray | None = None,
        deadline_ms: float | None = None,
        group_by: str | None = None,
        context: int = 0,
        min_seq: int | None = None,
        explain: bool = False,
        min_score: float | None = None,
    ) -> list[SearchResult]:
        """Search many queries with the same filters; their embeddings are one encoder call.

        ``deadline_ms`` (default ``config.deadline_ms``) is one budget for the whole call,
        from its start: the queries degrade past it as ``search`` does (a query whose vector
        the encoder call had not returned in time ranks by BM25 alone, ``degraded`` holds
        "embed"), and a degraded result is not cached. The other arguments are ``search``'s,
        ``query_vectors`` one row per query."""
        return self._searched_batch(0.0, queries, filters, k, candidates=candidates,
                                    query_vectors=query_vectors, deadline_ms=deadline_ms,
                                    group_by=group_by, context=context, min_seq=min_seq,
                                    explain=explain, min_score=min_score)

    def _searched_batch(self, queued_ms: float, queries: Sequence[str], filters: Any = None,
                        k: int | None = None, *, candidates: int | None = None,
                        query_vectors: np.ndarray | None = None,
                        deadline_ms: float | None = None, group_by: str | None = None,
                        context: int = 0, min_seq: int | None = None, explain: bool = False,
                        min_score: float | None = None) -> list[SearchResult]:
        """``search_batch``, begun ``queued_ms`` after it was asked for (as ``_searched``)."""
        with self._path.failures_traced():
            threshold = self._threshold(min_score)
            self.wait_for_seq(min_seq)
        return [above(r, threshold) for r in self._path.search_batch(
            self._live, queries, filters, k, candidates, query_vectors, deadline_ms, group_by,
            context, explain, queued_ms)]

    async def asearch(self, query: str, filters: dict[str, Any] | str | None = None,
                      k: int | None = None, *, abandoned: Abandoned | None = None,
                      **options: Any) -> SearchResult:
        """``search`` for asyncio apps, never blocking the loop on I/O or on a computation.

        With an in-process cache, validation and the cache lookup run on the loop (tens of
        microseconds, less than the hand-off to a thread) and a result-cache hit returns from
        there, unless the filters are large (``is_light_filter``: a long IN list can take
        milliseconds to validate, so such searches run entirely in a thread). The rest of a
        search runs in the running loop's default executor (``loop.set_default_executor``
        sizes it), so at most that many searches compute at once. Not in the retriever's
        encode pool: a search waiting there on an encode queued behind other searches could
        wait forever. ``abandoned``: an awaitable factory that completes when the caller no
        longer wants the answer (``retrieval.abandon``)."""
        check_options("asearch", options, Retriever.search)
        with self._path.failures_traced():  # checked on the loop: their own error spans
            threshold = self._threshold(options.pop("min_score", None))
            behind = options.get("min_seq") is not None and (
                self.applied_seq < check_min_seq(options["min_seq"]))
        if threshold is not None:
            return above(await self.asearch(query, filters, k, abandoned=abandoned, **options),
                         threshold)
        if behind:
            return await unless_abandoned(
                self._in_thread(self._searched, query, filters, k, **options), abandoned)
        options.pop("min_seq", None)
        if (options.get("query_vector") is None and self._path.reads_without_blocking
                and is_light_filter(filters)):
            live = self._live
            options.pop("query_vector", None)
            begun = self._path.begin(live, query, filters, k, **options)
            if isinstance(begun, SearchResult):
                return begun
            return await unless_abandoned(ThreadWork(functools.partial(
                contextvars.copy_context().run, self._path.resume, live, begun)), abandoned)
        return await unless_abandoned(
            self._in_thread(self._searched, query, filters, k, **options), abandoned)

    async def asearch_batch(self, queries: Sequence[str],
                            filters: dict[str, Any] | str | None = None, k: int | None = None,
                            *, abandoned: Abandoned | None = None,
                            **options: Any) -> list[SearchResult]:
        """``search_batch`` for asyncio apps, in the running loop's default executor (as
        ``asearch``, ``abandoned`` too); the wait for a thread counts in its deadline."""
        check_options("asearch_batch", options, Retriever.search_batch)
        return await unless_abandoned(
            self._in_thread(self._searched_batch, queries, filters, k, **options), abandoned)


def check_options(name: str, options: dict[str, Any], like: Callable[..., Any]) -> None:
    """The keyword arguments an async call passes on are ``like``'s own: a misspelled one is
    the TypeError Python gives ``like``, naming the call made (not a private method)."""
    unknown = sorted(set(options) - parameters(like))
    if unknown:
        raise TypeError(f"{name}() got an unexpected keyword argument {unknown[0]!r}")


@functools.cache
def parameters(call: Callable[..., Any]) -> frozenset[str]:
    """``call``'s parameter names, read once (a signature takes microseconds to read)."""
    return frozenset(inspect.signature(call).parameters)
