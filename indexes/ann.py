"""The dense leg: approximate nearest neighbours over every document vector (faiss IVF with
8-bit lists; HNSW in ``indexes.ann_hnsw``, chosen by ``BuildConfig.ann``).

Built at build time from the float32 vectors (the lists trained in two levels on a sample,
``indexes.ann_train``; every vector added to its nearest list, found from 8-bit products at
scale, ``indexes.ann_assign``) and stored as
``ann/ivf.faiss`` (checksummed in the manifest like every file) plus ``ann/ann.json`` (kind,
nlist, nprobe). The lists hold each vector in 8 bits a dimension (faiss' ``QT_8bit``: a range
per dimension, as the re-rank store ``indexes.vectors`` keeps them), a quarter of float32's
bytes: at 10M vectors 3.9 GB instead of 15.4, which is what lets a 10M build's lists stay in
memory. ``nprobe`` is the smallest value of a ladder whose recall@100 against exact search
over those same 8-bit vectors, measured at build time on a sample of the corpus' own vectors
used as queries, is at least ``CALIBRATION_RECALL`` (0.99, so that real queries reach
``TARGET_RECALL`` 0.98; tests/test_dense_leg.py checks that against exact search over the
re-rank store). Calibrating against float32 neighbours instead would charge the probing for
the 8 bits' rounding: on clustered vectors that capped recall near 0.99 whatever ``nprobe``.
Builds whose lists are float32 (IVF-Flat, written before) load and search as they were.

Filters stay exact: the filter mask is handed to faiss as an ``IDSelectorBitmap``, so only
allowed rows can come back; when that returns fewer rows than asked, the probe count widens,
and small allowed sets (or a last resort) are searched exactly over the allowed rows.

Builds made before the dense leg existed have no ``ann/`` directory: they load an
``ExactDense`` leg instead (exact inner products over the stored vectors, same answers,
slower at scale) and a warning says to rebuild.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexes.ann_assign import add_to_lists
from indexes.ann_built import BuiltDense, Rebalance, exact_fallback_of, stay
from indexes.ann_coarse import coarse_lists, search_lists
from indexes.ann_exact import (
    TARGET_RECALL,
    ExactDense,
    WideningDense,
    gathered_scores,
    recall_at,
)
from indexes.ann_hnsw import load_hnsw, make_hnsw
from indexes.ann_train import exact_neighbours, train_two_level
from indexes.storage import read_json
from indexes.vectors import VectorStore

log = logging.getLogger(__name__)

ANN_DIR = "ann"
AnnKind = Literal["ivf", "hnsw"]
INDEX_FILE = "ivf.faiss"
# Calibration queries are the corpus' own vectors, which sit closer to their neighbours than
# real queries do: at the nprobe reaching 0.98 on them, SciFact's test queries measured 0.970.
# Calibrating to 0.99 leaves that margin.
CALIBRATION_RECALL = 0.99
NPROBE_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Below this many documents per list IVF would train on too few points: exact search instead.
MIN_POINTS_PER_LIST = 39
# IVF trains on this many sampled points per list: at 111k clustered vectors 40 trained in
# 5.0 s against 7.5 s for 64, and calibrated to the same nprobe (benchmarks/README.md).
TRAIN_POINTS_PER_LIST = 40
# Lists from which they train in two levels (indexes.ann_train). Below, faiss' flat k-means
# costs about a second (40 x 256^2 x 384 x 25 rounds = 2.5e10 multiply-adds at most) and
# small builds keep the lists, and the figures measured on them, they had.
TWO_LEVEL_LISTS = 256


def default_nlist(n_docs: int) -> int:
    """~4 sqrt(n) lists, capped so every list trains on >= 39 points; 0 = exact (tiny corpus)."""
    nlist = min(int(4 * np.sqrt(n_docs)), n_docs // MIN_POINTS_PER_LIST)
    return nlist if nlist >= 16 else 0


def ivf_params(nprobe: int) -> Any:
    """faiss search parameters for one IVF search (the stubs lack the keyword constructor)."""
    import faiss

    params = faiss.SearchParametersIVF()
    params.nprobe = nprobe
    return params


class IvfDense(WideningDense):
    """faiss IVF (inner product, 8-bit or float32 lists) with a calibrated ``nprobe``;
    filter-aware."""

    kind = "ivf"

    def __init__(self, vectors: VectorStore, index: Any, nprobe: int) -> None:
        super().__init__(vectors)
        self.index = index
        self.nprobe = nprobe
        self.coarse = coarse_lists(index)

    @property
    def nlist(self) -> int:
        return int(self.index.nlist)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "nlist": self.nlist, "nprobe": self.nprobe}

    def first_breadth(self, k: int) -> int:
        return self.nprobe

    def last_breadth(self) -> int:
        return self.nlist

    def search_params(self, breadth: int) -> Any:
        return ivf_params(breadth)

    def search_once(self, query: np.ndarray, k: int, breadth: int, params: Any
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The lists chosen by ``indexes.ann_coarse`` (the same ones faiss would choose),
        searched by faiss; every list at once is faiss' own search."""
        if self.coarse is None or breadth >= self.nlist:
            return super().search_once(query, k, breadth, params)
        lists, scores = self.coarse.nearest(query, breadth)
        return search_lists(self.index, query, k, lists, scores, params)


def build_ann(matrix: np.ndarray, directory: Path, *, kind: AnnKind = "ivf",
              nlist: int | None = None, calibration_queries: int = 200, seed: int = 0
              ) -> dict[str, Any]:
    """Build, calibrate and save the dense leg of ``matrix`` under ``directory``
    (``make_dense``); returns what was written to ``ann.json``."""
    return make_dense(matrix, kind=kind, nlist=nlist, calibration_queries=calibration_queries,
                      seed=seed).save(directory)


