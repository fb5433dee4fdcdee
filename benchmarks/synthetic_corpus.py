"""A realistic synthetic corpus for latency runs at 1M-10M documents, generated vectorized.

Text statistics follow real passages more closely than ``benchmarks.synthetic``'s ~100 words:
words drawn from a Zipfian vocabulary (rank r has probability proportional to 1 / r^s, s ~ 1.07
as in English) of 200,000 made-up words, passages of 60-140 words; metadata with realistic
cardinalities: a tenant id (thousands of values, sizes skewed: a few large tenants, many small),
a year (skewed to recent years), a publication date and a category. Queries are 2-10 words drawn
from the same distribution without its most frequent words (queries rarely hold stop words).

Documents are arrays (word ranks per passage, CSR), never Python strings per word, so 1M
passages generate in seconds; ``bm25_index`` and ``metadata_index`` build the library's indexes
from them directly, equal to building them from the same tokens and records. Nothing here
measures quality: generated text has no relevance judgments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from indexes.bm25 import BM25Index, BM25Params, idf_weights, impacts_for
from indexes.metadata import FieldKind, MetadataIndex

CATEGORIES = ("news", "policy", "contract", "email", "wiki", "ticket", "report", "manual",
              "faq", "minutes", "invoice", "spec", "memo", "blog", "paper", "legal", "hr",
              "sales", "support", "release-notes")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70


@dataclass(frozen=True)
class CorpusSpec:
    """Parameters of the generator (defaults: the benchmark corpus)."""

    n_docs: int
    seed: int = 0
    vocab_size: int = 200_000
    zipf_s: float = 1.07
    min_words: int = 60
    max_words: int = 140
    n_tenants: int = 5000
    passages_per_article: int = 5  # adjacent rows share an article id (access-control lists)
    first_year: int = 2000
    last_year: int = 2025


@dataclass(frozen=True)
class SyntheticCorpus:
    """Passages as word ranks: passage i is ``words[offsets[i]:offsets[i + 1]]`` (int32 ranks
    into ``vocab``); metadata columns are row-aligned arrays."""

    spec: CorpusSpec
    vocab: list[str]
    offsets: np.ndarray  # int64 (n_docs + 1,)
    words: np.ndarray  # int32 (n_words,)
    tenant: np.ndarray  # int32 (n_docs,), 0..n_tenants-1
    year: np.ndarray  # int16 (n_docs,)
    published: np.ndarray  # float64 (n_docs,), epoch seconds UTC within ``year``
    category: np.ndarray  # int8 (n_docs,), index into CATEGORIES

    @property
    def n_articles(self) -> int:
        return -(-self.spec.n_docs // self.spec.passages_per_article)

    @property
    def n_docs(self) -> int:
        return self.spec.n_docs

    def tokens(self, row: int) -> list[str]:
        return [self.vocab[w] for w in self.words[self.offsets[row]: self.offsets[row + 1]]]

    def record(self, row: int) -> dict[str, object]:
        """Row ``row``'s metadata as a document would carry it."""
        when = datetime.fromtimestamp(float(self.published[row]), tz=UTC)
        return {"tenant": tenant_id(int(self.tenant[row])), "year": int(self.year[row]),
                "article": article_id(row // self.spec.passages_per_article),
                "published": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "category": CATEGORIES[int(self.category[row])]}


def tenant_id(tenant: int) -> str:
    return f"tenant-{tenant:05d}"


def article_id(article: int) -> str:
    return f"article-{article:07d}"


def vocabulary(size: int) -> list[str]:
    """``size`` distinct pronounceable words, rank order (rank 0 is the most frequent)."""
    words = []
    base = len(_SYLLABLES)
    for rank in range(size):
        parts, n = [], rank + base  # at least two syllables
        while n:
            n, digit = divmod(n, base)
            parts.append(_SYLLABLES[digit])
        words.append("".join(parts))
    return words


def zipf_cdf(vocab_size: int, s: float) -> np.ndarray:
    """float64 (vocab_size,): cumulative probability of ranks 0..vocab_size-1."""
    weights = 1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** s
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def generate(spec: CorpusSpec) -> SyntheticCorpus:
    """The corpus for ``spec``; the same spec gives the same corpus."""
    rng = np.random.default_rng(spec.seed)
    n = spec.n_docs
    lengths = rng.integers(spec.min_words, spec.max_words + 1, size=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    cdf = zipf_cdf(spec.vocab_size, spec.zipf_s)
    words = np.empty(int(offsets[-1]), dtype=np.int32)
    chunk = 1 << 24  # bounded temporaries: ~130 MB of uniforms per chunk
    for start in range(0, words.shape[0], chunk):
        stop = min(start + chunk, words.shape[0])
        words[start:stop] = np.searchsorted(cdf, rng.random(stop - start), side="right")
    np.minimum(words, spec.vocab_size - 1, out=words)  # a uniform of exactly 1.0 - eps
    # Tenants: Zipf-sized (s=1) over n_tenants, ids shuffled so size does not follow the id.
    tenant_rank = np.searchsorted(zipf_cdf(spec.n_tenants, 1.0), rng.random(n), side="right")
    tenant = rng.permutation(spec.n_tenants).astype(np.int32)[
        np.minimum(tenant_rank, spec.n_tenants - 1)]
    span = spec.last_year - spec.first_year + 1
    year_weights = np.linspace(1.0, 4.0, span)  # more documents in recent years
    year = (spec.first_year + rng.choice(span, size=n, p=year_weights / year_weights.sum())
            ).astype(np.int16)
    starts = np.array([datetime(y, 1, 1, tzinfo=UTC).timestamp()
                       for y in range(spec.first_year, spec.last_year + 2)])
    index = year - spec.first_year
    published = np.floor(starts[index] + rng.random(n) * (starts[index + 1] - starts[index]))
    cat_weights = 1.0 / np.arange(1, len(CATEGORIES) + 1)
    category = rng.choice(len(CATEGORIES), size=n, p=cat_weights / cat_weights.sum()
                          ).astype(np.int8)
    return SyntheticCorpus(spec, vocabulary(spec.vocab_size), offsets, words, tenant, year,
                           published, category)


def queries(corpus: SyntheticCorpus, n: int, seed: int = 1, min_words: int = 2,
            max_words: int = 10, skip_top: int = 20) -> list[list[str]]:
    """``n`` queries of min_words..max_words words from the corpus's Zipf distribution, the
    ``skip_top`` most frequent words left out (stop words)."""
    rng = np.random.default_rng(seed)
    cdf = zipf_cdf(corpus.spec.vocab_size, corpus.spec.zipf_s)
    low = cdf[skip_top - 1] if skip_top else 0.0
    sizes = rng.integers(min_words, max_words + 1, size=n)
    draws = np.searchsorted(cdf, low + rng.random(int(sizes.sum())) * (1.0 - low), side="right")
    draws = np.minimum(draws, corpus.spec.vocab_size - 1)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [[corpus.vocab[w] for w in draws[a:b]] for a, b in zip(bounds[:-1], bounds[1:],
                                                                  strict=True)]


def bm25_index(corpus: SyntheticCorpus, params: BM25Params | None = None) -> BM25Index:
    """The BM25 index of the corpus, built from its arrays (a sort of (word, row) pairs): the
    same impacts as ``BM25Index.build`` on the passages' tokens, in seconds at 1M passages."""
    params = params or BM25Params()
    n, vocab_size = corpus.n_docs, corpus.spec.vocab_size
    lengths = np.diff(corpus.offsets).astype(np.float64)
    rows_of_words = np.repeat(np.arange(n, dtype=np.int64), np.diff(corpus.offsets))
    keys = corpus.words.astype(np.int64) * n + rows_of_words  # term-major, rows ascending
    del rows_of_words
    keys.sort()
    first = np.empty(keys.shape[0], dtype=bool)
    first[0:1] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    tfs = np.diff(np.append(starts, keys.shape[0])).astype(np.float64)
    pairs = keys[starts]
    del keys, first, starts
    term_ids, rows = np.divmod(pairs, n)
    counts = np.bincount(term_ids, minlength=vocab_size)
    indptr = np.zeros(vocab_size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    avgdl = float(lengths.mean()) if n else 0.0
    used = counts > 0  # okapi's negative-idf floor averages the idf of words that occur only
    idf = np.zeros(vocab_size)
    idf[used] = idf_weights(counts[used].astype(np.float64), n, params)
    impacts = impacts_for(tfs, lengths[rows], idf[term_ids], avgdl, params).astype(np.float32)
    return BM25Index(corpus.vocab, indptr, rows.astype(np.int32), impacts, n, params)


def metadata_index(corpus: SyntheticCorpus) -> MetadataIndex:
    """The metadata index of ``record(row)`` for every row, built from the arrays."""
    kinds: dict[str, FieldKind] = {"article": "keyword", "category": "keyword",
                                   "published": "date", "tenant": "keyword", "year": "number"}
    keywords = {"tenant": _postings(corpus.tenant, [tenant_id(t) for t in
                                                    range(corpus.spec.n_tenants)]),
                "category": _postings(corpus.category, list(CATEGORIES)),
                "article": _postings(np.arange(corpus.n_docs) // corpus.spec.passages_per_article,
                                     [article_id(a) for a in range(corpus.n_articles)])}
    columns = {"year": corpus.year.astype(np.float64), "published": corpus.published}
    return MetadataIndex(corpus.n_docs, kinds, keywords, columns)


def _postings(codes: np.ndarray, names: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(values sorted as MetadataIndex keeps them, offsets int64, rows int32) of a code column;
    values that no row holds are left out, as a build from records would."""
    order = np.argsort(names)
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    sorted_codes = rank[codes]
    rows = np.argsort(sorted_codes, kind="stable").astype(np.int32)
    counts = np.bincount(sorted_codes, minlength=len(names))
    present = counts > 0
    values = [names[i] for i in order[present]]
    offsets = np.zeros(int(present.sum()) + 1, dtype=np.int64)
    np.cumsum(counts[present], out=offsets[1:])
    return values, offsets, rows
