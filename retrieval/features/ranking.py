"""Turning features into a ranking adjustment (pure numpy), and request-time features.

``feature_adjustment`` returns ``sum_f weight_f * normalize(feature_f)`` over the candidates of
one request; add it, times ``fused_score_range`` of the request's fused scores, to them. With
the default min-max normalization every feature then contributes in ``[0, weight * range]``,
so a weight reads as "how much of the fused score range this feature may move a document"
under every fusion: min-max and z-score fused scores span about [0, 1], but RRF's span a few
thousandths (``1/(rrf_k + rank)``), where an unscaled weight of 0.05 outweighed all of fusion.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from retrieval.features.errors import FeatureConfigError
from retrieval.features.reads import FeatureBatch, FeatureStatus
from retrieval.features.view import VIEW_NAME
from retrieval.request_path.fusion import minmax

Normalization = Literal["minmax", "none", "log1p+minmax"]
SECONDS_PER_DAY = 86400.0


class FeatureWeights(BaseModel):
    """How much each feature of one view moves the final score."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    view: str = Field(pattern=VIEW_NAME.pattern, description="a feature view's name (letters, "
                      "digits, '_', '.', '-'): a name no store could hold failed every search")
    weights: dict[str, float] = Field(min_length=1, description="feature name -> weight")
    normalization: Normalization = Field(
        "minmax",
        description="minmax: over the request's candidates; log1p+minmax: signed log1p first "
        "(for heavy-tailed counts); none: raw values",
    )
    use_stale: bool = Field(True, description="False: stale values are replaced by defaults")

    @field_validator("weights")
    @classmethod
    def _finite(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {name: w for name, w in weights.items() if not math.isfinite(w)}
        if bad:
            raise ValueError(f"weights must be finite numbers, got {bad}")
        return weights


def normalize(values: np.ndarray, how: Normalization) -> np.ndarray:
    """float64 copy of ``values`` (shape ``(n,)``) normalized over its own entries.

    minmax is ``retrieval.request_path.fusion.minmax``, the one min-max of the project: [0, 1],
    and a constant column maps to 1 (every candidate equally best). ``feature_adjustment`` skips a
    constant column instead: it cannot reorder anything, so it adds nothing.
    """
    x = np.asarray(values, dtype=np.float64)
    if how == "none":
        return x.copy()
    if how == "log1p+minmax":
        x = np.sign(x) * np.log1p(np.abs(x))  # signed: defined for negatives, monotone
    return minmax(x)


def _constant(values: np.ndarray) -> bool:
    return values.size == 0 or bool(values.min() == values.max())


def feature_adjustment(batch: FeatureBatch, weights: FeatureWeights) -> np.ndarray:
    """float64 ``(len(batch),)`` score adjustment to add to the candidates' fused scores.

    All zeros when the store was unavailable (defaults carry no signal). A weighted feature the
    batch does not hold (e.g. not in the live snapshot yet) contributes nothing.
    """
    if batch.view != weights.view:
        raise FeatureConfigError(
            f"weights are for view {weights.view!r} but the batch is from {batch.view!r}"
        )
    total = np.zeros(len(batch), dtype=np.float64)
    if not batch.available:
        return total
    stale = batch.mask(FeatureStatus.STALE)
    for name, weight in weights.weights.items():
        column = batch.values.get(name)
        if column is None or weight == 0:
            continue
        values = np.asarray(column, dtype=np.float64)
        if not weights.use_stale and stale.any():
            values = np.where(stale, float(batch.defaults[name]), values)
        if weights.normalization != "none" and _constant(values):
            continue  # one value for every candidate: no signal, and no shift of the scores
        total += weight * normalize(values, weights.normalization)
    return total


def fused_score_range(fused: np.ndarray) -> float:
    """What a feature weight of 1.0 is worth in one request's fused scores (``(n,)``, one per
    candidate fused): their spread, ``max - min``.

    Min-max fusion's spread is at most 1 (0.8-0.9 is common), so there a weight moves a score
    by a little less than it did when weights were added unscaled. When the scores tie (one
    candidate, or RRF's mirrored ranks) there is no spread to be a share of: the largest
    score's magnitude, so features still break the tie on the scores' own scale; 1.0 when
    there is nothing else.
    """
    scores = np.asarray(fused, dtype=np.float64)
    if scores.size == 0:
        return 1.0
    spread = float(scores.max() - scores.min())
    if spread > 0:
        return spread
    peak = float(np.abs(scores).max())
    return peak if peak > 0 else 1.0


def recency(timestamps_epoch_s: np.ndarray, now: float, half_life_days: float) -> np.ndarray:
    """Exponential decay ``0.5 ** (age / half_life)`` in (0, 1], float64 ``(n,)``.

    A request-time feature (it depends on ``now``, so it is never materialized). Future
    timestamps count as age 0; NaN timestamps (unknown) give 0.
    """
    if not (half_life_days > 0 and math.isfinite(half_life_days)):
        raise FeatureConfigError(f"half_life_days must be a positive number, got {half_life_days}")
    t = np.asarray(timestamps_epoch_s, dtype=np.float64)
    age = np.maximum(float(now) - t, 0.0)
    decayed = np.exp2(-age / (half_life_days * SECONDS_PER_DAY))
    return np.where(np.isnan(t), 0.0, decayed)
