"""BM25 as precomputed per-posting impacts in a CSC layout (term -> rows, impacts).

Scoring a query is a sum of impacts over the postings of its terms, so the request path never
evaluates the BM25 formula. Two variants:

- ``okapi``: rank-bm25's ``BM25Okapi`` exactly (natural-log idf, negative idfs floored at
  ``epsilon * mean(idf)``, tf saturation with ``k1 + 1`` in the numerator).
- ``lucene``: Lucene's BM25 (``log(1 + (N - n + 0.5) / (n + 0.5))`` idf, no ``k1 + 1``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from numba import njit
from pydantic import BaseModel, ConfigDict, Field

from indexes.storage import load_array, read_json, save_array, write_json

Variant = Literal["okapi", "lucene"]


class BM25Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: Variant = "okapi"
    k1: float = Field(1.5, gt=0)
    b: float = Field(0.75, ge=0, le=1)
    epsilon: float = Field(0.25, ge=0, description="okapi only: floor for negative idf")


def _postings_coo(
    docs: Iterable[Sequence[str]],
) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Count term frequencies; returns vocab, (term ids, rows, tfs) and doc lengths."""
    vocab: dict[str, int] = {}
    term_ids: list[int] = []
    rows: list[int] = []
    tfs: list[int] = []
    lengths: list[int] = []
    for row, tokens in enumerate(docs):
        lengths.append(len(tokens))
        for term, tf in Counter(tokens).items():
            term_ids.append(vocab.setdefault(term, len(vocab)))
            rows.append(row)
            tfs.append(tf)
    return (
        vocab,
        np.asarray(term_ids, dtype=np.int64),
        np.asarray(rows, dtype=np.int32),
        np.asarray(tfs, dtype=np.float64),
        np.asarray(lengths, dtype=np.float64),
    )


