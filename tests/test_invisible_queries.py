"""Queries with nothing to search for: combining marks, variation selectors and other
characters that print, yet no tokenizer turns into text. Such a query was embedded as an empty
text and every hit scored alike; it is refused like an empty query."""

from __future__ import annotations

import pytest
from small_index import index_fixture, query_encoder_fixture  # noqa: F401 (fixtures)

from retrieval import InvalidQueryError, Retriever, RetrieverConfig
from retrieval.request_path.validate import check_query_text

NOTHING_TO_SEARCH = [
    "\u0301\u0301",  # combining acute accents (Mn), which the BERT tokenizer strips
    "\ufe0f",  # variation selector-16 (Mn)
    "\U000e0100",  # variation selector-17 (Mn)
    "\u0300 \u0301",  # marks between spaces
    "\u20dd",  # combining enclosing circle (Me)
    "\u034f\u200b",  # combining grapheme joiner (Mn) and a zero-width space (Cf)
    "\ufffd\ufffd",  # replacement characters: undecodable input, deleted by the tokenizer
    "\u3164 \u115f",  # Hangul fillers: blank letters
    "\u2800\u2800 \u2800",  # braille pattern blank (So): a cell with no dot, not White_Space
    "\U0001f3fb",  # an emoji modifier alone (Sk, light skin tone)
    "\U0001f3fc\U0001f3ff",  # skin tones: the tokenizer made [UNK] of them, hits all alike
    "\u2800\U0001f3fd\u0301",  # a blank, a skin tone and a mark
]
SOMETHING_TO_SEARCH = [
    "cafe\u0301",  # a mark on a letter
    "\u2764\ufe0f",  # an emoji and its variation selector
    "\u093e",  # a Devanagari vowel sign: a spacing mark (Mc), visible alone
    "\U0001f44d\U0001f3fd",  # an emoji and its skin tone
    "\u2801",  # a braille cell with a dot raised
    "^",  # a modifier symbol (Sk) other than a skin tone
    "7",
]


@pytest.mark.parametrize("query", NOTHING_TO_SEARCH)
def test_a_query_of_marks_or_blank_characters_is_empty(query):
    with pytest.raises(InvalidQueryError, match="query is empty"):
        check_query_text(query, RetrieverConfig())


@pytest.mark.parametrize("query", SOMETHING_TO_SEARCH)
def test_a_query_with_a_visible_character_is_searched(query):
    assert check_query_text(query, RetrieverConfig()) == query


@pytest.fixture(scope="module")
def retriever(index, query_encoder):
    with Retriever.load(index, {"cache": {"backend": "none"}, "live_lag_seconds": None},
                        encoder=query_encoder) as loaded:
        yield loaded


@pytest.mark.parametrize("alone,in_batch,with_text", [
    ("\u0301\u0301", "\ufe0f", "flow\u0301"),
    ("\U0001d159", "\u3164\U0001d159", "flow \U0001d159"),  # a null notehead, a filler
])
def test_the_retriever_refuses_them_alone_and_in_a_batch(retriever, alone, in_batch, with_text):
    with pytest.raises(InvalidQueryError, match="query is empty"):
        retriever.search(alone, k=3)
    with pytest.raises(InvalidQueryError, match="query 1 of the batch: query is empty"):
        retriever.search_batch(["flow", in_batch], k=3)
    assert retriever.search(with_text, k=3).hits
