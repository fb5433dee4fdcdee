"""The dense leg on vectors that do not cluster: ``python -m benchmarks.dense_fallback``.

Uniform random unit vectors have no neighbourhoods, so IVF calibration (``indexes.ann``) can
reach its recall only by probing every list. Side by side in one run, per query (dense top
``dense_candidates`` = 100, one thread for faiss), p50/p95/p99 of:

- IVF at nprobe = nlist (what such a build served before the fall-back), unfiltered and with
  a filter mask allowing half the rows (faiss ``IDSelectorBitmap``);
- the exact leg a build now stores instead (``ExactDense``), the same two ways;
- the exact scan as it was, gathering a copy of every row before the product.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from indexes.ann import ANN_DIR, IvfDense, build_ann, default_nlist, load_dense
from indexes.vectors import VectorStore


def random_unit(n: int, dim: int, seed: int) -> np.ndarray:
    matrix = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def forced_ivf(matrix: np.ndarray, vectors: VectorStore) -> IvfDense:
    """The IVF leg a build stored before the fall-back: nprobe = nlist."""
    import faiss

    nlist = default_nlist(matrix.shape[0])
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(matrix.shape[1]), matrix.shape[1], nlist,
                               faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(0)
    index.train(matrix[rng.choice(matrix.shape[0], size=nlist * 64, replace=False)])
    index.add(matrix)
    return IvfDense(vectors, index, nlist)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dense_fallback",
                                     description=__doc__)
    parser.add_argument("--docs", type=int, default=111_269)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    import faiss

    faiss.omp_set_num_threads(1)
    matrix = random_unit(args.docs, args.dim, 0)
    queries = random_unit(args.queries + 20, args.dim, 1)
    vectors = VectorStore.build(matrix)
    with tempfile.TemporaryDirectory() as work:
        meta = build_ann(matrix, Path(work) / ANN_DIR)
        exact = load_dense(Path(work), vectors)
    ivf = forced_ivf(matrix, vectors)
    half = np.zeros(args.docs, dtype=bool)
    half[::2] = True
    everything = np.arange(args.docs)

    def gathered(query: np.ndarray) -> np.ndarray:
        scores = vectors.scores(query, everything)
        return np.argpartition(-scores, 99)[:100]

    runners = {
        "IVF nprobe = nlist": lambda q: ivf.search(q, 100),
        "IVF nprobe = nlist, half the rows allowed": lambda q: ivf.search(q, 100, half),
        f"{meta['kind']} leg (this build)": lambda q: exact.search(q, 100),
        f"{meta['kind']} leg, half the rows allowed": lambda q: exact.search(q, 100, half),
        "exact scan with a gathered copy (before)": gathered,
    }
    samples = measure_side_by_side(runners, list(queries[20:]), list(queries[:20]), chunk=50)
    results = {"docs": args.docs, "dim": args.dim, "nlist": default_nlist(args.docs),
               "build": meta, **{name: s.summary() for name, s in samples.items()}}
    rows = [[name, percentile_cells(s.summary())] for name, s in samples.items()]
    markdown = "\n".join([
        f"# Dense leg on {args.docs:,} random {args.dim}-d vectors (top 100, one thread)", "",
        f"The build's calibration: {meta.get('fallback', meta['kind'])}", "",
        markdown_table(["dense leg", "ms p50 / p95 / p99"], rows)])
    publish_report("dense_fallback", args, results, markdown, key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