def idf_weights(doc_freq: np.ndarray, n_docs: int, params: BM25Params) -> np.ndarray:
    """idf per term, shape (n_terms,), float64."""
    if params.variant == "lucene":
        return np.log1p((n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    if idf.size:
        floor = params.epsilon * idf.mean()
        idf = np.where(idf < 0, floor, idf)
    return idf


def impacts_for(
    tf: np.ndarray, doc_len: np.ndarray, idf: np.ndarray, avgdl: float, params: BM25Params
) -> np.ndarray:
    """BM25 contribution of each posting, float64, all arrays aligned per posting."""
    norm = params.k1 * (1.0 - params.b + params.b * doc_len / max(avgdl, 1e-9))
    numerator = tf * (params.k1 + 1.0) if params.variant == "okapi" else tf
    return idf * numerator / (tf + norm)


class BM25Index:
    """Impact matrix plus vocabulary; ``top_candidates`` is the query verb."""

    def __init__(
        self,
        vocab: list[str],
        indptr: np.ndarray,
        rows: np.ndarray,
        impacts: np.ndarray,
        n_docs: int,
        params: BM25Params,
    ) -> None:
        self.vocab_list = vocab
        self.vocab = {term: i for i, term in enumerate(vocab)}
        self.indptr = indptr
        self.rows = rows
        self.impacts = impacts
        self.n_docs = n_docs
        self.params = params
        self._scratch = threading.local()

    @classmethod
    def build(cls, docs: Iterable[Sequence[str]], params: BM25Params | None = None) -> BM25Index:
        """Build from tokenized documents (row i is document i)."""
        params = params or BM25Params()
        vocab, term_ids, rows, tfs, lengths = _postings_coo(docs)
        n_docs, n_terms = len(lengths), len(vocab)
        order = np.argsort(term_ids, kind="stable")  # CSC: group by term, rows stay ascending
        term_ids, rows, tfs = term_ids[order], rows[order], tfs[order]
        counts = np.bincount(term_ids, minlength=n_terms)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        doc_freq = counts.astype(np.float64)
        avgdl = float(lengths.mean()) if n_docs else 0.0
        idf = idf_weights(doc_freq, n_docs, params)
        impacts = impacts_for(tfs, lengths[rows], idf[term_ids], avgdl, params)
        terms = sorted(vocab, key=vocab.__getitem__)
        return cls(terms, indptr, rows, impacts.astype(np.float32), n_docs, params)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_array(directory / "indptr.npy", self.indptr)
        save_array(directory / "rows.npy", self.rows)
        save_array(directory / "impacts.npy", self.impacts)
        write_json(directory / "vocab.json", self.vocab_list)
        write_json(directory / "params.json", {"n_docs": self.n_docs, **self.params.model_dump()})

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> BM25Index:
        meta = read_json(directory / "params.json")
        n_docs = int(meta.pop("n_docs"))
        return cls(
            vocab=read_json(directory / "vocab.json"),
            indptr=load_array(directory / "indptr.npy", mmap),
            rows=load_array(directory / "rows.npy", mmap),
            impacts=load_array(directory / "impacts.npy", mmap),
            n_docs=n_docs,
            params=BM25Params(**meta),
        )

    def query_terms(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Known term ids and their query counts (a repeated query word counts twice)."""
        counts = Counter(t for t in tokens if t in self.vocab)
        ids = np.fromiter((self.vocab[t] for t in counts), dtype=np.int64, count=len(counts))
        weights = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        return ids, weights

    def _buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-thread scratch, so one index serves many threads without locks."""
        buffers = getattr(self._scratch, "buffers", None)
        if buffers is None:
            n = self.n_docs
            buffers = (
                np.zeros(n, dtype=np.float64),
                np.zeros(n, dtype=np.bool_),
                np.empty(n, dtype=np.int32),
                np.empty(n, dtype=np.float64),
            )
            self._scratch.buffers = buffers
        return buffers

    def score_touched(
        self, tokens: Sequence[str], mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows containing at least one query term (inside ``mask``) and their BM25 scores.

        Returns (rows int32 (m,), scores float64 (m,)), rows in no particular order.
        """
        ids, weights = self.query_terms(tokens)
        scratch, seen, out_rows, out_scores = self._buffers()
        use_mask = mask is not None
        mask_arr = mask if use_mask else np.zeros(1, dtype=np.bool_)
        m = _accumulate_touched(
            self.indptr, self.rows, self.impacts, ids, weights,
            mask_arr, use_mask, scratch, seen, out_rows, out_scores,
        )
        return out_rows[:m].copy(), out_scores[:m].copy()

    def top_candidates(
        self, tokens: Sequence[str], n: int, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``n`` rows by BM25 among rows matching a query term and allowed by ``mask``.

        Returns (rows int32, scores float64), best first; ties broken by lower row.
        """
        rows, scores = self.score_touched(tokens, mask)
        return top_n(rows, scores, n)


def top_n(rows: np.ndarray, scores: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best (row, score) pairs, sorted by score desc then row asc."""
    if rows.size > n:
        keep = np.argpartition(-scores, n - 1)[:n]
        rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


@njit(nogil=True, cache=True)
def _accumulate_touched(
    indptr, rows, impacts, term_ids, weights, mask, use_mask, scratch, seen, out_rows, out_scores
):  # pragma: no cover - compiled
    """Sum impacts into ``scratch`` for touched rows only, then gather the allowed ones.

    Scratch is reset for every touched row before returning, so the buffers are reusable.
    Masking after accumulation (not inside the postings loop) keeps the inner loop branch-free.
    """
    n_touched = 0
    for i in range(term_ids.shape[0]):
        t = term_ids[i]
        w = weights[i]
        for p in range(indptr[t], indptr[t + 1]):
            r = rows[p]
            if not seen[r]:
                seen[r] = True
                out_rows[n_touched] = r
                n_touched += 1
            scratch[r] += w * impacts[p]
    m = 0
    for j in range(n_touched):
        r = out_rows[j]
        s = scratch[r]
        scratch[r] = 0.0
        seen[r] = False
        if use_mask and not mask[r]:
            continue
        out_rows[m] = r
        out_scores[m] = s
        m += 1
    return m
