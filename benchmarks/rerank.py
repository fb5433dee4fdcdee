"""Re-rank products at scale: the candidate rows dotted in place against gathered, in one run.

    python -m benchmarks.rerank --docs 1000000

A store of ``--docs`` random unit vectors (384 dimensions, float32 and int8), ``--rows``
random candidate rows a query (the union policy re-ranks about 400 at 1M passages). Side by
side on the same rows: ``VectorStore.scores`` (``indexes.vector_kernels``: each row read once
where it lies) and what it did before, ``np.take`` of the rows into a copy, widened to float32,
then one matrix-vector product.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    summarize,
)
from indexes.vectors import VectorStore


def gathered(store: VectorStore, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows gathered into a copy, then one product (the re-rank before the kernel)."""
    block = np.take(store.data, rows, axis=0).astype(np.float32)
    if store.dtype == "int8":
        assert store.scale is not None and store.low is not None
        folded = query * store.scale
        return block @ folded + np.float32(query @ (128.0 * store.scale + store.low))
    return block @ query


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--rows", type=int, default=400)
    p.add_argument("--queries", type=int, default=3000)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((args.docs, 384), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    queries = rng.standard_normal((args.queries + 200, 384), dtype=np.float32)
    picks = [np.sort(rng.integers(0, args.docs, args.rows)) for _ in range(len(queries))]
    runners = {}
    for dtype in ("float32", "int8"):
        store = VectorStore.build(matrix, dtype)  # type: ignore[arg-type]
        runners[f"{dtype}: read in place"] = \
            lambda i, s=store: s.scores(queries[i], picks[i])
        runners[f"{dtype}: gathered, then multiplied"] = \
            lambda i, s=store: gathered(s, queries[i], picks[i])
    items = list(range(200, len(queries)))
    samples = measure_side_by_side(runners, items, warmup=list(range(200)))
    results = {name: summarize(s.wall_ms) for name, s in samples.items()}
    table = markdown_table(["", "p50 / p95 / p99 ms"],
                           [[name, percentile_cells(r)] for name, r in results.items()])
    publish_report("rerank", args, results,
                   f"## Re-rank products, {args.rows} of {args.docs:,} rows, "
                   f"{len(items)} queries\n\n{table}")


if __name__ == "__main__":
    main()
