"""Fitting and checking the relevance score (``retrieval.relevance``) on judged queries.

``calibrate`` searches the judged queries, takes each query's top ``k`` hits as examples
(features: cosine, BM25 coverage from the hit's explanation, rank; label: relevant in the
qrels)
and fits the logistic model. ``reliability`` bins queries by their top hit's relevance and
reports, per bin, the share whose top hit is relevant: a calibrated score makes that share rise
with the score and sit near the bin's mean estimate. ``split`` cuts a collection's judged
queries into a training and a held-out half by a hash of the query id (stable everywhere).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.corpus import read_qrels, read_queries
from retrieval.relevance import Calibration, fit_calibration
from retrieval.request_path.validate import MAX_DEADLINE_MS


@dataclass(frozen=True)
class JudgedHits:
    """Top hits of judged queries: features float64 (n, 3) (cosine, coverage, rank), labels (n,)
    0/1, and per query its top hit's row in them (-1 for a query with no hits)."""

    features: np.ndarray
    labels: np.ndarray
    top: np.ndarray

    def top_labels(self) -> np.ndarray:
        return np.where(self.top >= 0, self.labels[np.maximum(self.top, 0)], 0)


def judged_hits(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]],
                k: int = 10, batch: int = 64) -> JudgedHits:
    """Search every judged query (``retriever``: a ``Retriever``) and label its top ``k``."""
    features: list[tuple[float, float, int]] = []
    labels: list[int] = []
    top: list[int] = []
    ids = [q for q in queries if q in qrels and queries[q].strip()]  # an empty text: no hits
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        # The longest budget there is: under the serving deadline a batch's later queries
        # would come back ranked by BM25 alone, and the fit would learn from those.
        results = retriever.search_batch([queries[q] for q in chunk], k=k, explain=True,
                                         deadline_ms=MAX_DEADLINE_MS)
        for qid, result in zip(chunk, results, strict=True):
            top.append(len(labels) if result.hits else -1)
            for rank, hit in enumerate(result.hits, start=1):
                why = hit.explanation
                features.append((hit.vector_score, why.coverage if why is not None else 0.0,
                                 rank))
                labels.append(int(qrels[qid].get(hit.doc_id, 0) > 0))
    return JudgedHits(np.asarray(features, dtype=np.float64).reshape(-1, 3),
                      np.asarray(labels, dtype=np.int8), np.asarray(top, dtype=np.int64))


def calibrate(retriever: Any, queries: Mapping[str, str],
              qrels: Mapping[str, Mapping[str, int]], k: int = 10, name: str = "judged"
              ) -> tuple[Calibration, JudgedHits]:
    """Fit a ``Calibration`` for ``retriever``'s model on judged queries; with the judged
    hits it was fitted on (for ``reliability``)."""
    judged = judged_hits(retriever, queries, qrels, k)
    return fit_judged({name: judged}, retriever.snapshot.manifest.encoder.model, k), judged


def fit_judged(parts: Mapping[str, JudgedHits], model: str, k: int = 10) -> Calibration:
    """One ``Calibration`` over the judged hits of several collections (same model)."""
    return fit_calibration(np.concatenate([p.features for p in parts.values()]),
                           np.concatenate([p.labels for p in parts.values()]), model,
                           fitted_on={name: int(p.top.size) for name, p in parts.items()},
                           hits_per_query=k)


def reliability(calibration: Calibration, judged: JudgedHits, bins: int = 4
                ) -> list[dict[str, float]]:
    """Queries in ``bins`` equal-count bins of their top hit's relevance, lowest first: per bin
    its score range, the mean estimate and the share of top hits that are relevant."""
    answered = judged.top >= 0
    rows = judged.top[answered]
    scores = calibration.score(*judged.features[rows].T)
    relevant = judged.labels[rows].astype(np.float64)
    order = np.argsort(scores, kind="stable")
    table = []
    for part in np.array_split(order, bins):
        if part.size:
            table.append({"low": float(scores[part].min()), "high": float(scores[part].max()),
                          "queries": int(part.size), "estimate": float(scores[part].mean()),
                          "relevant": float(relevant[part].mean())})
    return table


def precision_above(calibration: Calibration, judged: JudgedHits, threshold: float
                    ) -> tuple[float, int]:
    """(share of top hits that are relevant, how many) among queries whose top hit's relevance
    is at least ``threshold`` (``min_score``); (nan, 0) when none is."""
    rows = judged.top[judged.top >= 0]
    scores = calibration.score(*judged.features[rows].T)
    kept = scores >= threshold
    if not kept.any():
        return float("nan"), 0
    return float(judged.labels[rows][kept].mean()), int(kept.sum())


def threshold_for(calibration: Calibration, judged: JudgedHits, precision: float,
                  min_queries: int = 10) -> float:
    """The lowest ``min_score`` whose kept top hits reach ``precision`` on these queries (at
    least ``min_queries`` kept), from the top hits' own scores; 1.0 when none does."""
    rows = judged.top[judged.top >= 0]
    scores = calibration.score(*judged.features[rows].T)
    order = np.argsort(scores, kind="stable")
    scores, relevant = scores[order], judged.labels[rows][order].astype(np.float64)
    kept = np.arange(scores.size, 0, -1)  # a threshold at scores[i] keeps i and all above it
    shares = np.cumsum(relevant[::-1])[::-1] / kept
    first_of_ties = np.r_[True, scores[1:] != scores[:-1]]
    fits = np.flatnonzero(first_of_ties & (kept >= min_queries) & (shares >= precision))
    return float(scores[fits[0]]) if fits.size else 1.0


def judged_splits(folder: Path) -> tuple[dict[str, str], dict[str, dict[str, int]],
                                         dict[str, dict[str, int]]]:
    """(queries, training qrels, held-out qrels) of a BEIR folder: its ``qrels/train.tsv``
    and ``qrels/test.tsv`` when both exist (SciFact), else halves of ``test.tsv`` (``split``)."""
    queries = read_queries(folder / "queries.jsonl")
    test = read_qrels(folder / "qrels" / "test.tsv")
    if (folder / "qrels" / "train.tsv").is_file():
        return queries, read_qrels(folder / "qrels" / "train.tsv"), test
    train = split(test, "train")
    return (queries, {q: j for q, j in test.items() if q in train},
            {q: j for q, j in test.items() if q not in train})


def split(qrels: Mapping[str, Any], part: str) -> set[str]:
    """The ``"train"`` or ``"held_out"`` half of judged query ids, by crc32 of the id."""
    want = 0 if part == "train" else 1
    return {q for q in qrels if zlib.crc32(q.encode()) % 2 == want}
