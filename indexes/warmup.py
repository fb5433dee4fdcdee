"""Load the BM25 and re-rank kernels' machine code before the first query.

numba loads a kernel's compiled code (from its on-disk cache) on the first call with each set
of argument types: about 55 MB of private memory and tens of milliseconds. Calling each kernel
once with a build's own arrays moves that cost to start-up, off the first request; a parent
process that does it before forking shares the code with all its workers, copy-on-write.
"""

from __future__ import annotations

import numpy as np

from indexes.bm25 import BM25Index
from indexes.vectors import VectorStore


def frequent_terms(bm25: BM25Index, count: int = 2) -> list[str]:
    """The ``count`` terms with the longest postings (those whose queries do the most work)."""
    lengths = np.diff(np.asarray(bm25.indptr))
    wanted = set(np.argsort(lengths)[::-1][:count].tolist())
    return [term for term, term_id in bm25.vocab.items() if term_id in wanted]


def warm_bm25(bm25: BM25Index) -> None:
    """Run the unfiltered, filtered (dense and selective mask), all-rows and given-rows
    kernels once, and those of a large query searched alone."""
    tokens = frequent_terms(bm25)
    if not tokens:  # an empty index has nothing to run
        return
    bm25.top_candidates(tokens, 10)
    bm25.score_touched(tokens)
    bm25.score_rows(tokens, np.arange(min(3, bm25.n_docs)))  # the dense leg's rows
    bm25.top_candidates(tokens, 10, np.ones(bm25.n_docs, dtype=np.bool_))
    selective = np.zeros(bm25.n_docs, dtype=np.bool_)
    selective[0] = True  # one allowed row: the kernel that follows the allowed rows
    bm25.top_candidates(tokens, 10, selective)
    # A large query's blocks shared by threads, run here by this thread alone: a process
    # about to fork its workers must not start the pool's threads.
    ids, weights = bm25.query_terms(tokens)
    postings, local = bm25.postings_of(ids)
    bm25.shared_blocks(postings, local, weights, np.ones(bm25.n_docs, dtype=np.bool_), True,
                       10, threads=1)


def warm_vectors(vectors: VectorStore) -> None:
    """Run the re-rank kernel once with each row type the request path hands it (int32 from
    BM25, int64 once the dense leg's rows join): in a fresh process the first call of each
    took 0.01-0.75 s, seconds more where the on-disk cache is empty."""
    if vectors.n_docs == 0:
        return
    query = np.ones(vectors.dim, dtype=np.float32)
    for dtype in (np.int32, np.int64):
        vectors.scores(query, np.zeros(1, dtype=dtype))
