"""The dense leg as a faiss HNSW graph (inner product), the alternative to ``ann``'s IVF.

Built at build time and stored as ``ann/hnsw.faiss`` plus ``ann/ann.json``. ``efSearch`` is
calibrated per result size: for each k of ``CALIBRATED_KS`` the smallest ef of ``EF_LADDER``
whose recall@k against exact search, on a sample of the corpus' own vectors as queries, is at
least ``CALIBRATION_RECALL``. A search for k rows uses the ef calibrated for the smallest
calibrated k >= k, so a small dense leg (C' = 30) pays for recall@30, not recall@100.

Filters stay exact as with IVF: the mask goes to faiss as an ``IDSelectorBitmap``; when fewer
rows than wanted come back ef widens x4 up to ``MAX_EF``, then exact search over the allowed
rows; small allowed sets are searched exactly. A graph whose recall stops gaining short of
the target as ef widens falls back to the exact scan (``calibrated_ef``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from indexes.ann_built import BuiltDense, exact_fallback_of
from indexes.ann_exact import TARGET_RECALL, WideningDense, gathered_scores, recall_at
from indexes.vectors import VectorStore

HNSW_FILE = "hnsw.faiss"
M = 32  # graph degree: faiss' usual choice for 384-d embeddings
EF_CONSTRUCTION = 80
EF_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
CALIBRATED_KS = (10, 30, 100)
MAX_EF = 4096
# Corpus vectors as queries flatter HNSW more than IVF: on SciFact the ef reaching 0.99 on them
# (96) gave the real test queries 0.970 at k=100. Calibrating to 0.995 leaves that margin.
CALIBRATION_RECALL = 0.995
# Recall gained by the ladder's last step below which widening is judged to buy nothing (one
# row of 200 queries x k=10 is 0.0005).
PLATEAU = 1e-4


def hnsw_params(ef: int) -> Any:
    import faiss

    params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # not in the stubs
    params.efSearch = ef
    return params


class HnswDense(WideningDense):
    """faiss HNSW-Flat (inner product) with ef calibrated per k; filter-aware."""

    kind = "hnsw"

    def __init__(self, vectors: VectorStore, index: Any, ef_by_k: dict[int, int]) -> None:
        super().__init__(vectors)
        self.index = index
        self.ef_by_k = dict(sorted(ef_by_k.items()))

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "M": M, "ef_search": self.ef_by_k}

    def ef_for(self, k: int) -> int:
        """The ef calibrated for the smallest calibrated k >= ``k`` (scaled past the last)."""
        for calibrated, ef in self.ef_by_k.items():
            if calibrated >= k:
                return ef
        last_k, last_ef = list(self.ef_by_k.items())[-1]
        return int(np.ceil(last_ef * k / last_k))

    def first_breadth(self, k: int) -> int:
        return self.ef_for(k)

    def last_breadth(self) -> int:
        return MAX_EF

    def search_params(self, breadth: int) -> Any:
        return hnsw_params(breadth)


def make_hnsw(matrix: np.ndarray, *, calibration_queries: int = 200, seed: int = 0
              ) -> BuiltDense:
    """Build and calibrate the HNSW graph of ``matrix`` float32 (n, d) C-contiguous; its meta
    holds the recall ladder per k."""
    import faiss

    n, dim = matrix.shape
    index = faiss.IndexHNSWFlat(dim, M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.add(matrix)
    rng = np.random.default_rng(seed)
    queries = matrix[rng.choice(n, size=min(n, calibration_queries), replace=False)]
    ladders = calibrate_hnsw(index, matrix, queries)
    ef_by_k = calibrated_ef(ladders)
    calibration = {str(k): [{"ef": ef, f"recall_at_{k}": round(r, 4)} for ef, r in ladder]
                   for k, ladder in ladders.items()}
    if ef_by_k is None:
        return trapped_fallback(n, ladders, calibration)
    meta = {"kind": "hnsw", "n_docs": n, "M": M, "ef_construction": EF_CONSTRUCTION,
            "ef_search": {str(k): ef for k, ef in ef_by_k.items()},
            "target_recall_at_100": TARGET_RECALL, "calibrated_to": CALIBRATION_RECALL,
            "calibration": calibration}
    return BuiltDense(meta, index, HNSW_FILE)


def calibrated_ef(ladders: dict[int, list[tuple[int, float]]]) -> dict[int, int] | None:
    """Per k the smallest ef reaching ``CALIBRATION_RECALL``; ``MAX_EF`` where the ladder
    was still gaining at its widest step; None where it had stopped gaining short of it: the
    graph cannot reach those rows at any breadth (a clique of duplicate vectors can trap its
    searches), and ef 4,096 would cost ~66x for nothing."""
    ef_by_k = {}
    for k, ladder in ladders.items():
        reached = next((ef for ef, r in ladder if r >= CALIBRATION_RECALL), None)
        if reached is None and len(ladder) > 1 and ladder[-1][1] - ladder[-2][1] < PLATEAU:
            return None
        ef_by_k[k] = reached if reached is not None else MAX_EF
    return ef_by_k


def trapped_fallback(n: int, ladders: dict[int, list[tuple[int, float]]],
                     calibration: dict[str, Any]) -> BuiltDense:
    """The exact scan, with ``ann.json`` saying why: an HNSW graph whose recall stopped
    gaining below the target (as IVF falls back when only every list reaches it)."""
    k, ladder = next((k, ladder) for k, ladder in ladders.items()
                     if ladder[-1][1] < CALIBRATION_RECALL)
    reason = (f"HNSW (M {M}) stopped gaining recall@{k} at {ladder[-1][1]:.4f} by ef "
              f"{ladder[-1][0]}, short of {CALIBRATION_RECALL}: its graph cannot reach some "
              "rows (duplicate vectors can trap it), so the dense leg is the exact scan")
    return exact_fallback_of(n, reason, calibration)


def calibrate_hnsw(index: Any, matrix: np.ndarray, queries: np.ndarray,
                   stop_at: float = 0.999) -> dict[int, list[tuple[int, float]]]:
    """Recall@k against exact search per ef of the ladder, for each calibrated k."""
    import faiss

    exact = faiss.IndexFlatIP(matrix.shape[1])
    exact.add(matrix)
    _, truth = exact.search(queries, max(CALIBRATED_KS))
    scores_of = gathered_scores(matrix, queries)
    ladders: dict[int, list[tuple[int, float]]] = {}
    for k in CALIBRATED_KS:
        ladder = ladders[k] = []
        for ef in EF_LADDER:
            _, found = index.search(queries, k, params=hnsw_params(ef))
            ladder.append((ef, recall_at(found, truth[:, :k], scores_of)))
            if ladder[-1][1] >= stop_at:
                break
    return ladders


def load_hnsw(directory: Path, vectors: VectorStore, meta: dict[str, Any]) -> HnswDense:
    import faiss

    ef_by_k = {int(k): int(ef) for k, ef in meta["ef_search"].items()}
    return HnswDense(vectors, faiss.read_index(str(directory / HNSW_FILE)), ef_by_k)
