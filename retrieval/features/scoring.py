"""The feature stage of the request path in one call, for the ``Retriever`` to invoke.

``score_features`` reads every weighted view for the candidates (one round trip per view) and
sums their ``feature_adjustment``s; it never raises for store failures (reads fail open).
``snapshot_key`` names the feature snapshots a result depends on, without I/O, for result-cache
keys: it may lag one read behind a flip, which the result TTL bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.features.ranking import FeatureWeights, feature_adjustment
from retrieval.features.reads import FeatureBatch, FeatureStatus
from retrieval.features.store import OnlineStore


@dataclass(frozen=True)
class FeatureScores:
    """Score adjustment (float64, ``(n,)``, add to fused scores) and the batches behind it."""

    adjustment: np.ndarray
    batches: dict[str, FeatureBatch]

    @property
    def snapshot_id(self) -> str | None:
        """``view=snapshot`` pairs read (";"-joined), or None when no view was read."""
        if not self.batches:
            return None
        return ";".join(f"{view}={batch.snapshot_id or '-'}"
                        for view, batch in sorted(self.batches.items()))

    def status_of(self, index: int) -> dict[str, str]:
        """Per view, whether one candidate's values were ``present``, ``stale`` (older than
        the view's max age, still served) or ``missing`` (defaults served: a document written
        after the last materialization, or the store unreachable)."""
        return {view: FeatureStatus(int(batch.status[index])).name.lower()
                for view, batch in self.batches.items()}

    def features_of(self, index: int) -> dict[str, bool | int | float]:
        """One candidate's feature values, typed as their views declare them (for
        ``Hit.features``); later views win on a clash."""
        merged: dict[str, bool | int | float] = {}
        for batch in self.batches.values():
            merged.update(batch.row(index))
        return merged


def score_features(store: OnlineStore, weights: Sequence[FeatureWeights],
                   entity_ids: Sequence[str]) -> FeatureScores:
    """Read each weighted view for ``entity_ids`` and sum the adjustments."""
    total = np.zeros(len(entity_ids), dtype=np.float64)
    batches: dict[str, FeatureBatch] = {}
    for view_weights in weights:
        batch = store.read(view_weights.view, entity_ids)
        total += feature_adjustment(batch, view_weights)
        batches[view_weights.view] = batch
    return FeatureScores(adjustment=total, batches=batches)


def snapshot_key(store: OnlineStore, weights: Sequence[FeatureWeights]) -> str:
    """Stable text naming the snapshots last read for ``weights`` (no I/O; "" for none)."""
    return ";".join(f"{view}={store.last_snapshot_id(view) or '-'}"
                    for view in sorted({w.view for w in weights}))
