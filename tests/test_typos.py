"""Typo tolerance in the keyword leg: misspelt words are searched as the closest corpus word
(by length: 1 edit from 5 letters, 2 from 9), weighted below exact terms, named in the
result's ``corrections``; a word whose term the index holds is never rewritten; the same on
whole, sharded and live builds; off by configuration, absent from builds made without it."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_index import build_small, unit_vectors
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401 (fixtures)

from indexes import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.docstore import Document
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.typos import TypoIndex, deletions, max_edits, osa_distance
from indexes.typos_kernels import word_keys
from indexes.writer import IndexWriter
from retrieval import Retriever, RetrieverConfig
from retrieval.request_path.pipeline import keyword_terms
from retrieval.result_json import result_json

TYPOS = {"supersoinc": "superson",  # adjacent swap
         "supersnic": "superson",  # a dropped letter
         "superssonic": "superson",  # a doubled letter
         "supersinic": "superson",  # a neighbouring key
         "boundray": "boundari", "trnasition": "transit"}
CLEAN = {"superson": "supersonic", "boundari": "boundary", "transit": "transition"}


def test_edits_grow_with_the_words_length_and_a_swap_is_one_edit():
    assert [max_edits("a" * n) for n in (4, 5, 8, 9, 14, 32, 33)] == [0, 1, 1, 2, 2, 2, 0]
    assert osa_distance("protein", "portein", 1) == 1
    assert osa_distance("protein", "protien", 2) == 1
    assert osa_distance("protein", "prtoien", 1) == 2  # past the limit: limit + 1
    assert deletions("abc", 1) == {"abc", "ab", "ac", "bc"}


def test_a_word_past_the_longest_corrected_makes_no_deletions(monkeypatch):
    # A query word's deletions grow with its length squared (a 4,096-letter word took about
    # a minute of CPU): past MAX_LETTERS it is neither looked up nor entered.
    from indexes import typos

    words = ["transcription", "a" * (typos.MAX_LETTERS + 1)]
    index = typos.TypoIndex.build(words, lambda ws: ws, lambda stems: np.full(len(stems), 5))
    assert index.words == ["transcription"]

    def no_deletions(*args):
        raise AssertionError("deletions made for a word past MAX_LETTERS")

    monkeypatch.setattr(typos, "word_keys", no_deletions)
    assert index.closest("b" * 4096, lambda stem: 5) is None
    assert index.closest("transcritpion" * 3, lambda stem: 5) is None


def test_a_query_of_one_very_long_word_is_searched_without_a_correction(retriever):
    result = retriever.search("supersonic " + "q" * 4000, k=3)
    assert result.corrections == {} and result.hits


@pytest.fixture(scope="module")
def retriever(index, query_encoder):
    with Retriever.load(index, RetrieverConfig(), encoder=query_encoder) as loaded:
        yield loaded


@pytest.mark.parametrize(("typo", "term"), sorted(TYPOS.items()))
def test_a_misspelt_word_is_searched_as_the_corpus_word_and_named(retriever, typo, term):
    vocab = retriever.snapshot.bm25.vocab
    assert term in vocab and retriever.snapshot.analyzer(typo)[0] not in vocab
    word = CLEAN[term]
    result = retriever.search(typo, k=10)
    assert result.corrections == {typo: term}
    assert json.loads(result_json(result))["corrections"] == {typo: term}
    # By keywords alone one term scaled by typo_weight ranks as the word spelt right (the
    # vector leg embeds the text as typed).
    with retriever.with_ranking(candidate_policy="keyword", vector_weight=0.0) as keywords:
        typed, exact = keywords.search(typo, k=10), keywords.search(word, k=10)
    assert typed.hits and [h.doc_id for h in typed.hits] == [h.doc_id for h in exact.hits]


def test_a_word_the_index_holds_is_never_rewritten(retriever, index, dataset):
    docs = list(islice(read_corpus(dataset("cranfield")), 200))
    vocab = retriever.snapshot.bm25.vocab
    analyzer = retriever.snapshot.analyzer
    words = sorted({w for d in docs for w in analyzer.words(d.content)})
    known = [w for w in words if analyzer.stem([w])[0] in vocab]
    assert len(known) > 1000
    for start in range(0, len(known), 200):  # queries of 200 known words each
        terms = keyword_terms(retriever.snapshot, " ".join(known[start:start + 200]),
                              retriever.config)
        assert terms.corrections == {}
        assert [str(t) for t in terms.tokens] == analyzer.stem(known[start:start + 200])
    for query in QUERIES:
        assert retriever.search(query).corrections == {}


def test_a_corrected_term_weighs_less_than_an_exact_one_and_explains_so(retriever):
    with retriever.with_ranking(candidate_policy="keyword", vector_weight=0.0) as keywords:
        exact = keywords.search("supersonic", k=5, explain=True)
        typo = keywords.search("supersoinc", k=5, explain=True)
    assert [h.doc_id for h in typo.hits] == [h.doc_id for h in exact.hits]
    weight = retriever.config.typo_weight
    for a, b in zip(exact.hits, typo.hits, strict=True):
        assert b.bm25_score == pytest.approx(weight * a.bm25_score, rel=1e-9)
        assert b.explanation is not None
        assert b.explanation.bm25_terms == pytest.approx({"superson": b.bm25_score})


def test_turned_off_the_misspelt_word_matches_nothing(retriever):
    with retriever.with_ranking(typo_tolerance=False, candidate_policy="keyword") as off:
        result = off.search("supersoinc", k=5)
    assert result.corrections == {} and result.hits == []


def test_a_build_without_the_dictionary_searches_as_before(tmp_path, index, query_encoder):
    docs = [Document(f"d{i}", text) for i, text in enumerate(
        ["supersonic flow over a wedge", "boundary layer transition", "heat transfer"])]
    info = read_manifest(resolve_build_dir(index)).encoder
    vectors = query_encoder.encode([d.text for d in docs])
    build_index(docs, tmp_path / "plain", vectors=vectors, encoder_info=info,
                config=BuildConfig(typo_tolerance=False), progress=False)
    assert not list((tmp_path / "plain" / "builds").glob("*/bm25/typos"))
    with Retriever.load(tmp_path / "plain", encoder=query_encoder) as plain:
        assert plain.snapshot.bm25.typos is None
        result = plain.search("supersoinc flow", k=3)
        assert result.corrections == {} and result.hits[0].doc_id == "d0"


def test_whole_sharded_and_live_builds_correct_alike(tmp_path, dataset):
    docs = [Document(d.id, d.text, d.title) for d in islice(read_corpus(dataset("cranfield")),
                                                              300)]
    vectors = build_small(tmp_path / "whole", docs)
    build_small(tmp_path / "sharded", docs, shards=3)
    query = "supersoinc boundray layer"
    vector = unit_vectors(1, 9)[0]
    results = []
    for name in ("whole", "sharded"):
        with Retriever.load(tmp_path / name) as loaded:
            results.append(loaded.search(query, k=10, query_vector=vector))
    assert results[0].corrections == results[1].corrections == {"supersoinc": "superson",
                                                                "boundray": "boundari"}
    assert [h.doc_id for h in results[0].hits] == [h.doc_id for h in results[1].hits]
    keywords = {"live_lag_seconds": 0.01, "candidate_policy": "keyword", "vector_weight": 0.0}
    with IndexWriter(tmp_path / "whole") as writer, \
            Retriever.load(tmp_path / "whole", keywords) as live:
        seq = writer.upsert([Document("new-1", "supersonic boundary layer")],
                            vectors=vectors[:1])
        live.wait_for_seq(seq)
        result = live.search(query, k=10, query_vector=vector)
    assert result.corrections == {"supersoinc": "superson", "boundray": "boundari"}
    assert "new-1" in {h.doc_id for h in result.hits}


def test_the_dictionary_round_trips_and_leaves_rare_words_out(tmp_path: Path):
    words = ["protein", "proteins", "transcription", "zzzzzz", "cells"]
    rows = {"protein": 5, "transcript": 3, "zzzzzz": 1, "cell": 9}
    stems = {"proteins": "protein", "transcription": "transcript", "cells": "cell"}
    typos = TypoIndex.build(words, lambda ws: [stems.get(w, w) for w in ws],
                            lambda ss: [rows.get(s, 0) for s in ss])
    assert "zzzzzz" not in typos.words  # one row holds it: not a correction target
    typos.save(tmp_path)
    loaded = TypoIndex.load(tmp_path)
    assert loaded is not None and loaded.words == typos.words
    assert np.array_equal(loaded.keys, typos.keys)
    counts = rows.get
    assert loaded.closest("transcritpion", lambda s: counts(s, 0)) == "transcript"  # 2 edits
    assert loaded.closest("protien", lambda s: counts(s, 0)) == "protein"
    assert loaded.closest("zzzzzy", lambda s: counts(s, 0)) is None
    assert loaded.closest("protien", lambda s: 1) is None  # fewer than 2 rows hold it now
    assert TypoIndex.load(tmp_path / "absent") is None


def test_the_cli_says_what_it_corrected(index, capsys):
    from retrieval.cli.app import main

    assert main(["search", str(index), "supersoinc flow", "--k", "3"]) == 0
    assert "no document holds 'supersoinc'; searched as 'superson'" in capsys.readouterr().err


def _fnv_code_points(text: str) -> int:
    h = 14695981039346656037
    for c in text:
        h = ((h ^ ord(c)) * 1099511628211) % 2**64
    return h


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(categories=["L"]), min_size=1, max_size=14),
                min_size=1, max_size=5), st.integers(0, 2))
def test_the_compiled_keys_are_the_hashes_of_the_words_deletions(words, edits):
    """deletion_keys enumerates exactly ``deletions``: each distinct string once per word."""
    keys, ids = word_keys(words, [edits] * len(words))
    for i, word in enumerate(words):
        assert sorted(keys[ids == i].tolist()) == sorted(
            {_fnv_code_points(v) for v in deletions(word, edits)})


def test_a_build_hashed_the_older_way_still_finds_its_corrections(tmp_path):
    """A dictionary saved before the compiled keys (blake2b, no "keys" in words.json) is
    looked up with its own hash, not silently missed."""
    from indexes.typos import key

    words, stems = ["supersonic", "transition"], ["superson", "transit"]
    pairs = sorted((key(v), i) for i, w in enumerate(words) for v in deletions(w, max_edits(w)))
    legacy = TypoIndex(words, stems, [3, 3], np.array([k for k, _ in pairs], dtype=np.uint64),
                       np.array([i for _, i in pairs], dtype=np.int32), key_scheme=None)
    legacy.save(tmp_path)
    manifest = json.loads((tmp_path / "words.json").read_text())
    manifest.pop("keys")
    (tmp_path / "words.json").write_text(json.dumps(manifest))
    loaded = TypoIndex.load(tmp_path)
    assert loaded is not None and loaded.key_scheme is None
    assert loaded.closest("supersoinc", lambda _: 3) == "superson"
    assert TypoIndex.build(words, lambda ws: stems, lambda ss: [3] * len(ss)).closest(
        "trnasition", lambda _: 3) == "transit"


def test_a_stemmer_or_counter_that_drops_words_is_refused():
    words = ["protein", "transcription"]
    with pytest.raises(ValueError, match="2 words gave 1 stems"):
        TypoIndex.build(words, lambda ws: ws[:1], lambda ss: [3] * len(ss))
    with pytest.raises(ValueError, match="2 words gave 2 stems and 1 row counts"):
        TypoIndex.build(words, lambda ws: ws, lambda ss: [3])


def test_document_frequencies_of_stems_the_vocabulary_lacks_are_zero():
    from indexes.bm25 import doc_freqs_of

    vocab = {"cell": 0, "protein": 1}
    assert doc_freqs_of(vocab, np.array([4, 7]), ["protein", "zzz", "cell"]).tolist() == [7, 0, 4]
    assert doc_freqs_of({}, np.zeros(0, dtype=np.int64), ["zzz"]).tolist() == [0]
