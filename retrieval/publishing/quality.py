"""Checks that search both builds: canary overlap@k, expected-id recall, labeled-log nDCG@k."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from indexes.encoders import Encoder
from retrieval.publishing.config import Canary, GateConfig, LabeledQuery
from retrieval.retriever import Retriever

Ranking = list[str]


class QueryVectors:
    """Query vectors per encoder and text: each text is encoded once per gate run, however
    many checks and builds use it (encoding dominates the gate's time)."""

    def __init__(self) -> None:
        self._vectors: dict[tuple[str, str], np.ndarray] = {}
        self.seconds = 0.0  # spent encoding

    def get(self, encoder: Encoder, texts: Sequence[str]) -> np.ndarray:
        key = encoder.encoder_id
        missing = list(dict.fromkeys(t for t in texts if (key, t) not in self._vectors))
        if missing:
            started = time.perf_counter()
            encoded = encoder.encode(missing)
            self.seconds += time.perf_counter() - started
            for text, vector in zip(missing, encoded, strict=True):
                self._vectors[(key, text)] = vector
        return np.stack([self._vectors[(key, t)] for t in texts])


def rankings(retriever: Retriever, queries: Sequence[str], k: int,
             vectors: QueryVectors) -> list[Ranking]:
    """Top-k doc ids per query, searched with the given vectors (no encode per search); a
    passage build ranks documents by their best passage, as a whole-document build does."""
    if retriever.encoder is None:
        raise ValueError("no query encoder")
    matrix = vectors.get(retriever.encoder, queries)
    results = retriever.search_batch(list(queries), k=k, query_vectors=matrix,
                                     group_by="document")
    return [[hit.doc_id for hit in result.hits] for result in results]


def overlap_at_k(a: Ranking, b: Ranking, k: int) -> float:
    """|top-k(a) ∩ top-k(b)| / max(|top-k(a)|, |top-k(b)|): 1.0 when both return the same
    documents, however few.

    Not over ``k``: a filter or a small build can leave fewer than k hits, and two identical
    short (or empty) rankings are no change, which a gate must not refuse. The larger side is
    the denominator, so a build that loses hits still lowers the overlap.
    """
    top_a, top_b = set(a[:k]), set(b[:k])
    if not top_a and not top_b:
        return 1.0
    return len(top_a & top_b) / max(len(top_a), len(top_b))


def recall_at_k(ranking: Ranking, expected: Sequence[str], k: int) -> float:
    return len(set(ranking[:k]) & set(expected)) / len(expected)


def ndcg_at_k(ranking: Ranking, relevant: dict[str, int], k: int) -> float:
    """nDCG@k with linear gains (trec_eval's): sum rel_i / log2(i + 1), ideal from the labels."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranking[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def canary_figures(live: list[Ranking], candidate: list[Ranking], canaries: Sequence[Canary],
                   k: int) -> dict[str, object]:
    overlaps = [overlap_at_k(a, b, k) for a, b in zip(live, candidate, strict=True)]
    worst = int(np.argmin(overlaps))
    figures: dict[str, object] = {
        "canaries": len(canaries), "mean_overlap": float(np.mean(overlaps)),
        "min_overlap": overlaps[worst], "worst_canary": canaries[worst].query,
        "overlaps": overlaps,
    }
    judged = [(i, c) for i, c in enumerate(canaries) if c.expected]
    if judged:
        figures["with_expected"] = len(judged)
        figures["expected_recall_live"] = float(np.mean(
            [recall_at_k(live[i], c.expected, k) for i, c in judged]))
        figures["expected_recall_candidate"] = float(np.mean(
            [recall_at_k(candidate[i], c.expected, k) for i, c in judged]))
    return figures


def labeled_figures(live: list[Ranking], candidate: list[Ranking],
                    labeled: Sequence[LabeledQuery], k: int) -> dict[str, float]:
    before = float(np.mean([ndcg_at_k(r, q.relevant, k) for r, q in zip(live, labeled,
                                                                        strict=True)]))
    after = float(np.mean([ndcg_at_k(r, q.relevant, k) for r, q in zip(candidate, labeled,
                                                                       strict=True)]))
    return {"queries": len(labeled), "ndcg_live": before, "ndcg_candidate": after,
            "drop": before - after}


def within(gate: GateConfig, figures: dict[str, object]) -> tuple[bool, bool]:
    """(overlap ok, expected recall ok) of canary figures against the gate's thresholds."""
    mean, low = float(figures["mean_overlap"]), float(figures["min_overlap"])  # type: ignore[arg-type]
    overlap_ok = mean >= gate.min_canary_overlap and low >= gate.min_canary_overlap_each
    recall = figures.get("expected_recall_candidate")
    recall_ok = recall is None or float(recall) >= gate.min_expected_recall  # type: ignore[arg-type]
    return overlap_ok, recall_ok
