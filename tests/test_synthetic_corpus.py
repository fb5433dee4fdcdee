"""The realistic synthetic corpus: deterministic, shaped as specified, and its array-built
indexes equal the library's builds from the same tokens and records."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.synthetic_corpus import (
    CATEGORIES,
    CorpusSpec,
    bm25_index,
    generate,
    metadata_index,
    queries,
)
from indexes.bm25 import BM25Index, BM25Params
from indexes.metadata import MetadataIndex
from retrieval.filters import evaluate, parse_filter

SPEC = CorpusSpec(3000, seed=5, vocab_size=100_000, n_tenants=400)


@pytest.fixture(scope="module")
def corpus():
    return generate(SPEC)


def test_same_seed_same_corpus_other_seed_other(corpus) -> None:
    again = generate(SPEC)
    for name in ("offsets", "words", "tenant", "year", "published", "category"):
        np.testing.assert_array_equal(getattr(corpus, name), getattr(again, name))
    assert queries(corpus, 20) == queries(again, 20)
    other = generate(CorpusSpec(3000, seed=6, vocab_size=100_000, n_tenants=400))
    assert not np.array_equal(other.words[:1000], corpus.words[:1000])


def test_shape_zipf_vocabulary_lengths_and_cardinalities(corpus) -> None:
    assert len(set(corpus.vocab)) == 100_000
    lengths = np.diff(corpus.offsets)
    assert lengths.min() >= 60 and lengths.max() <= 140
    counts = np.bincount(corpus.words, minlength=100_000)
    assert counts[0] > 5 * counts[9] > 0  # Zipf: frequency falls with rank
    assert (counts > 0).sum() > 20_000  # a long tail of rare words
    assert 200 < len(np.unique(corpus.tenant)) <= 400
    assert corpus.year.min() >= 2000 and corpus.year.max() <= 2025
    assert set(np.unique(corpus.category)) <= set(range(len(CATEGORIES)))
    for q in queries(corpus, 200):
        assert 2 <= len(q) <= 10
        assert not set(q) & set(corpus.vocab[:20])  # stop words left out


def test_array_built_bm25_equals_the_token_build(corpus) -> None:
    built = BM25Index.build([corpus.tokens(r) for r in range(corpus.n_docs)],
                            BM25Params(variant="okapi"))
    fast = bm25_index(corpus)
    for tokens in [corpus.vocab[:3], *queries(corpus, 50, seed=3)]:  # frequent: floored idf
        want = built.top_candidates(tokens, 50)
        got = fast.top_candidates(tokens, 50)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_array_built_metadata_equals_the_record_build(corpus) -> None:
    records = [corpus.record(r) for r in range(corpus.n_docs)]
    built, fast = MetadataIndex.build(records), metadata_index(corpus)
    assert fast.kinds == built.kinds
    for spec in ({"article": {"in": ["article-0000003", "article-0000599", "x"]}},
                 {"tenant": {"in": [records[0]["tenant"], records[7]["tenant"], "nobody"]}},
                 {"category": "news", "year": {"gte": 2020}},
                 {"published": {"lt": "2010-06-01"}}, "NOT tenant = 'tenant-00001'"):
        parsed = parse_filter(spec, built.kinds)
        np.testing.assert_array_equal(evaluate(parsed, fast), evaluate(parsed, built))