def make_dense(matrix: np.ndarray, *, kind: AnnKind = "ivf", nlist: int | None = None,
               calibration_queries: int = 200, seed: int = 0, rebalance: Rebalance = stay
               ) -> BuiltDense:
    """Build and calibrate the dense leg (``kind`` IVF or HNSW) of ``matrix`` float32 (n, d);
    its meta holds the recall ladder. Corpora too small for IVF lists get exact search
    whatever the kind. ``rebalance``: called between the IVF fill's chunks and before the
    calibration (``indexes.ann_built.dense_beside``)."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    n = len(matrix)
    nlist = default_nlist(n) if nlist is None else nlist
    if nlist == 0:
        return BuiltDense({"kind": "exact", "n_docs": n})
    if kind == "hnsw":
        return make_hnsw(matrix, calibration_queries=calibration_queries, seed=seed)
    rng = np.random.default_rng(seed)
    sample = matrix[rng.choice(n, size=min(n, nlist * TRAIN_POINTS_PER_LIST), replace=False)]
    index = trained_ivf(sample, nlist, seed)
    add_to_lists(index, matrix, rebalance=rebalance)
    nlist = index.nlist
    queries = matrix[rng.choice(n, size=min(n, calibration_queries), replace=False)]
    rebalance()
    ladder = calibrate(index, matrix, queries)
    nprobe = next((p for p, r in ladder if r >= CALIBRATION_RECALL), nlist)
    calibration = [{"nprobe": p, "recall_at_100": round(r, 4)} for p, r in ladder]
    if nprobe >= nlist:
        return exact_fallback(n, nlist, calibration)
    return BuiltDense({"kind": "ivf", "n_docs": n, "nlist": nlist, "nprobe": nprobe,
                       "target_recall_at_100": TARGET_RECALL,
                       "calibrated_to": CALIBRATION_RECALL, "calibration": calibration},
                      index, INDEX_FILE)


def exact_fallback(n: int, nlist: int, calibration: list[dict[str, Any]]) -> BuiltDense:
    """The vectors do not cluster: IVF reaches the recall only by probing every list, which
    scans every vector plus the list overhead (on 111k random vectors it cost several times an
    exact scan), so the dense leg is the exact scan, and ``ann.json`` says why."""
    best = calibration[-1] if calibration else {"nprobe": 0, "recall_at_100": 0.0}
    reason = (f"IVF with {nlist} lists reached recall@100 {best['recall_at_100']} at nprobe "
              f"{best['nprobe']} and needs every list for {CALIBRATION_RECALL}: an exact scan "
              "costs less (the vectors do not cluster)")
    return exact_fallback_of(n, reason, calibration)


def trained_ivf(sample: np.ndarray, nlist: int, seed: int) -> Any:
    """An empty IVF index (inner product, 8-bit lists) with ``nlist`` lists trained on
    ``sample``: faiss' flat k-means below ``TWO_LEVEL_LISTS`` lists, two levels from there."""
    import faiss

    quantizer = faiss.IndexFlatIP(sample.shape[1])
    if nlist >= TWO_LEVEL_LISTS:  # given lists: faiss' train keeps them, ranges only
        quantizer.add(train_two_level(sample, nlist, seed))
        nlist = quantizer.ntotal  # fewer when the sample has fewer points
    index = faiss.IndexIVFScalarQuantizer(quantizer, sample.shape[1], nlist,
                                          faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_INNER_PRODUCT, False)
    index.train(sample)  # the lists (unless given) and each dimension's 8-bit range
    return index


def calibrate(index: Any, matrix: np.ndarray, queries: np.ndarray, k: int = 100,
              stop_at: float = 0.999) -> list[tuple[int, float]]:
    """Recall@k against exact search over the lists' own 8-bit vectors per ``nprobe`` of the
    ladder (stops once near 1)."""
    def stored(rows: np.ndarray) -> np.ndarray:
        return index.sq.decode(index.sq.compute_codes(rows))

    truth = exact_neighbours(matrix, queries, k, stored=stored)
    scores_of = gathered_scores(matrix, queries, stored)
    ladder = []
    for nprobe in (p for p in NPROBE_LADDER if p <= index.nlist):
        _, found = index.search(queries, k, params=ivf_params(nprobe))
        ladder.append((nprobe, recall_at(found, truth, scores_of)))
        if ladder[-1][1] >= stop_at:
            break
    return ladder


def load_dense(build_dir: Path, vectors: VectorStore) -> ExactDense:
    """The build's dense leg; exact search when the build predates it (with a warning)."""
    directory = build_dir / ANN_DIR
    if not (directory / "ann.json").is_file():
        log.warning("%s has no ANN index (built before the dense leg existed): dense search is "
                    "exact over the stored vectors, slower at scale; rebuild the index to add "
                    "it", build_dir)
        return ExactDense(vectors)
    meta = read_json(directory / "ann.json")
    if meta["kind"] == "exact":
        return ExactDense(vectors)
    if meta["kind"] == "hnsw":
        return load_hnsw(directory, vectors, meta)
    import faiss

    # The lists are mapped from the build's file, not copied: every process and Retriever
    # serving a build shares one copy of its pages (10M float32 vectors are 15 GB).
    index = faiss.read_index(str(directory / INDEX_FILE), faiss.IO_FLAG_MMAP_IFC)
    return IvfDense(vectors, index, int(meta["nprobe"]))
