"""Explanations of hits (``search(..., explain=True)``): computed after the ranking from the
arrays the ranking used, for the top k only, so a search without ``explain`` pays nothing.

Per hit: its BM25 score split by analyzed query term (each term scored alone over the hit's
row, times its count in the query: the parts add up to the score), its cosine, its rank in
each leg among the re-ranked candidates, what the fusion normalized each leg with, the fused
score and what features added.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Explanation
from retrieval.request_path.fusion import ranks_desc, zscore


def explain_hits(snapshot: LoadedBuild, tokens: Sequence[str], rows: np.ndarray,
                 bm25: np.ndarray,
                 cosine: np.ndarray, final: np.ndarray, order: np.ndarray,
                 adjustment: np.ndarray | None, config: RetrieverConfig,
                 coverage: np.ndarray | None = None) -> list[Explanation]:
    """One ``Explanation`` per index of ``order`` (the hits, best first); ``final``: the
    scores hits carry (fused plus ``adjustment``, the features' part, aligned with ``order``);
    ``config``: as fused (a search without its query vector fused BM25 alone: minmax, 0);
    ``tokens``: the BM25 terms searched (a typo-corrected term carries its weight);
    ``coverage``: each hit's BM25 share of the most these terms can score, aligned with
    ``order`` (``retrieval.relevance``)."""
    weights: dict[str, float] = defaultdict(float)
    for token in tokens:
        weights[str(token)] += getattr(token, "weight", 1.0)
    top_rows = rows[order]
    parts = {term: weight * snapshot.bm25.score_rows([term], top_rows)
             for term, weight in weights.items()}
    bm25_ranks, vector_ranks = ranks_desc(bm25), ranks_desc(cosine)
    bounds = normalization(bm25, cosine, config)
    return [Explanation(
        bm25=float(bm25[i]), bm25_terms={t: float(p[j]) for t, p in parts.items() if p[j]},
        bm25_rank=int(bm25_ranks[i]), vector=float(cosine[i]), vector_rank=int(vector_ranks[i]),
        candidates=int(rows.size), fusion=config.fusion, vector_weight=config.vector_weight,
        normalization=bounds, fused=float(final[i]) - _part(adjustment, j),
        features=_part(adjustment, j), coverage=_part(coverage, j))
        for j, i in enumerate(order.tolist())]


def _part(values: np.ndarray | None, j: int) -> float:
    return float(values[j]) if values is not None else 0.0


def normalization(bm25: np.ndarray, cosine: np.ndarray, config: RetrieverConfig
                  ) -> dict[str, float]:
    """What ``fusion.fuse`` normalized each leg with over these candidates."""
    if config.fusion == "rrf":
        return {"rrf_k": float(config.rrf_k)}
    if config.fusion == "minmax" or bm25.size == 0:
        return {"bm25_min": _extreme(bm25, np.min), "bm25_max": _extreme(bm25, np.max),
                "vector_min": _extreme(cosine, np.min), "vector_max": _extreme(cosine, np.max)}
    mix = config.vector_weight * zscore(cosine) + (1 - config.vector_weight) * zscore(bm25)
    return {"bm25_mean": float(bm25.mean()), "bm25_std": float(bm25.std()),
            "vector_mean": float(cosine.mean()), "vector_std": float(cosine.std()),
            "mix_min": float(mix.min()), "mix_max": float(mix.max())}



def _extreme(values: np.ndarray, which: Any) -> float:
    """The candidates' min or max as fusion normalized by it (0.0 without candidates): not
    ``min(initial=0.0)``, which reported 0 for a minimum above it."""
    return float(which(values)) if values.size else 0.0
