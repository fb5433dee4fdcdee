"""The feature stage of the request path: nightly features from the online store plus
request-time features, added to the fused score of the top candidates.

Only the top ``feature_candidates`` after fusion are looked up (one store read per view), so
the cost does not grow with C. Request-time features (recency from a date metadata field) are
the only features computed per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexes.errors import RetrievalError
from retrieval.errors import ConfigError, closest
from retrieval.features import FeatureStoreError, OnlineStore, normalize, recency, score_features
from retrieval.features.ranking import FeatureWeights
from retrieval.live.parts import LiveDocs
from retrieval.loaded_build import LiveBuild, LoadedBuild

log = logging.getLogger(__name__)
_WARN_EVERY = 60.0  # seconds between "store unreachable" warnings


def _join(live: dict[str, str]) -> str:
    return ";".join(f"{view}={sid}" for view, sid in sorted(live.items()))


class RecencyWeight(BaseModel):
    """A request-time feature: exp-decayed age of a date metadata field, min-max normalized."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    weight: float = Field(0.1, allow_inf_nan=False)
    half_life_days: float = Field(365.0, gt=0, allow_inf_nan=False)


def check_recency(recency: RecencyWeight | None, kinds: Mapping[str, str]) -> None:
    """``ConfigError`` unless the recency field is a date (or number) field of the build:
    else every search would fail on it."""
    if recency is None or kinds.get(recency.field) in ("date", "number"):
        return
    kind = kinds.get(recency.field)
    what = "no metadata field of this build" if kind is None else f"a {kind} field"
    raise ConfigError(f"recency.field {recency.field!r} is {what}; recency needs a date field"
                      f"{closest(recency.field, list(kinds))} (fields: "
                      f"{', '.join(f'{n} ({k})' for n, k in sorted(kinds.items()))})",
                      "recency.field")


class RowIds(Sequence[str]):
    """A live snapshot's ids by row: its base build's rows, then its delta's."""

    def __init__(self, base: list[str], delta: list[str]) -> None:
        self.base, self.delta = base, delta

    def __len__(self) -> int:
        return len(self.base) + len(self.delta)

    def __getitem__(self, row):  # type: ignore[no-untyped-def,override]
        row = int(row)
        return self.base[row] if row < len(self.base) else self.delta[row - len(self.base)]


@dataclass(frozen=True)
class FeatureOutcome:
    """Score adjustment for the given candidates and what each hit shows."""

    adjustment: np.ndarray  # float64 (n,)
    per_hit: list[dict[str, float]]
    snapshot_id: str | None
    available: bool | None
    status: list[dict[str, str]] | None = None  # per hit: each view's ``status_of``


