"""How much BM25 work exact block-max pruning could skip at best.

    python -m benchmarks.pruning_bound                    # 1M passages, C = 300
    python -m benchmarks.pruning_bound --candidates 10    # a shallower cut-off

For each query of the realistic synthetic corpus (``benchmarks.synthetic_corpus``, the corpus of
``benchmarks.filters``, its cached BM25 index), the exhaustive kernel gives the final top-C
cut-off score theta. The rows are cut into fixed blocks; a block's bound is the sum over the
query's terms of weight x the term's largest impact in that block (what block-max WAND and
block-max MaxScore skip with). With theta known from the start, which no pruning algorithm has
(theirs rises from 0 as documents are scored), a block whose bound is below theta can be
skipped and every other block must be scored: the share of the query's postings in such
blocks is a lower bound on the work of any exact block-max pruning on these blocks. No timing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, publish_report
from benchmarks.filters import cached_bm25
from benchmarks.synthetic_corpus import CorpusSpec, generate
from benchmarks.synthetic_corpus import queries as corpus_queries
from indexes.bm25 import BM25Index
from indexes.bm25_strategy import Kernel


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=120)
    p.add_argument("--candidates", type=int, default=300, help="C, the top-C cut-off")
    p.add_argument("--block-rows", default="128,1024")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    return p.parse_args(argv)


def kept_share(index: BM25Index, ids: np.ndarray, weights: np.ndarray, theta: float,
               block_rows: int) -> float:
    """Share of the query's postings in blocks whose bound reaches ``theta``."""
    n_blocks = index.n_docs // block_rows + 1
    bound = np.zeros(n_blocks)
    blocks_of_terms = []
    for term, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        span = slice(index.indptr[term], index.indptr[term + 1])
        blocks = index.plain_rows()[span] // block_rows
        block_max = np.zeros(n_blocks)
        np.maximum.at(block_max, blocks, index.plain_impacts()[span].astype(np.float64) * weight)
        bound += block_max
        blocks_of_terms.append(blocks)
    live = bound >= theta
    total = sum(b.shape[0] for b in blocks_of_terms)
    return sum(int(live[b].sum()) for b in blocks_of_terms) / max(total, 1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    corpus = generate(CorpusSpec(args.docs))
    index = cached_bm25(corpus)
    sizes = [int(b) for b in args.block_rows.split(",")]
    shares: dict[int, list[float]] = {b: [] for b in sizes}
    for tokens in corpus_queries(corpus, args.queries, seed=1):
        ids, weights = index.query_terms(tokens)
        _, scores = index.top_candidates(tokens, args.candidates, kernel=Kernel.EXHAUSTIVE)
        if scores.shape[0] < args.candidates:
            continue  # fewer than C matches: nothing to prune
        for size in sizes:
            shares[size].append(kept_share(index, ids, weights, float(scores[-1]), size))
    rows = [[f"{size:,}", len(s), *(f"{np.percentile(s, q):.2f}" for q in (25, 50, 75)),
             f"{np.mean(s):.2f}"] for size, s in shares.items()]
    markdown = "\n".join([
        f"## Block-max pruning bound: {args.docs:,} realistic passages, top C = "
        f"{args.candidates}", "",
        "Share of each query's postings in blocks whose bound reaches the final cut-off "
        "(the least any exact block-max pruning on these blocks must score):", "",
        markdown_table(["block rows", "queries", "p25", "median", "p75", "mean"], rows)])
    publish_report("pruning-bound", args, {str(k): v for k, v in shares.items()}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
