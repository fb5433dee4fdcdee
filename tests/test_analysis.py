"""The compiled, parallel analysis stage (indexes.analysis): the postings it gives are those of
the Python analyzer's tokens, built the straightforward way (a Counter per row, a stable sort
by term, BM25's formula over numpy arrays), byte for byte, on every shipped collection and on
random text; any number of parts gives the same arrays."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.analysis import (
    analyze,
    continuation_table,
    word_characters,
    word_or_mark_characters,
)
from indexes.analyzer import (
    MARK_RANGES,
    TOKEN_PATTERN,
    WORD_CHARACTER_TOKEN_PATTERN,
    Analyzer,
    AnalyzerConfig,
)
from indexes.bm25 import BM25Index, BM25Params, idf_weights, impacts_for
from indexes.corpus import read_corpus

SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "data"


def reference(docs: list[list[str]], params: BM25Params) -> tuple[list[str], np.ndarray,
                                                                  np.ndarray, np.ndarray]:
    """(vocab, indptr, rows, impacts) as the build made them before the compiled stage."""
    vocab: dict[str, int] = {}
    terms, rows, tfs, lengths = [], [], [], []
    for row, tokens in enumerate(docs):
        lengths.append(len(tokens))
        for term, tf in Counter(tokens).items():
            terms.append(vocab.setdefault(term, len(vocab)))
            rows.append(row)
            tfs.append(tf)
    term_ids = np.asarray(terms, dtype=np.int64)
    order = np.argsort(term_ids, kind="stable")
    term_ids = term_ids[order]
    row_ids = np.asarray(rows, dtype=np.int32)[order]
    tf = np.asarray(tfs, dtype=np.float64)[order]
    counts = np.bincount(term_ids, minlength=len(vocab))
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    length = np.asarray(lengths, dtype=np.float64)
    idf = idf_weights(counts.astype(np.float64), len(docs), params)
    impacts = impacts_for(tf, length[row_ids], idf[term_ids],
                          float(length.mean()) if docs else 0.0, params)
    return list(vocab), indptr, row_ids, impacts.astype(np.float32)


def compiled(texts: list[str], config: AnalyzerConfig, params: BM25Params, workers: int
             ) -> BM25Index:
    postings = analyze(texts, config, workers)
    return BM25Index.from_postings(postings.terms, postings.post_terms, postings.post_rows,
                                   postings.post_tfs, postings.lengths, params)


def assert_same(index: BM25Index, expected: tuple) -> None:
    vocab, indptr, rows, impacts = expected
    assert index.vocab_list == vocab
    assert index.indptr.tobytes() == indptr.tobytes()
    assert index.rows.tobytes() == rows.tobytes()
    assert index.impacts.tobytes() == impacts.tobytes()


@pytest.mark.parametrize("name", ["cranfield", "cisi", "scifact"])
@pytest.mark.parametrize("variant", ["okapi", "lucene"])
def test_a_shipped_collection_gets_the_python_analyzers_postings(name, variant):
    texts = [d.content for d in read_corpus(SHIPPED / name)]
    params, analyzer = BM25Params(variant=variant), Analyzer()
    expected = reference([analyzer(t) for t in texts], params)
    for workers in (1, 2, 3):
        assert_same(compiled(texts, AnalyzerConfig(), params, workers), expected)


WORDS = st.sampled_from(["the", "The", "of", "Running", "runs", "naïve", "NAÏVE", "ﬁle", "x",
                         "İstanbul", "straße", "Ⅻ", "e\u0301t\u00e9", "co-op", "a_b", "42",
                         "٣٤", "日本語", "\ud800", "\x00", "q", "ab", "हिन्दी", "भाषाएँ",
                         "สวัสดี", "தமிழ்", "ọ̀rọ̀", "x\u0301", "\u0301ab", "\u20dd", "a\u0301\u0301",
                         "\U0001e944", "a\U0001d165", "\U000e0100z", "é"])
SEPARATORS = st.sampled_from([" ", " ", "", "\u0301", "-"])  # a mark between words, too
TEXTS = st.lists(st.tuples(st.lists(st.one_of(WORDS, st.text(max_size=8)), max_size=12),
                           SEPARATORS).map(lambda p: p[1].join(p[0])), min_size=1, max_size=12)


@pytest.mark.parametrize("pattern", [TOKEN_PATTERN, WORD_CHARACTER_TOKEN_PATTERN])
@settings(max_examples=150, deadline=None)
@given(texts=TEXTS, workers=st.integers(1, 4))
def test_random_text_gets_the_python_analyzers_postings(pattern, texts, workers):
    """Any text: ASCII or not, NFKC-changed (ligatures, numerals), case-changing (İ, ß),
    digits, underscores, lone surrogates, NULs, stop words, combining marks (in words, after
    none, alone); by the token rule of new builds and by that of builds made before marks
    were kept."""
    params, config = BM25Params(), AnalyzerConfig(token_pattern=pattern)
    expected = reference([Analyzer(config)(t) for t in texts], params)
    assert_same(compiled(texts, config, params, workers), expected)


@pytest.mark.parametrize("texts", [["hi"] * 4, ["ab"] * 5000, ["ab cd"] * 3000,
                                   ["ab ab ab"] * 200, ["ab", "", "cd", "e", "fg"] * 400])
def test_documents_of_a_few_short_words_keep_every_posting(texts):
    """A batch's documents are joined with no byte between them: "ab" is 2 bytes and one
    token, more tokens than the 3 bytes a token the buffer was sized for (the last document's
    postings were lost, or the heap written past its end)."""
    params = BM25Params()
    expected = reference([Analyzer()(t) for t in texts], params)
    for workers in (1, 2):
        assert_same(compiled(texts, AnalyzerConfig(), params, workers), expected)


def test_another_token_pattern_and_no_stemmer_are_analyzed_in_python_the_same_way():
    config = AnalyzerConfig(token_pattern=r"[a-z]+", stemmer=None, stop_words=("of",))
    texts = [d.content for d in read_corpus(SHIPPED / "cranfield")][:300]
    expected = reference([Analyzer(config)(t) for t in texts], BM25Params())
    for workers in (1, 2):
        assert_same(compiled(texts, config, BM25Params(), workers), expected)


def test_tables_grow_past_their_first_size_within_one_document():
    """One text with 100,000 distinct words (the word table starts at 32,768 words and 1 MB)
    and many small ones after it."""
    rng = np.random.default_rng(3)
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, 9)) for _ in range(100_000)]
    texts = [" ".join(words)] + [" ".join(words[i:i + 7]) for i in range(0, 20_000, 5)]
    expected = reference([Analyzer()(t) for t in texts], BM25Params())
    assert_same(compiled(texts, AnalyzerConfig(), BM25Params(), 2), expected)


def test_the_word_character_table_is_res():
    pattern = re.compile(r"\w")
    table = word_characters()
    assert all(table[c] == bool(pattern.match(chr(c))) for c in range(0x110000))


def test_the_table_a_token_goes_on_through_is_the_token_patterns_class():
    """TOKEN_PATTERN is ``\\w[<class>]+``: its class, as ``re`` matches it, is the table."""
    assert TOKEN_PATTERN.startswith(r"(?u)\w[") and TOKEN_PATTERN.endswith("]+")
    goes_on = re.compile(TOKEN_PATTERN[len(r"(?u)\w"):-1])
    table = word_or_mark_characters()
    assert all(table[c] == bool(goes_on.match(chr(c))) for c in range(0x110000))


def test_the_compiled_split_knows_both_default_rules_and_no_other():
    assert continuation_table(TOKEN_PATTERN) is word_or_mark_characters()
    assert continuation_table(WORD_CHARACTER_TOKEN_PATTERN) is word_characters()
    assert continuation_table(r"[a-z]+") is None


def test_the_mark_ranges_are_unicode_14s_combining_marks():
    """The ranges are written out (the pattern, and so the fingerprint, must not change with
    the Python's Unicode database); a mark keeps its category in later versions."""
    listed = {c for first, last in MARK_RANGES for c in range(first, last + 1)}
    assert all(unicodedata.category(chr(c)) in ("Mn", "Mc", "Me") for c in listed)
    assert all(a <= b < c for (a, b), (c, _) in pairwise(MARK_RANGES))
    if unicodedata.unidata_version == "14.0.0":
        marks = {c for c in range(0x110000)
                 if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me")}
        assert listed == marks


def test_the_words_before_stemming_map_to_their_terms():
    postings = analyze(["Running runners ran", "the runs"], AnalyzerConfig())
    assert postings.words == {"running": "run", "runners": "runner", "ran": "ran",
                              "runs": "run"}


def test_every_distinct_word_gets_one_id_as_the_table_grows():
    """The word table answers a word of 8 bytes or fewer from its slot alone and compares the
    rest of a longer word's bytes in the arena; its slots are rebuilt from the arena as it
    grows. Words alike in their first 8 bytes, multi-byte characters across the 8th byte, and
    words met again after the table grew each keep exactly one id."""
    from indexes.analysis import _split_compiled, _WordTable

    rng = np.random.default_rng(8)
    letters = list("abcdefgh") + ["é", "ß", "ж", "日"]
    stems = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(40_000)]
    words = stems + [w + "x" * int(rng.integers(1, 8)) + "é" for w in stems[:20_000]]
    texts = [" ".join(words[i:i + 40]) for i in range(0, len(words), 40)]
    texts += list(reversed(texts))  # every word met again once the table has grown
    analyzer = Analyzer(AnalyzerConfig(stop_words=()))  # the table keeps stop words too
    table = _WordTable()
    ids, ends = _split_compiled(texts, analyzer, table)
    tokens = [w for t in texts for w in analyzer.words(t)]
    known = table.words(0, int(table.state[0]))
    assert len(known) == len(set(tokens))  # one id per distinct word
    assert [known[i] for i in ids] == tokens
    assert ends[-1] == len(tokens)
