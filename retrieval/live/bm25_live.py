"""BM25 over base (minus replaced rows) plus delta rows with the live corpus's statistics.

A fresh build of the live corpus scores with its N, df and avgdl; so does this: the impacts of
every live posting are recomputed from term frequencies and document lengths, so the request
path runs the unchanged kernels over one CSC matrix and the scores equal a fresh build's (to
float32 rounding of the impacts). Deleted and superseded base rows have no postings, so they
are never a BM25 candidate, and they count in neither N, df nor avgdl (unlike Lucene, whose
deleted documents count until a merge).

Cost: O(postings) per applied batch (one stable sort of the live postings); the base's term
frequencies come from analyzing its texts once per base build (``BaseTerms.of``, with the
build's compiled analysis).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from indexes.analysis import analyze
from indexes.analyzer import Analyzer
from indexes.bm25 import BM25Index, BM25Params, idf_weights, impacts_for, okapi_idf
from indexes.docstore import DocStore


@dataclass(frozen=True)
class BaseTerms:
    """The base build's postings as term frequencies: vocab, and (term, row, tf) sorted by
    term then row, plus every row's length (tokens)."""

    vocab: dict[str, int]
    term_ids: np.ndarray  # int64 (nnz,)
    rows: np.ndarray  # int32 (nnz,)
    tfs: np.ndarray  # float64 (nnz,)
    lengths: np.ndarray  # float64 (n_docs,)

    @classmethod
    def of(cls, docs: DocStore, analyzer: Analyzer, vocab: Sequence[str]) -> BaseTerms:
        """Analyze every base text once (the build's compiled analysis, ``indexes.analysis``);
        read in blocks of rows (one trip per block and shard on a remote doc store)."""
        ids = {term: i for i, term in enumerate(vocab)}
        blocks = (docs.get_many(np.arange(start, min(start + 2048, len(docs))))
                  for start in range(0, len(docs), 2048))
        postings = analyze([doc.content for block in blocks for doc in block], analyzer.config)
        # Terms the base vocabulary lacks are added in first-occurrence order.
        known = np.fromiter((ids.setdefault(t, len(ids)) for t in postings.terms),
                            dtype=np.int64, count=len(postings.terms))
        term_ids, rows = known[postings.post_terms], postings.post_rows
        order = np.lexsort((rows, term_ids))
        return cls(ids, term_ids[order], rows[order],
                   postings.post_tfs[order].astype(np.float64),
                   postings.lengths.astype(np.float64))


def count_terms(token_lists: Iterable[list[str]], vocab: dict[str, int],
                first_row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(term ids int64, rows int32, tfs float64, lengths float64) of tokenized documents
    numbered from ``first_row``; unseen terms are added to ``vocab``."""
    term_ids: list[int] = []
    rows: list[int] = []
    tfs: list[int] = []
    lengths: list[int] = []
    for offset, tokens in enumerate(token_lists):
        lengths.append(len(tokens))
        for term, tf in Counter(tokens).items():
            term_ids.append(vocab.setdefault(term, len(vocab)))
            rows.append(first_row + offset)
            tfs.append(tf)
    return (np.asarray(term_ids, dtype=np.int64), np.asarray(rows, dtype=np.int32),
            np.asarray(tfs, dtype=np.float64), np.asarray(lengths, dtype=np.float64))


def live_bm25(base: BaseTerms, alive: np.ndarray, delta_tokens: Sequence[list[str]],
              params: BM25Params) -> tuple[BM25Index, BaseTerms]:
    """The BM25 index of base rows where ``alive`` (bool (n_base,)) plus delta rows numbered
    after the base, with the statistics of exactly those documents; and the term frequencies
    of those documents numbered densely (the ``BaseTerms`` of their compaction, which keeps
    this order), so the build compaction publishes need not be analyzed again."""
    n_base = alive.shape[0]
    vocab = dict(base.vocab)
    d_terms, d_rows, d_tfs, d_lengths = count_terms(delta_tokens, vocab, n_base)
    keep = alive[base.rows]
    term_ids = np.concatenate([base.term_ids[keep], d_terms])
    rows = np.concatenate([base.rows[keep], d_rows])
    tfs = np.concatenate([base.tfs[keep], d_tfs])
    lengths = np.concatenate([base.lengths, d_lengths])
    live = np.concatenate([alive, np.ones(len(delta_tokens), dtype=bool)])
    n_live = int(live.sum())
    avgdl = float(lengths[live].mean()) if n_live else 0.0
    # Only terms some live document holds are in a fresh build's vocabulary (and its mean
    # idf, the okapi floor): renumber them densely, keeping their order.
    df = np.bincount(term_ids, minlength=len(vocab))
    present = df > 0
    new_id = np.cumsum(present) - 1
    term_ids = new_id[term_ids]
    order = np.argsort(term_ids, kind="stable")  # base part sorted; delta rows come after
    term_ids, rows, tfs = term_ids[order], rows[order], tfs[order]
    doc_freq = df[present].astype(np.float64)
    floor = None  # lucene has none
    if params.variant == "okapi":
        idf, floor = okapi_idf(doc_freq, n_live, params)
    else:
        idf = idf_weights(doc_freq, n_live, params)
    impacts = impacts_for(tfs, lengths[rows], idf[term_ids], avgdl, params)
    indptr = np.zeros(doc_freq.size + 1, dtype=np.int64)
    np.cumsum(df[present], out=indptr[1:])
    terms = np.array(sorted(vocab, key=vocab.__getitem__), dtype=object)[present].tolist()
    index = BM25Index(terms, indptr, rows, impacts.astype(np.float32),
                      n_base + len(delta_tokens), params)
    index.stats_docs = n_live  # dead rows keep their row numbers, not their place in idf
    index.idf_floor = floor  # the relevance score's bound needs it: no second pass
    rank = (np.cumsum(live) - 1).astype(np.int32)
    folded = BaseTerms({t: i for i, t in enumerate(terms)}, term_ids, rank[rows], tfs,
                       lengths[live])
    return index, folded
