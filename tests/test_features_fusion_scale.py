"""A feature weight is a share of the fused scores' range under every fusion.

Min-max and z-score fused scores span about [0, 1], RRF's a few thousandths
(``1/(rrf_k + rank)``): a weight of 0.05 added unscaled ranked RRF results by the feature alone
(top-10 overlap 0.2 with the featureless ranking, 0.9 under min-max). ``fused_score_range``
is what one unit of weight is worth in a request's fused scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from small_index import index_fixture  # noqa: F401 (fixture)

from retrieval import Retriever
from retrieval.features import CallableSource, Feature, FeatureView, LocalStore, materialize
from retrieval.features.ranking import fused_score_range
from retrieval.request_path.fusion import linear_fusion, minmax, rrf_fusion, zscore_fusion

WEIGHT = 0.05
RRF_K = 60
FUSIONS = {"minmax": lambda b, c: linear_fusion(b, c, 0.5),
           "zscore": lambda b, c: zscore_fusion(b, c, 0.5),
           "rrf": lambda b, c: rrf_fusion(b, c, RRF_K)}


def legs(n: int = 300, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """BM25 scores and cosines of ``n`` candidates, shaped like a real search's."""
    rng = np.random.default_rng(seed)
    return rng.gamma(2.0, 4.0, n), rng.uniform(0.1, 0.8, n).astype(np.float32)


def ranking(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")]


def test_the_range_is_the_spread_of_the_fused_scores() -> None:
    assert fused_score_range(np.array([0.2, 0.9, 0.5])) == pytest.approx(0.7)
    bm25, cosine = legs()
    rrf = rrf_fusion(bm25, cosine, RRF_K)
    assert fused_score_range(rrf) == pytest.approx(rrf.max() - rrf.min())
    assert fused_score_range(rrf) < 2 / (RRF_K + 1)  # a few hundredths at most


def test_a_tie_is_worth_its_own_scale_and_nothing_is_worth_one() -> None:
    """No spread to be a share of: features still break the tie, on the scores' scale (a
    min-max tie is 1.0 everywhere, which keeps the unscaled weight)."""
    assert fused_score_range(np.ones(4)) == 1.0
    assert fused_score_range(np.full(2, 1 / 61 + 1 / 62)) == pytest.approx(1 / 61 + 1 / 62)
    assert fused_score_range(np.array([0.0, 0.0])) == 1.0
    assert fused_score_range(np.empty(0)) == 1.0


@pytest.mark.parametrize("fusion", sorted(FUSIONS))
def test_a_weight_reorders_alike_under_every_fusion(fusion: str) -> None:
    """Scaled, a fused ranking plus features is the ranking of the fused scores mapped onto
    [0, 1] plus the unscaled features: the fusion's own scale no longer matters."""
    bm25, cosine = legs()
    fused = FUSIONS[fusion](bm25, cosine)
    adjustment = WEIGHT * minmax(np.random.default_rng(3).uniform(0, 1000, fused.size))
    scaled = fused + fused_score_range(fused) * adjustment
    assert ranking(scaled) == ranking(minmax(fused) + adjustment)
    moved = scaled - fused
    assert moved.max() <= WEIGHT * (fused.max() - fused.min()) + 1e-12


def test_unscaled_rrf_scores_are_ranked_by_the_feature_alone() -> None:
    """Why the scale is needed: RRF's spread is smaller than the weight."""
    bm25, cosine = legs()
    fused = rrf_fusion(bm25, cosine, RRF_K)
    adjustment = WEIGHT * minmax(np.random.default_rng(3).uniform(0, 1000, fused.size))
    top = set(ranking(fused)[:10])
    unscaled = set(ranking(fused + adjustment)[:10])
    scaled = set(ranking(fused + fused_score_range(fused) * adjustment)[:10])
    assert len(top & unscaled) < len(top & scaled)


@pytest.fixture(scope="module")
def clicks_store(index: Path, encoder: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> LocalStore:
    """Clicks growing with the document id: a feature unrelated to the query."""
    store = LocalStore(tmp_path_factory.mktemp("fusion-scale") / "features")
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=encoder) as plain:
        ids = plain.snapshot.docs.all_ids()
    view = FeatureView(name="popularity",
                       features=(Feature(name="clicks", dtype="float32", default=0.0),))
    materialize(view, CallableSource(lambda: [{"doc_id": d, "clicks": float(int(d))}
                                              for d in ids]), store, progress=False)
    return store


@pytest.mark.parametrize("fusion", ["minmax", "zscore", "rrf"])
def test_a_search_moves_a_hit_by_at_most_its_weight_of_the_fused_range(
        index: Path, encoder: Any, clicks_store: LocalStore, fusion: str) -> None:
    """RRF's fused scores of any candidates span less than 2 / (rrf_k + 1); min-max's and
    z-score's at most 1."""
    config = {"cache": {"backend": "none"}, "fusion": fusion, "rrf_k": RRF_K,
              "features": [{"view": "popularity", "weights": {"clicks": WEIGHT}}]}
    with Retriever.load(index, config, encoder=encoder, feature_store=clicks_store) as ranked:
        hits = ranked.search("boundary layer heat transfer", k=10, explain=True).hits
    span = 2 / (RRF_K + 1) if fusion == "rrf" else 1.0
    added = [h.explanation.features for h in hits if h.explanation is not None]
    assert len(added) == 10 and max(added) > 0
    assert all(0 <= a <= WEIGHT * span for a in added), added
