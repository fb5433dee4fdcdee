"""Row-range slices of global index components: what makes a shard score like the whole.

A shard's BM25 impacts are the global index's impacts of its rows (computed once with the
collection's N, df and avgdl), bit for bit; its vocabulary is the global one, so every shard
knows every term (an unknown-term check gives the same answer on each). Its metadata keeps
every global field and keyword value, so a filter valid for the collection is valid on each
shard, even where no document of the shard holds the value.
"""

from __future__ import annotations

import numpy as np

from indexes.bm25 import BM25Index, BuildTerms
from indexes.metadata import MetadataIndex


def slice_bm25(index: BM25Index, start: int, stop: int) -> BM25Index:
    """The postings of rows [start, stop), rows renumbered from 0; impacts unchanged."""
    indptr = np.asarray(index.indptr)
    rows = index.plain_rows()
    keep = (rows >= start) & (rows < stop)
    # Postings are grouped by term (CSC); the term of each posting comes from indptr.
    term_of = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    counts = np.bincount(term_of[keep], minlength=indptr.size - 1)
    new_indptr = np.zeros(indptr.size, dtype=np.int64)
    np.cumsum(counts, out=new_indptr[1:])
    terms = index.terms and BuildTerms(index.terms.tfs[keep], index.terms.norms[start:stop],
                                       index.terms.idf)  # the collection's idf and avgdl
    return BM25Index(list(index.vocab_list), new_indptr,
                     (rows[keep] - start).astype(np.int32),
                     index.plain_impacts()[keep].copy(), stop - start, index.params,
                     index.typos, terms=terms)  # the vocabulary is global, so are its words


def slice_metadata(metadata: MetadataIndex, start: int, stop: int) -> MetadataIndex:
    """Rows [start, stop) of every field; keyword values absent from the slice stay known."""
    keywords = {}
    columns = {}
    for field, kind in metadata.kinds.items():
        if kind != "keyword":
            columns[field] = np.asarray(metadata.numeric_column(field))[start:stop].copy()
            continue
        values = metadata.keyword_values(field)
        postings = []
        for value in values:
            rows = metadata.keyword_rows(field, value)
            lo, hi = np.searchsorted(rows, [start, stop])  # posting rows are sorted
            postings.append((rows[lo:hi] - start).astype(np.int32))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum([p.size for p in postings], out=offsets[1:])
        flat = np.concatenate(postings) if postings else np.empty(0, np.int32)
        keywords[field] = (list(values), offsets, flat.astype(np.int32))
    return MetadataIndex(stop - start, dict(metadata.kinds), keywords, columns)