class FeatureStage:
    """Reads weighted views for candidates; knows the live snapshot ids for cache keys.

    The snapshot ids are refreshed by a background thread every ``refresh_seconds`` (and by
    every feature read), never by a search: a search only reads the last known key. The same
    refresh tracks whether the store is reachable; while it is not, results say
    ``features_available=False``.
    """

    def __init__(self, store: OnlineStore | None, weights: tuple[FeatureWeights, ...],
                 recency_weight: RecencyWeight | None, refresh_seconds: float = 1.0) -> None:
        self.store = store
        self.weights = weights
        self.recency = recency_weight
        self._refresh = refresh_seconds
        self._lock = threading.Lock()
        self._live: dict[str, str] = {}
        self._key = ""
        self.reachable = True
        # (build id, its ids by row): the base build's, and the live snapshot's on top of it
        self._ids: tuple[str, list[str]] = ("", [])
        self._live_ids: tuple[str, RowIds | None] = ("", None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshed = False
        self._warned_at = -_WARN_EVERY

    @property
    def reads_store(self) -> bool:
        return self.store is not None and bool(self.weights)

    def check(self) -> None:
        """At load: every weighted view must exist in the store and every weight key must be
        one of its features (``ConfigError`` naming the closest match). A store that cannot
        be reached is logged once and reported ``features_available=False`` until it answers.
        """
        if not self.reads_store:
            return
        assert self.store is not None
        if not (self.reachable if self._refreshed else self.refresh()):
            return
        for index, weights in enumerate(self.weights):
            try:
                view = self.store.online_view(weights.view)
            except FeatureStoreError as exc:
                self._set_reachable(False, exc)
                return
            if view is None:
                raise ConfigError(
                    f"features[{index}].view {weights.view!r} has no live snapshot in "
                    f"{self.store.describe()}{closest(weights.view, self.store.view_names())}; "
                    "fix the view name or materialize the view first", f"features.{index}.view")
            names = [feature.name for feature in view.features]
            for name in weights.weights:
                if name not in names:
                    raise ConfigError(
                        f"features[{index}].weights names {name!r}, which view {view.name!r} "
                        f"does not have{closest(name, names)}; its features are {names}",
                        f"features.{index}.weights.{name}")

    def start(self) -> None:
        """Refresh the snapshot key now (unless ``check`` did) and then in the background
        (no-op without weighted views)."""
        if not self.reads_store or self._thread is not None:
            return
        if not self._refreshed:
            self.refresh()
        self._thread = threading.Thread(target=self._run, name="feature-snapshot-refresh",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._refresh):
            self.refresh()

    def refresh(self) -> bool:
        """Read every weighted view's live snapshot id (store timeouts, off the request path).

        Returns whether the store answered. An unreachable store gives "unavailable" in the
        key, so results computed on defaults are never served once the store is back.
        """
        assert self.store is not None
        views = sorted({w.view for w in self.weights})
        try:
            if not self.store.probe():
                raise FeatureStoreError("no answer to a probe")
            live = {view: self.store.online_snapshot_id(view) or "-" for view in views}
        except RetrievalError as exc:  # a wrong password while serving: fail open, like a fault
            self._set_reachable(False, exc)
            live = dict.fromkeys(views, "unavailable")
        else:
            self._set_reachable(True)
        with self._lock:
            self._live = live
            self._key = _join(live)
        self._refreshed = True
        return self.reachable

    def _set_reachable(self, reachable: bool, exc: Exception | None = None) -> None:
        """Log a change of reachability: the loss at most once per ``_WARN_EVERY`` seconds
        (a flapping store under load would otherwise log every flip)."""
        if reachable != self.reachable:
            assert self.store is not None
            now = time.monotonic()
            if not reachable and now - self._warned_at >= _WARN_EVERY:
                self._warned_at = now
                log.warning("%s is unreachable (%s); serving results with "
                            "features_available=False until it answers",
                            self.store.describe(), exc)
            elif reachable:
                log.info("%s answers again; features are back in ranking", self.store.describe())
        self.reachable = reachable

    def _seen(self, view: str, snapshot_id: str | None) -> None:
        """A read saw ``snapshot_id``: the freshest evidence there is; key follows it."""
        if snapshot_id is None or self._live.get(view) == snapshot_id:
            return
        with self._lock:
            self._live = {**self._live, view: snapshot_id}
            self._key = _join(self._live)

    def snapshot_key(self) -> str:
        """Live snapshot id of every weighted view, as last refreshed (no I/O).

        Part of the result-cache key: a materialization invalidates cached results within
        ``refresh_seconds``.
        """
        return self._key

    def doc_ids(self, snapshot: LoadedBuild) -> Sequence[str]:
        """External ids by row (feature reads are keyed by id): the build's, materialized once
        per build; a live snapshot's, its base's followed by its delta's (each applied write
        made it anew, one id per row: ~0.3 s on the first search after a write at 1M rows)."""
        if not isinstance(snapshot, LiveBuild):
            return self._build_ids(snapshot)
        with self._lock:
            build, live = self._live_ids
        if build != snapshot.build_id or live is None:
            assert snapshot.base is not None and isinstance(snapshot.docs, LiveDocs)
            live = RowIds(self._build_ids(snapshot.base), [d.id for d in snapshot.docs.delta])
            with self._lock:
                self._live_ids = (snapshot.build_id, live)
        return live

    def _build_ids(self, build: LoadedBuild) -> list[str]:
        with self._lock:
            built, ids = self._ids
        if built != build.build_id:
            ids = build.docs.all_ids()
            with self._lock:
                self._ids = (build.build_id, ids)
        return ids

    def apply(self, snapshot: LoadedBuild, rows: np.ndarray) -> FeatureOutcome:
        """Adjustment and per-hit feature values for candidate ``rows`` (int, (n,))."""
        adjustment = np.zeros(rows.size, dtype=np.float64)
        per_hit: list[dict[str, float]] = [{} for _ in range(rows.size)]
        snapshot_id, available = None, None
        status: list[dict[str, str]] | None = None
        if self.store is not None and self.weights:
            ids = self.doc_ids(snapshot)
            scores = score_features(self.store, self.weights, [ids[int(r)] for r in rows])
            adjustment += scores.adjustment
            per_hit = [scores.features_of(i) for i in range(rows.size)]
            status = [scores.status_of(i) for i in range(rows.size)]
            snapshot_id = scores.snapshot_id
            available = self.reachable and all(b.available for b in scores.batches.values())
            for view, batch in scores.batches.items():
                self._seen(view, batch.snapshot_id)
        if self.recency is not None:
            column = snapshot.metadata.numeric_column(self.recency.field)
            fresh = recency(np.asarray(column[rows], dtype=np.float64), time.time(),
                            self.recency.half_life_days)
            adjustment += self.recency.weight * normalize(fresh, "minmax")
            for values, value in zip(per_hit, fresh, strict=True):
                values["recency"] = float(value)
        return FeatureOutcome(adjustment, per_hit, snapshot_id, available, status)
