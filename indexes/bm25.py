"""BM25 as precomputed per-posting impacts in a CSC layout (term -> rows, impacts).

Scoring a query is a sum of impacts over the postings of its terms, so the request path never
evaluates the BM25 formula. Two variants:

- ``okapi``: rank-bm25's ``BM25Okapi`` exactly (natural-log idf, negative idfs floored at
  ``epsilon * mean(idf)``, tf saturation with ``k1 + 1`` in the numerator).
- ``lucene``: Lucene's BM25 (``log(1 + (N - n + 0.5) / (n + 0.5))`` idf, no ``k1 + 1``).

The query path (sum over postings, exact top-C with ties to the lower row) is numba code in
``indexes.bm25_kernels`` and ``indexes.topk``; per query ``indexes.bm25_strategy`` picks the
kernel (galloping over a filter's allowed rows, a repeated filter's restricted postings, a
mask walk, MaxScore pruning or the exhaustive kernel) from its cost thresholds. A score is the
float64 sum, in query-term order, of weight x float32 impact: the same bits on every kernel
path; rank-bm25's float64 formula agrees to rtol 1e-6 (tests/test_bm25.py).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexes.analysis_kernels import bm25_impacts, count_terms, to_columns
from indexes.atomics import wait_for
from indexes.bm25_filtered import filtered_top_rows
from indexes.bm25_kernels import (
    BLOCK_ROWS,
    best_found,
    claimed_top_rows,
    general_rows,
    new_found,
    scores_of_rows,
    top_rows,
    touched_rows,
)
from indexes.bm25_mask_walk import CHUNK, mask_walk_top_rows
from indexes.bm25_pruned import candidates_top_rows, prune_candidates, term_maxima
from indexes.bm25_restricted import RestrictedPostings
from indexes.bm25_strategy import Kernel, MaskFacts, Plan, choose, forced
from indexes.compact_postings import CompactPostings
from indexes.cpu import usable_cores
from indexes.fan_out import THREADS_FROM_POSTINGS, by_threads, fans_out
from indexes.mapping import prefault_mapping
from indexes.storage import load_array, read_json, save_array, write_json
from indexes.typos import LiveTypos, TypoIndex

Variant = Literal["okapi", "lucene"]
PostingsFormat = Literal["plain", "compact"]  # indexes.compact_postings
_NO_MASK = np.zeros(1, dtype=np.bool_)  # placeholder: numba needs an array even when unused
# The most a thread keeps of its last query's gathered compact postings (4M postings: past the
# p99 query at 1M passages); a larger query's are decoded again when its dense rows are scored.
KEEP_GATHERED_BYTES = 32 << 20
# How long a search waits without sleeping for the other threads' last row blocks (reads of
# an atomic counter, about 2 ms here): a block takes tens of microseconds, and a sleeping
# thread's wake-up (a futex, then the GIL) about 70. Past it the search blocks on the threads.
SPINS = 400_000


class BM25Params(BaseModel):
    # An infinite k1 or epsilon made every score NaN: the keyword leg silently dead.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    variant: Variant = "okapi"
    k1: float = Field(1.5, gt=0)
    b: float = Field(0.75, ge=0, le=1)
    epsilon: float = Field(0.25, ge=0, description="okapi only: floor for negative idf")


def idf_weights(doc_freq: np.ndarray, n_docs: int, params: BM25Params,
                floor: float | None = None) -> np.ndarray:
    """idf per term, shape (n_terms,), float64. okapi floors a negative idf at ``floor``
    (default: ``okapi_idf``'s, for a whole vocabulary's ``doc_freq``)."""
    if params.variant == "lucene":
        return np.log1p((n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
    if floor is None:
        return okapi_idf(doc_freq, n_docs, params)[0]
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    return np.where(idf < 0, floor, idf)


def okapi_idf(doc_freq: np.ndarray, n_docs: int, params: BM25Params
              ) -> tuple[np.ndarray, float]:
    """okapi's idf of a vocabulary whose document frequencies are ``doc_freq``, and its
    floor: what a term in more than half the documents gets, ``epsilon`` times the mean idf
    (rank-bm25's)."""
    doc_freq = doc_freq.astype(np.float64, copy=False)
    idf = np.log(n_docs - doc_freq + 0.5) - np.log(doc_freq + 0.5)
    floor = float(params.epsilon * idf.mean()) if idf.size else 0.0
    return np.where(idf < 0, floor, idf), floor


def impacts_for(
    tf: np.ndarray, doc_len: np.ndarray, idf: np.ndarray, avgdl: float, params: BM25Params
) -> np.ndarray:
    """BM25 contribution of each posting, float64, all arrays aligned per posting."""
    norm = params.k1 * (1.0 - params.b + params.b * doc_len / max(avgdl, 1e-9))
    numerator = tf * (params.k1 + 1.0) if params.variant == "okapi" else tf
    return idf * numerator / (tf + norm)


def doc_freqs_of(vocab: dict[str, int], doc_freq: np.ndarray, terms: Sequence[str]
                 ) -> np.ndarray:
    """Rows holding each of ``terms`` (int64; 0 for a term not in ``vocab``), where
    ``doc_freq[vocab[term]]`` counts a term's rows."""
    ids = np.fromiter(map(vocab.get, terms, itertools.repeat(-1)), dtype=np.int64,
                      count=len(terms))
    counts = np.zeros(len(terms), dtype=np.int64)
    known = ids >= 0
    counts[known] = np.asarray(doc_freq, dtype=np.int64)[ids[known]]
    return counts


@dataclass(frozen=True)
class BuildTerms:
    """What a fresh build's impacts were computed from, aligned with its postings: tf int32
    (nnz,), each row's BM25 length norm float64 (n_docs,) and each term's idf float64."""

    tfs: np.ndarray
    norms: np.ndarray
    idf: np.ndarray


@dataclass(frozen=True)
class CollectionStatistics:
    """What a collection's BM25 impacts depend on beyond a row's own postings: the mean row
    length and each term's idf (float64, one per vocabulary term)."""

    avgdl: float
    idf: np.ndarray

    @classmethod
    def of(cls, doc_freq: np.ndarray, n_docs: int, length_sum: int, params: BM25Params
           ) -> CollectionStatistics:
        """From each term's document frequency, the number of rows and their total length
        (the same float64 values ``from_postings`` computes over the whole collection)."""
        avgdl = float(np.float64(length_sum) / n_docs) if n_docs else 0.0
        return cls(avgdl, idf_weights(doc_freq.astype(np.float64), n_docs, params))


class Corrected(str):
    """A query term matched to the index's vocabulary by typo tolerance (``indexes.typos``):
    it scores as the vocabulary term, times ``weight``."""

    weight: float

    def __new__(cls, term: str, weight: float) -> Corrected:
        corrected = super().__new__(cls, term)
        corrected.weight = weight
        return corrected

    def __reduce__(self) -> tuple[type[Corrected], tuple[str, float]]:  # to Ray shards intact
        return Corrected, (str(self), self.weight)


class BM25Index:
    """Impact matrix plus vocabulary; ``top_candidates`` is the query verb. ``typos``: the
    corpus words' deletion dictionary (None in builds made before it)."""

    def __init__(
        self,
        vocab: list[str],
        indptr: np.ndarray,
        rows: np.ndarray | None,
        impacts: np.ndarray | None,
        n_docs: int,
        params: BM25Params,
        typos: TypoIndex | LiveTypos | None = None,
        compact: CompactPostings | None = None,
        terms: BuildTerms | None = None,
    ) -> None:
        """``rows`` and ``impacts`` (the plain format), or ``compact`` postings with None for
        both; ``terms``: what the compact format is made from (kept by a fresh build)."""
        self.typos = typos
        self.vocab_list = vocab
        self.vocab = {term: i for i, term in enumerate(vocab)}
        # Plain ndarray views of the (often memory-mapped) postings: numba types an np.memmap
        # argument through a slow fallback, ~5 us per call.
        self.indptr = np.asarray(indptr)
        self.compact = compact
        self.terms = terms
        self.rows = None if rows is None else np.asarray(rows)
        self.impacts = None if impacts is None else np.asarray(impacts)
        self.n_docs = n_docs
        self.params = params
        self._scratch = threading.local()
        # Terms with a non-positive impact (usually none): their queries need the kernel that
        # tracks touched rows, since 0.0 no longer means "untouched" (see bm25_kernels).
        self._nonpositive = (compact.nonpositive if compact is not None
                             else nonpositive_terms(self.indptr, self.plain_impacts()))
        self._mask_facts = MaskFacts()
        # Repeated filters' postings restricted to their rows (budget_bytes = 0 turns it off).
        self.restricted = RestrictedPostings()
        self._term_max: np.ndarray | None = None  # per-term largest impact, made on first use
        self.stats_docs = n_docs  # the documents idf counts (a live view's: the live ones)
        self.idf_floor: float | None = None  # okapi's floor (made on first use if None)

    @classmethod
    def build(cls, docs: Iterable[Sequence[str]], params: BM25Params | None = None) -> BM25Index:
        """Build from tokenized documents (row i is document i); terms are numbered in
        first-occurrence order. Builds from text go through ``indexes.analysis``."""
        ids: dict[str, int] = {}
        flat: list[int] = []
        ends: list[int] = []
        for tokens in docs:
            flat.extend(ids.setdefault(t, len(ids)) for t in tokens)
            ends.append(len(flat))
        terms, rows, tfs, lengths = count_terms(
            np.asarray(flat, dtype=np.int32), np.asarray(ends, dtype=np.int64),
            np.arange(len(ids), dtype=np.int32), len(ids), 0)
        return cls.from_postings(list(ids), terms, rows, tfs, lengths, params)

    @classmethod
    def from_postings(cls, vocab: list[str], terms: np.ndarray, rows: np.ndarray,
                      tfs: np.ndarray, lengths: np.ndarray, params: BM25Params | None = None,
                      collection: CollectionStatistics | None = None) -> BM25Index:
        """From term-frequency postings row by row (term, row, tf int32 each, rows
        ascending) and the rows' lengths: impacts computed once over the whole collection,
        or, for a shard built apart, with the ``collection``'s statistics (its impacts are
        then the collection index's impacts of the shard's rows, bit for bit)."""
        params = params or BM25Params()
        n_docs = len(lengths)
        indptr, rows, tfs = to_columns(terms, rows, tfs, len(vocab))
        if collection is None:
            avgdl = float(lengths.mean()) if n_docs else 0.0
            idf = idf_weights(np.diff(indptr).astype(np.float64), n_docs, params)
        else:
            avgdl, idf = collection.avgdl, collection.idf
        impacts = bm25_impacts(indptr, rows, tfs, lengths, idf, max(avgdl, 1e-9), params.k1,
                               params.b, params.variant == "okapi")
        norms = params.k1 * (1.0 - params.b + params.b * lengths.astype(np.float64)
                             / max(avgdl, 1e-9))
        return cls(vocab, indptr, rows, impacts, n_docs, params,
                   terms=BuildTerms(tfs, norms, idf))

    def save(self, directory: Path, postings: PostingsFormat = "plain") -> None:
        """Write the index; ``postings="compact"`` writes ``indexes.compact_postings``'s
        format (a fresh build's index only: it is made from the term frequencies)."""
        directory.mkdir(parents=True, exist_ok=True)
        save_array(directory / "indptr.npy", self.indptr)
        if postings == "compact":
            self.compacted().save(directory)
        else:
            save_array(directory / "rows.npy", self.plain_rows())
            save_array(directory / "impacts.npy", self.plain_impacts())
        write_json(directory / "vocab.json", self.vocab_list)
        write_json(directory / "params.json", {"n_docs": self.n_docs, **self.params.model_dump()})
        if isinstance(self.typos, TypoIndex):  # a live view's is never saved: builds are
            self.typos.save(directory / "typos")

    @classmethod
    def load(cls, directory: Path, mmap: bool = True, prefault: bool = True) -> BM25Index:
        """Load a saved index; memory-mapped postings are prefaulted unless ``prefault=False``
        (see ``prefault_mapping``)."""
        meta = read_json(directory / "params.json")
        n_docs = int(meta.pop("n_docs"))
        compact = CompactPostings.load(directory, mmap)
        rows = impacts = None
        if compact is None:
            rows = load_array(directory / "rows.npy", mmap)
            impacts = load_array(directory / "impacts.npy", mmap)
        if prefault:
            for array in ((rows, impacts) if compact is None
                          else (compact.row_bytes, compact.tf, compact.norms)):
                if array is not None:
                    prefault_mapping(array)
        return cls(
            vocab=read_json(directory / "vocab.json"),
            indptr=load_array(directory / "indptr.npy", mmap),
            rows=rows,
            impacts=impacts,
            n_docs=n_docs,
            params=BM25Params(**meta),
            typos=TypoIndex.load(directory / "typos", mmap),
            compact=compact,
        )

    def plain_rows(self) -> np.ndarray:
        if self.rows is None:
            raise ValueError("this index holds compact postings: gather a query's with "
                             "postings_of")
        return self.rows

    def plain_impacts(self) -> np.ndarray:
        if self.impacts is None:
            raise ValueError("this index holds compact postings: gather a query's with "
                             "postings_of")
        return self.impacts

    def compacted(self) -> CompactPostings:
        """The compact form of a freshly built index's postings."""
        if self.compact is not None:
            return self.compact
        if self.terms is None:
            raise ValueError("compact postings are made from term frequencies, which only a "
                             "fresh build (BM25Index.build / from_postings) keeps")
        return CompactPostings.encode(
            self.indptr, self.plain_rows(), self.terms.tfs, self.terms.idf, self.terms.norms,
            self.term_max(), self._nonpositive, self.params.k1, self.params.variant == "okapi")

    def postings_of(self, ids: np.ndarray
                    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        """((indptr, rows, impacts), term ids into them) for the query terms ``ids``: the
        index's own arrays, or compact postings gathered into plain ones.

        A thread's last gather (up to ``KEEP_GATHERED_BYTES``) is kept for its next call with
        the same terms: a search's dense-only rows are scored (``score_rows``) in the postings
        its BM25 stage gathered, where decoding them again cost as much as the BM25 stage's
        own decode. With the decode on every core (``CompactPostings.gather``), the union
        search path at 1M passages went from 3.85 / 8.34 ms p50 / p95 to 2.58 / 4.41."""
        if self.compact is None:
            return (self.indptr, self.plain_rows(), self.plain_impacts()), ids
        local = np.arange(ids.shape[0], dtype=np.int64)
        key = ids.tobytes()
        last = getattr(self._scratch, "gathered", None)
        if last is not None and last[0] == key:
            return last[1], local
        self._scratch.gathered = None  # the last query's arrays are not held past this one
        gathered = self.compact.gather(self.indptr, ids)
        if gathered[1].nbytes + gathered[2].nbytes <= KEEP_GATHERED_BYTES:
            self._scratch.gathered = (key, gathered)
        return gathered, local

    def doc_freq(self, term: str) -> int:
        """Rows holding ``term`` (0 when no row does)."""
        i = self.vocab.get(term)
        return 0 if i is None else int(self.indptr[i + 1] - self.indptr[i])

    def vocabulary_doc_freqs(self) -> np.ndarray:
        """Every vocabulary term's document frequency, in vocabulary order."""
        return np.diff(self.indptr)

    def idf(self, tokens: Sequence[str]) -> np.ndarray:
        """float64 (len(tokens),): each token's idf as the scorer weighs it, okapi's floor
        included; a token no row holds gets the idf of a document frequency of 0."""
        df = np.array([self.doc_freq(token) for token in tokens], dtype=np.float64)
        n = self.stats_docs
        if self.params.variant == "lucene":
            return idf_weights(df, n, self.params)
        if self.idf_floor is None:  # one pass over the vocabulary, once per index
            self.idf_floor = okapi_idf(self.vocabulary_doc_freqs(), n, self.params)[1]
        return idf_weights(df, n, self.params, floor=self.idf_floor)

    def doc_freqs(self, terms: Sequence[str]) -> np.ndarray:
        """``doc_freq`` of each of ``terms``, int64, in one pass."""
        return doc_freqs_of(self.vocab, np.diff(self.indptr), terms)

    def query_terms(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Known term ids int64 (q,) in first-occurrence order and their query counts float64
        (q,): a repeated query word counts twice, as in rank-bm25; a ``Corrected`` term
        counts its weight."""
        counts: dict[int, float] = {}
        lookup = self.vocab.get
        for token in tokens:
            term = lookup(token)
            if term is not None:
                counts[term] = counts.get(term, 0.0) + getattr(token, "weight", 1.0)
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        weights = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        return ids, weights

    def _buffer(self) -> np.ndarray:
        """Per-thread scratch, float64 (n_docs,), zeros between calls: one index serves many
        threads without locks (the kernels release the GIL)."""
        scratch = getattr(self._scratch, "scores", None)
        if scratch is None:
            scratch = self._scratch.scores = np.zeros(self.n_docs, dtype=np.float64)
        return scratch

    def _general_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-thread (seen bool (n_docs,) all False, touched int32 (n_docs,)), made on the
        first query that needs them: fresh pages cost ~0.5 ms per MB here."""
        buffers = getattr(self._scratch, "general", None)
        if buffers is None:
            buffers = self._scratch.general = (np.zeros(self.n_docs, dtype=np.bool_),
                                               np.empty(self.n_docs, dtype=np.int32))
        return buffers

    def _mask_arg(self, mask: np.ndarray | None) -> tuple[np.ndarray, bool]:
        if mask is None:
            return _NO_MASK, False
        if mask.dtype != np.bool_ or mask.shape != (self.n_docs,):
            # The kernel reads mask[row] unchecked: a short mask would read past its end.
            raise ValueError(f"mask must be bool of shape ({self.n_docs},), got "
                             f"{mask.dtype} {mask.shape}")
        return mask, True

    def _search(self, tokens: Sequence[str], k: int, mask: np.ndarray | None,
                kernel: Kernel | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (all touched rows, unsorted, when ``k`` < 0) through the kernel
        ``bm25_strategy`` chooses (or ``kernel``)."""
        ids, weights = self.query_terms(tokens)
        mask_arr, use_mask = self._mask_arg(mask)
        postings, local = self.postings_of(ids)
        args = (*postings, local, weights, mask_arr, use_mask)
        if self._nonpositive and not self._nonpositive.isdisjoint(ids.tolist()):
            return general_rows(*args, k, self._buffer(), *self._general_buffers())
        if k < 0:
            return touched_rows(*args, self._buffer())
        lengths = self.indptr[ids + 1] - self.indptr[ids]
        threads = self._threads(int(lengths.sum()))  # the exhaustive kernel's
        if kernel is None:
            plan = choose(lengths, self.n_docs, mask, self._mask_facts,
                          self.restricted.budget_bytes > 0 and self.compact is None,
                          threads > 1)
        else:
            plan = forced(Kernel(kernel), mask, self._mask_facts)
            if plan.kernel is Kernel.RESTRICTED and self.compact is not None:
                raise ValueError("restricted postings are kept for the plain postings format "
                                 "only; this index holds compact postings")
        return self._run(plan, postings, local, self.term_max()[ids] if plan.kernel is
                         Kernel.PRUNED and self.compact is not None else None,
                         weights, mask_arr, use_mask, k, threads)

    def _run(self, plan: Plan, postings: tuple[np.ndarray, np.ndarray, np.ndarray],
             ids: np.ndarray, term_max: np.ndarray | None, weights: np.ndarray,
             mask: np.ndarray, use_mask: bool, k: int, threads: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """Run ``plan``'s kernel over ``postings`` (``ids`` index them; ``term_max``: the
        bounds of gathered postings, aligned with ``ids``; ``threads``: the exhaustive
        kernel's, ``_threads``)."""
        scratch = self._buffer()
        if plan.kernel is Kernel.GALLOP:
            return filtered_top_rows(*postings, ids, weights, plan.allowed, k, scratch)
        if plan.kernel is Kernel.RESTRICTED:
            return self.restricted.top_rows(*postings, ids, weights, mask, plan.n_allowed, k,
                                            scratch)
        if plan.kernel is Kernel.MASK_WALK:
            return mask_walk_top_rows(*postings, ids, weights, mask, plan.n_allowed, k, scratch,
                                      CHUNK)
        if plan.kernel is Kernel.PRUNED:
            bounds = self.term_max() if term_max is None else term_max
            candidates = prune_candidates(*postings, bounds, ids, weights, mask, use_mask, k,
                                          scratch)
            if candidates.size:
                return candidates_top_rows(*postings, ids, weights, candidates, k)
            # pruning would not pay: the exhaustive kernel
        # The exhaustive kernel; for a large query on a large index, searched alone
        # (``indexes.fan_out``), on one thread per core, taking its row blocks in turn.
        if threads == 1:
            return top_rows(*postings, ids, weights, mask, use_mask, k, scratch)
        return self.shared_blocks(postings, ids, weights, mask, use_mask, k, threads)

    def shared_blocks(self, postings: tuple[np.ndarray, np.ndarray, np.ndarray],
                      ids: np.ndarray, weights: np.ndarray, mask: np.ndarray, use_mask: bool,
                      k: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
        """The exhaustive kernel on ``threads`` threads at once (this one and the pool's,
        ``indexes.fan_out.by_threads``), each taking the next row block as it goes."""
        claims, found_r, found_s, sizes = new_found(threads, k)
        by_threads(functools.partial(claimed_top_rows, *postings, ids, weights, mask, use_mask,
                                     k, self._buffer(), BLOCK_ROWS, claims, found_r, found_s,
                                     sizes),
                   threads, lambda: wait_for(claims, 1, -(-self.n_docs // BLOCK_ROWS), SPINS))
        return best_found(found_s, found_r, sizes, k)

    def _threads(self, postings: int) -> int:
        """Threads for the exhaustive kernel over a query's ``postings``: one per core (at
        most one per block) when they reach ``THREADS_FROM_POSTINGS`` and this search may fan
        out."""
        blocks = -(-self.n_docs // BLOCK_ROWS)
        if blocks < 2 or postings < THREADS_FROM_POSTINGS or not fans_out():
            return 1
        return min(usable_cores(), blocks)

    def term_max(self) -> np.ndarray:
        """float32 (n_terms,): each term's largest impact (the bounds MaxScore prunes with);
        one pass over the impacts on first use (~0.1 s at 1M passages)."""
        if self._term_max is None:
            self._term_max = (self.compact.term_max if self.compact is not None
                              else term_maxima(self.indptr, self.plain_impacts())[0])
        return self._term_max

    def score_touched(
        self, tokens: Sequence[str], mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows containing at least one query term (inside ``mask``) and their BM25 scores.

        Returns (rows int32 (m,), scores float64 (m,)), rows in no particular order.
        """
        return self._search(tokens, -1, mask)

    def score_rows(self, tokens: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """BM25 scores float64 (m,) of the given rows int (m,) (0 where no query term occurs).

        A binary search of the rows in each query term's postings: O(m log df) per term, so
        scoring a few dense-leg rows never walks the postings.
        """
        ids, weights = self.query_terms(tokens)
        postings, local = self.postings_of(ids)
        return scores_of_rows(*postings, local, weights, np.asarray(rows, dtype=np.int64))

    def top_candidates(
        self, tokens: Sequence[str], n: int, mask: np.ndarray | None = None,
        kernel: Kernel | str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``n`` rows by BM25 among rows matching a query term and allowed by ``mask``.

        Returns (rows int32 (m,), scores float64 (m,)), m <= n, best first; ties broken by
        lower row (also at the cut-off: of rows tied with the n-th, the lowest are kept).
        ``kernel`` forces one (``bm25_strategy.Kernel``; every kernel gives the same answer).
        """
        return self._search(tokens, max(int(n), 0), mask,
                            None if kernel is None else Kernel(kernel))


def nonpositive_terms(indptr: np.ndarray, impacts: np.ndarray) -> frozenset[int]:
    """Ids of terms holding an impact <= 0 (or NaN): one pass over impacts, ~10 ms at 1M docs.

    indptr int64 (n_terms + 1,), impacts float32 (nnz,).
    """
    nonempty = np.flatnonzero(indptr[1:] > indptr[:-1])
    if nonempty.size == 0:
        return frozenset()
    # Empty terms are skipped, so each segment runs exactly to the next term's start.
    lowest = np.minimum.reduceat(impacts, indptr[nonempty])
    return frozenset(nonempty[~(lowest > 0)].tolist())
