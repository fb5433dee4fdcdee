"""Combining marks (Unicode categories Mn, Mc, Me) stay in the word they modify: "İstanbul"
lower-cased is "i\u0307stanbul", and Hindi, Thai and Tamil write vowels as marks. Python's
``\\w`` leaves marks out, so the analyzer cut such words into one-letter pieces and dropped
them, at build and at query time alike. The Python analyzer and the compiled build path give
the same whole words; a build made with the former rule keeps analyzing with it."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections import Counter

import pytest
import Stemmer
from live_index import INFO, unit_vectors

from indexes import BuildConfig, Document, build_index
from indexes.analysis import analyze
from indexes.analyzer import ENGLISH_STOP_WORDS, Analyzer, AnalyzerConfig
from indexes.manifest import read_manifest, resolve_build_dir
from retrieval import Retriever
from retrieval.loaded_build import LoadedBuild

# The token rule every build recorded before marks were kept.
FORMER_PATTERN = r"(?u)\b\w\w+\b"

HINDI = "भारत एक विशाल देश है और यहाँ कई भाषाएँ बोली जाती हैं"
WHOLE_WORDS = [
    ("İstanbul", ["i\u0307stanbul"]),
    (HINDI, HINDI.split()),
    ("สวัสดี ภาษาไทย", ["สวัสดี", "ภาษาไทย"]),  # Thai: vowel and tone marks
    ("தமிழ் மொழி", ["தமிழ்", "மொழி"]),  # Tamil: vowel signs and virama
    ("cafe\u0301 au lait", ["café", "au", "lait"]),  # NFKC composes the accent
    ("ọ̀rọ̀ dúdú", ["ọ̀rọ̀", "dúdú"]),  # Yoruba: o, dot below, grave: no composed form
    ("x\u0301 q", ["x\u0301"]),  # a letter and its mark are two code points
    ("\u0301\u0301ab \u0301 c", ["ab"]),  # marks after no word start none
]


def compiled_rows(texts: list[str], config: AnalyzerConfig) -> tuple[list[str], list[Counter]]:
    """The compiled build path's terms (first-occurrence order) and each text's term counts."""
    postings = analyze(texts, config, workers=1)
    rows: list[Counter] = [Counter() for _ in texts]
    for term, row, tf in zip(postings.post_terms.tolist(), postings.post_rows.tolist(),
                             postings.post_tfs.tolist(), strict=True):
        rows[row][postings.terms[term]] = tf
    return postings.terms, rows


def assert_compiled_matches(texts: list[str], config: AnalyzerConfig) -> None:
    analyzer = Analyzer(config)
    tokens = [analyzer(t) for t in texts]
    terms, rows = compiled_rows(texts, config)
    assert terms == list(dict.fromkeys(t for row in tokens for t in row))
    assert rows == [Counter(row) for row in tokens]


@pytest.mark.parametrize(("text", "words"), WHOLE_WORDS,
                         ids=["istanbul", "hindi", "thai", "tamil", "cafe", "yoruba",
                              "letter-and-mark", "marks-after-no-word"])
def test_words_with_combining_marks_stay_whole(text, words):
    config = AnalyzerConfig(stop_words=())
    assert Analyzer(config).words(text) == [unicodedata.normalize("NFKC", w) for w in words]
    assert_compiled_matches([text], config)
    assert_compiled_matches([text], AnalyzerConfig())  # stop words and stemming as well


def test_a_decomposed_accent_under_nfd_stays_in_its_word():
    config = AnalyzerConfig(normalization="NFD", stemmer=None, stop_words=())
    assert Analyzer(config)("café naïve") == ["cafe\u0301", "nai\u0308ve"]
    assert_compiled_matches(["café naïve", "e\u0301 ü"], config)


def test_the_query_and_the_build_split_alike_over_many_texts():
    texts = [w for text, _ in WHOLE_WORDS for w in (text, text.upper(), text + " " + HINDI)]
    assert_compiled_matches(texts, AnalyzerConfig())
    assert_compiled_matches(texts, AnalyzerConfig(token_pattern=FORMER_PATTERN))


HINDI_DOCS = {
    "delhi": "दिल्ली भारत की राजधानी है और यहाँ बहुत सारे लोग रहते हैं",
    "ganga": "गंगा नदी हिमालय से निकलती है और समुद्र में मिलती है",
    "cricket": "क्रिकेट भारत में सबसे लोकप्रिय खेल माना जाता है",
    "mango": "आम गर्मियों में मिलने वाला मीठा फल है",
}
KEYWORDS_ONLY = {"candidate_policy": "keyword", "vector_weight": 0.0}


def test_a_hindi_query_finds_its_document_by_bm25(tmp_path):
    docs = [Document(doc_id, text) for doc_id, text in HINDI_DOCS.items()]
    build_index(docs, tmp_path, vectors=unit_vectors(len(docs), 0), encoder_info=INFO,
                dense="exact", progress=False)
    vector = unit_vectors(1, 7)[0]
    with Retriever.load(tmp_path, KEYWORDS_ONLY) as retriever:
        for query, doc_id in (("गंगा", "ganga"), ("क्रिकेट", "cricket"), ("राजधानी", "delhi")):
            hits = retriever.search(query, k=2, query_vector=vector).hits
            assert hits and hits[0].doc_id == doc_id, query
            assert hits[0].bm25_score > 0
            assert [h.doc_id for h in hits if h.bm25_score > 0] == [doc_id]


# What the analyzer's defaults wrote into every manifest before marks were kept.
FORMER_MANIFEST_ANALYZER = {"normalization": "NFKC", "lowercase": True,
                            "token_pattern": FORMER_PATTERN,
                            "stop_words": list(ENGLISH_STOP_WORDS), "stemmer": "english"}


def test_a_former_manifests_analyzer_keeps_its_rule_and_fingerprint():
    analyzer = Analyzer(AnalyzerConfig(**FORMER_MANIFEST_ANALYZER))
    assert analyzer.words("İstanbul विशाल देश") == ["stanbul"]  # one-letter pieces dropped
    # The fingerprint the former code computed: the config as JSON with the stemmer version.
    payload = {**FORMER_MANIFEST_ANALYZER, "stemmer_version": Stemmer.version()}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert analyzer.fingerprint == digest
    assert Analyzer().fingerprint != digest  # new builds record the new rule


def test_a_build_made_with_the_former_rule_loads_and_analyzes_queries_with_it(tmp_path):
    docs = [Document("city", "İstanbul straddles the Bosphorus"),
            *(Document(doc_id, text) for doc_id, text in HINDI_DOCS.items())]
    config = BuildConfig(analyzer=AnalyzerConfig(token_pattern=FORMER_PATTERN))
    build_index(docs, tmp_path, vectors=unit_vectors(len(docs), 0), encoder_info=INFO,
                dense="exact", progress=False, config=config)
    manifest = read_manifest(resolve_build_dir(tmp_path))
    assert manifest.analyzer == FORMER_MANIFEST_ANALYZER
    build = LoadedBuild.load(tmp_path)
    assert build.analyzer.config.token_pattern == FORMER_PATTERN
    assert build.analyzer("İstanbul") == ["stanbul"]
    assert build.bm25.doc_freq("stanbul") == 1 and build.bm25.doc_freq("i\u0307stanbul") == 0
    with Retriever.load(tmp_path, KEYWORDS_ONLY) as retriever:
        hits = retriever.search("İstanbul", k=1, query_vector=unit_vectors(1, 7)[0]).hits
    assert hits[0].doc_id == "city" and hits[0].bm25_score > 0
