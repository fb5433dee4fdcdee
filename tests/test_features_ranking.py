"""Ranking helpers: feature_adjustment and recency (pure numpy, no store needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from retrieval.features import (
    FeatureBatch,
    FeatureConfigError,
    FeatureStatus,
    FeatureWeights,
    feature_adjustment,
    normalize,
    recency,
)
from retrieval.request_path.fusion import minmax


def batch(popularity: list[float], status: list[int] | None = None, available: bool = True,
          view: str = "signals") -> FeatureBatch:
    n = len(popularity)
    return FeatureBatch(
        view=view, entity_ids=tuple(f"d{i}" for i in range(n)),
        values={"popularity": np.asarray(popularity, dtype=np.float32),
                "clicks": np.arange(n, dtype=np.int64) * 1000},
        status=np.asarray(status if status is not None else [0] * n, dtype=np.int8),
        event_time=np.zeros(n), defaults={"popularity": 0.0, "clicks": 0},
        snapshot_id="s1", available=available,
    )


def ranking(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")]


@pytest.mark.parametrize("normalization", ["minmax", "none", "log1p+minmax"])
def test_adjustment_moves_ranking_in_the_direction_of_the_weight(normalization: str) -> None:
    fused = np.array([0.9, 0.8, 0.7])  # d0 first on text relevance alone
    features = batch([1.0, 50.0, 1000.0])  # d2 is by far the most popular
    up = FeatureWeights(view="signals", weights={"popularity": 1.0},
                        normalization=normalization)  # type: ignore[arg-type]
    down = up.model_copy(update={"weights": {"popularity": -1.0}})
    assert ranking(fused) == [0, 1, 2]
    assert ranking(fused + feature_adjustment(features, up))[0] == 2
    assert ranking(fused + feature_adjustment(features, down)) == [0, 1, 2]
    lifted = feature_adjustment(features, up)
    assert lifted.dtype == np.float64 and np.all(np.diff(lifted) > 0)
    assert np.all(np.diff(feature_adjustment(features, down)) < 0)


def test_minmax_contributions_stay_within_the_weight() -> None:
    features = batch([3.0, 7.0, 5.0])
    weights = FeatureWeights(view="signals", weights={"popularity": 0.2, "clicks": 0.1})
    adjustment = feature_adjustment(features, weights)
    np.testing.assert_allclose(adjustment, [0.0, 0.2 + 0.05, 0.1 + 0.1])


def test_no_signal_means_no_adjustment() -> None:
    weights = FeatureWeights(view="signals", weights={"popularity": 1.0, "unknown": 5.0})
    assert not feature_adjustment(batch([2.0, 2.0]), weights).any()  # constant column
    assert not feature_adjustment(batch([1.0, 9.0], available=False), weights).any()
    assert feature_adjustment(batch([]), weights).shape == (0,)
    with pytest.raises(FeatureConfigError, match="view"):
        feature_adjustment(batch([1.0], view="other"), weights)


def test_stale_values_can_be_replaced_by_defaults() -> None:
    stale = int(FeatureStatus.STALE)
    features = batch([1.0, 9.0, 5.0], status=[0, stale, 0])
    keep = FeatureWeights(view="signals", weights={"popularity": 1.0})
    drop = keep.model_copy(update={"use_stale": False})
    assert ranking(feature_adjustment(features, keep))[0] == 1
    assert ranking(feature_adjustment(features, drop))[0] == 2


def test_weights_config_is_strict() -> None:
    with pytest.raises(ValidationError):
        FeatureWeights(view="v", weights={"a": float("nan")})
    with pytest.raises(ValidationError):
        FeatureWeights(view="v", weights={"a": 1.0}, normalisation="none")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        FeatureWeights(view="v", weights={"a": 1.0}, normalization="zscore")  # type: ignore[arg-type]


def test_one_minmax_and_a_constant_column_adds_nothing() -> None:
    """Features and fusion share ``retrieval.request_path.fusion.minmax``: a constant column
    normalizes to 1 in both; the feature stage then skips it, since it cannot reorder the
    candidates."""
    values = np.array([4.0, -2.0, 9.5, 0.0])
    np.testing.assert_array_equal(normalize(values, "minmax"), minmax(values))
    np.testing.assert_array_equal(normalize(values, "log1p+minmax"),
                                  minmax(np.sign(values) * np.log1p(np.abs(values))))
    constant = np.array([2.0, 2.0, 2.0])
    np.testing.assert_array_equal(normalize(constant, "minmax"), minmax(constant))
    assert normalize(constant, "minmax").tolist() == [1.0, 1.0, 1.0]
    for how in ("minmax", "log1p+minmax"):
        weights = FeatureWeights(view="signals", weights={"popularity": 0.5},
                                 normalization=how)  # type: ignore[arg-type]
        assert feature_adjustment(batch([2.0, 2.0, 2.0]), weights).tolist() == [0.0, 0.0, 0.0]
    raw = FeatureWeights(view="signals", weights={"popularity": 0.5}, normalization="none")
    assert feature_adjustment(batch([2.0, 2.0]), raw).tolist() == [1.0, 1.0]  # raw values count


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e12, 1e12), min_size=1, max_size=50),
       st.sampled_from(["minmax", "log1p+minmax"]))
def test_normalize_is_monotone_and_bounded(values: list[float], how: str) -> None:
    x = np.asarray(values)
    y = normalize(x, how)  # type: ignore[arg-type]
    assert np.all((y >= 0) & (y <= 1))
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(y[order]) >= -1e-12)


def test_recency_halves_every_half_life() -> None:
    now = 1_700_000_000.0
    day = 86400.0
    stamps = np.array([now, now - 7 * day, now - 14 * day, now + day, np.nan])
    np.testing.assert_allclose(recency(stamps, now, half_life_days=7), [1, 0.5, 0.25, 1, 0])
    assert recency(stamps, now, 7).dtype == np.float64
    with pytest.raises(FeatureConfigError):
        recency(stamps, now, half_life_days=0)


def test_score_features_reads_every_view_and_sums(tmp_path: Path) -> None:
    from test_features_support import quality_rows, quality_view

    from retrieval.features import LocalStore, materialize, score_features, snapshot_key

    store = LocalStore(tmp_path / "fs")
    weights = [FeatureWeights(view="quality", weights={"quality": 0.5}),
               FeatureWeights(view="absent", weights={"x": 1.0})]
    assert snapshot_key(store, weights) == "absent=-;quality=-"
    report = materialize(quality_view(), lambda: quality_rows(5), store, progress=False)
    scores = score_features(store, weights, ["doc-4", "doc-0", "nope"])
    np.testing.assert_allclose(scores.adjustment, [0.5, 0.1, 0.0])  # nope: default -1
    assert scores.snapshot_id == f"absent=-;quality={report.snapshot_id}"
    assert snapshot_key(store, weights) == f"absent=-;quality={report.snapshot_id}"
    assert scores.features_of(0)["quality"] == 4.0
