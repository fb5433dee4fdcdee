"""The feature stage of the request path: nightly features from the online store plus
request-time features, added to the fused score of the top candidates.

Only the top ``feature_candidates`` after fusion are looked up (one store read per view), so
the cost does not grow with C. Request-time features (recency from a date metadata field) are
the only features computed per request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from retrieval.features import FeatureStoreError, OnlineStore, normalize, recency, score_features
from retrieval.features.ranking import FeatureWeights
from retrieval.snapshot import IndexSnapshot


class RecencyWeight(BaseModel):
    """A request-time feature: exp-decayed age of a date metadata field, min-max normalized."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    weight: float = Field(0.1, allow_inf_nan=False)
    half_life_days: float = Field(365.0, gt=0, allow_inf_nan=False)


@dataclass(frozen=True)
class FeatureOutcome:
    """Score adjustment for the given candidates and what each hit shows."""

    adjustment: np.ndarray  # float64 (n,)
    per_hit: list[dict[str, float]]
    snapshot_id: str | None
    available: bool | None


class FeatureStage:
    """Reads weighted views for candidates; knows the live snapshot ids for cache keys."""

    def __init__(self, store: OnlineStore | None, weights: tuple[FeatureWeights, ...],
                 recency_weight: RecencyWeight | None, refresh_seconds: float = 1.0) -> None:
        self.store = store
        self.weights = weights
        self.recency = recency_weight
        self._refresh = refresh_seconds
        self._lock = threading.Lock()
        self._key: tuple[float, str] = (-1.0, "")
        self._ids: tuple[str, list[str]] = ("", [])

    def snapshot_key(self) -> str:
        """Live snapshot id of every weighted view, refreshed at most every ``refresh_seconds``.

        Part of the result-cache key: a materialization invalidates cached results within
        that bound. An unreachable store gives "unavailable", so results computed on defaults
        are never served once the store is back.
        """
        if self.store is None or not self.weights:
            return ""
        now = time.monotonic()
        with self._lock:
            stamp, key = self._key
            if now - stamp < self._refresh:
                return key
        views = sorted({w.view for w in self.weights})
        key = ";".join(f"{view}={self._live(view)}" for view in views)
        with self._lock:
            self._key = (now, key)
        return key

    def _live(self, view: str) -> str:
        assert self.store is not None
        try:
            return self.store.live_snapshot_id(view) or "-"
        except FeatureStoreError:
            return "unavailable"

    def doc_ids(self, snapshot: IndexSnapshot) -> list[str]:
        """External ids by row, materialized once per build (feature reads are keyed by id)."""
        with self._lock:
            build, ids = self._ids
        if build != snapshot.build_id:
            ids = snapshot.docs.all_ids()
            with self._lock:
                self._ids = (snapshot.build_id, ids)
        return ids

    def apply(self, snapshot: IndexSnapshot, rows: np.ndarray) -> FeatureOutcome:
        """Adjustment and per-hit feature values for candidate ``rows`` (int, (n,))."""
        adjustment = np.zeros(rows.size, dtype=np.float64)
        per_hit: list[dict[str, float]] = [{} for _ in range(rows.size)]
        snapshot_id, available = None, None
        if self.store is not None and self.weights:
            ids = self.doc_ids(snapshot)
            scores = score_features(self.store, self.weights, [ids[int(r)] for r in rows])
            adjustment += scores.adjustment
            per_hit = [scores.features_of(i) for i in range(rows.size)]
            snapshot_id = scores.snapshot_id
            available = all(batch.available for batch in scores.batches.values())
        if self.recency is not None:
            column = snapshot.metadata.numeric_column(self.recency.field)
            fresh = recency(np.asarray(column[rows], dtype=np.float64), time.time(),
                            self.recency.half_life_days)
            adjustment += self.recency.weight * normalize(fresh, "minmax")
            for values, value in zip(per_hit, fresh, strict=True):
                values["recency"] = float(value)
        return FeatureOutcome(adjustment, per_hit, snapshot_id, available)
