"""The build's analysis and postings stages at compiled speed, over parts of the corpus in
parallel, reduced once into the collection's term-frequency postings.

The terms are ``Analyzer``'s, document for document (tests/test_analysis.py compares them):
Python normalizes and case-folds each text (C calls; normalization is skipped for ASCII
text, which every Unicode form leaves unchanged), ``indexes.analysis_kernels`` splits the
words with the Unicode word-character table of Python's ``re`` (``str.isalnum()`` or ``_``)
and, for ``TOKEN_PATTERN``, the combining marks of ``MARK_RANGES`` a word goes on through
(``WORD_CHARACTER_TOKEN_PATTERN``, older builds' rule, has none), and stop words and stemming
apply once per distinct word, not once per token. An analyzer with another ``token_pattern``
splits its words with ``re`` in Python; the rest is the same.

Parts are contiguous ranges of rows, each analyzed on its own (threads here: the kernels
release the GIL; Ray tasks in ``indexes.ray_build``) into postings numbered by its own terms
in first-occurrence order. ``merge_parts`` numbers the collection's terms the same way (part
by part, each part's new terms in its order), so any number of parts gives the arrays one
part gives, byte for byte.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from indexes.analysis_kernels import GROW_ARENA, count_terms, rehash, split_words
from indexes.analyzer import (
    MARK_RANGES,
    TOKEN_PATTERN,
    WORD_CHARACTER_TOKEN_PATTERN,
    Analyzer,
    AnalyzerConfig,
)

BATCH = 4096  # documents encoded and split per kernel call


@cache
def word_characters() -> np.ndarray:
    """bool (0x110000,): the code points ``re``'s ``\\w`` matches in a str pattern."""
    return np.fromiter((chr(c).isalnum() or c == 0x5F for c in range(0x110000)),
                       dtype=np.bool_, count=0x110000)


@cache
def word_or_mark_characters() -> np.ndarray:
    """bool (0x110000,): the code points ``TOKEN_PATTERN``'s class ``[\\w<marks>]`` matches:
    the word characters and ``MARK_RANGES``."""
    table = word_characters().copy()
    for first, last in MARK_RANGES:
        table[first:last + 1] = True
    return table


def continuation_table(token_pattern: str) -> np.ndarray | None:
    """The code points a token goes on through under ``token_pattern``, for the patterns the
    compiled split knows (a token starts at a word character under both); None for another
    pattern, which ``re`` splits."""
    if token_pattern == TOKEN_PATTERN:
        return word_or_mark_characters()
    if token_pattern == WORD_CHARACTER_TOKEN_PATTERN:
        return word_characters()
    return None


@dataclass
class PartPostings:
    """One part's postings: ``terms`` in first-occurrence order (local ids), postings
    (term, row within the part, tf) row by row in pieces (a batch's each), row lengths, and
    the part's words before stemming with their terms (stop words out: the typo
    dictionary's)."""

    terms: list[str]
    words: dict[str, str]
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    lengths: np.ndarray


@dataclass
class _Vocabulary:
    """A part's words and terms as they are met: word id -> term id (-1: a stop word)."""

    analyzer: Analyzer
    word_term: list[int] = field(default_factory=list)
    term_ids: dict[str, int] = field(default_factory=dict)
    words: dict[str, str] = field(default_factory=dict)  # word -> its term, stop words out
    _array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))

    def word_term_array(self) -> np.ndarray:
        """``word_term`` as int32, extended by the words added since the last call."""
        if self._array.shape[0] < len(self.word_term):
            added = np.asarray(self.word_term[self._array.shape[0]:], dtype=np.int32)
            self._array = np.concatenate([self._array, added])
        return self._array

    def add(self, new_words: list[str]) -> None:
        stop = self.analyzer.stop_words
        kept = [w for w in new_words if w not in stop]
        stems = self.analyzer.stem(kept)
        term_ids = self.term_ids
        next_stem = iter(stems)
        for word in new_words:
            if word in stop:
                self.word_term.append(-1)
            else:
                self.word_term.append(term_ids.setdefault(next(next_stem), len(term_ids)))
        self.words.update(zip(kept, stems, strict=True))


class _WordTable:
    """The growable arrays ``split_words`` keeps its words in."""

    def __init__(self) -> None:
        self.slots = np.zeros((1 << 16, 2), dtype=np.int64)  # a word's bytes, tag | id + 1
        self.records = np.empty((1 << 15, 3), dtype=np.int64)  # hash, arena start, length
        self.arena = np.empty(1 << 20, dtype=np.uint8)
        self.state = np.zeros(4, dtype=np.int64)  # words, arena used, tokens, documents done

    def grow(self, code: int, need_words: int, need_bytes: int) -> None:
        if code == GROW_ARENA:
            self.arena = _grown(self.arena, need_bytes)
            return
        self.records = _grown(self.records, need_words)
        size = self.slots.shape[0]
        while size < 2 * need_words:
            size *= 2
        self.slots = rehash(self.records, self.arena, int(self.state[0]), size)

    def words(self, first: int, stop: int) -> list[str]:
        """Words ``first..stop-1`` (added in order, so their bytes are contiguous)."""
        if first == stop:
            return []
        starts, lengths = self.records[first:stop, 1], self.records[first:stop, 2]
        base = int(starts[0])
        blob = self.arena[base:int(starts[-1] + lengths[-1])].tobytes()
        bounds, ends = (starts - base).tolist(), (starts - base + lengths).tolist()
        if blob.isascii():  # one decode, then str slices
            text = blob.decode("ascii")
            return [text[a:b] for a, b in zip(bounds, ends, strict=True)]
        return [blob[a:b].decode("utf-8", "surrogatepass")
                for a, b in zip(bounds, ends, strict=True)]


def _grown(array: np.ndarray, at_least: int) -> np.ndarray:
    size = array.shape[0]
    while size < at_least:
        size *= 2
    out = np.empty((size, *array.shape[1:]), dtype=array.dtype)
    out[:array.shape[0]] = array
    return out


def _encoded(texts: Sequence[str], config: AnalyzerConfig) -> tuple[np.ndarray, np.ndarray]:
    """The texts normalized and case-folded as ``Analyzer.words`` does, as one UTF-8 buffer
    and each text's end offset."""
    form, lower = config.normalization, config.lowercase
    parts = []
    for text in texts:
        if not text.isascii():
            text = unicodedata.normalize(form, text)
        if lower:
            text = text.lower()
        parts.append(text.encode("utf-8", "surrogatepass"))
    ends = np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
    return np.frombuffer(b"".join(parts), dtype=np.uint8), ends


def _split_compiled(texts: Sequence[str], analyzer: Analyzer, table: _WordTable
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Word ids of the texts' tokens (int32) and each text's end among them (int64)."""
    buf, ends = _encoded(texts, analyzer.config)
    # A token takes 2 bytes and a separator, but the documents are joined with none between
    # them: a document of b bytes holds at most b // 3 + 1 tokens ("ab" is 2 bytes, 1 token).
    out = np.empty(buf.shape[0] // 3 + len(texts) + 1, dtype=np.int32)
    token_ends = np.empty(len(texts), dtype=np.int64)
    table.state[2:] = 0
    is_word, goes_on = word_characters(), continuation_table(analyzer.config.token_pattern)
    if goes_on is None:
        raise ValueError(f"the compiled split has no table for the token pattern "
                         f"{analyzer.config.token_pattern!r}: split it with _split_python")
    while True:
        code = split_words(buf, ends, int(table.state[3]), is_word, goes_on, table.slots,
                           table.records, table.arena, table.state, out, token_ends)
        if code == 0:
            return out[:table.state[2]], token_ends
        d = int(table.state[3])
        doc_bytes = int(ends[d] - (ends[d - 1] if d else 0))
        table.grow(code, int(table.state[0]) + doc_bytes // 3 + 1,
                   int(table.state[1]) + doc_bytes)


def _split_python(texts: Sequence[str], analyzer: Analyzer, word_ids: dict[str, int],
                  new_words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``_split_compiled`` for another token pattern: ``re`` splits, a dict numbers (words
    met for the first time are appended to ``new_words``)."""
    ids: list[int] = []
    token_ends = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        for word in analyzer.words(text):
            w = word_ids.get(word)
            if w is None:
                w = word_ids[word] = len(word_ids)
                new_words.append(word)
            ids.append(w)
        token_ends[i] = len(ids)
    return np.asarray(ids, dtype=np.int32), token_ends


def analyze_part(texts: Sequence[str], config: AnalyzerConfig) -> PartPostings:
    """Analyze one part's texts into postings numbered by the part's own terms."""
    analyzer = Analyzer(config)  # its own stemmer: parts run in threads
    vocabulary = _Vocabulary(analyzer)
    compiled = continuation_table(config.token_pattern) is not None
    table, word_ids = _WordTable(), dict[str, int]()
    pieces, row_lengths = [], []
    for start in range(0, len(texts), BATCH):
        batch = texts[start:start + BATCH]
        if compiled:
            words, token_ends = _split_compiled(batch, analyzer, table)
            new = table.words(len(vocabulary.word_term), int(table.state[0]))
        else:
            new = []
            words, token_ends = _split_python(batch, analyzer, word_ids, new)
        vocabulary.add(new)
        terms, rows, tfs, lengths = count_terms(words, token_ends, vocabulary.word_term_array(),
                                                len(vocabulary.term_ids), start)
        pieces.append((terms, rows, tfs))
        row_lengths.append(lengths)
    return PartPostings(list(vocabulary.term_ids), vocabulary.words, pieces,
                        np.concatenate(row_lengths) if row_lengths else np.empty(0, np.int32))


@dataclass
class CollectionPostings:
    """The collection's postings (row by row), terms numbered in first-occurrence order."""

    terms: list[str]
    words: dict[str, str]  # the corpus's words before stemming -> their terms
    post_terms: np.ndarray
    post_rows: np.ndarray
    post_tfs: np.ndarray
    lengths: np.ndarray


def merge_parts(parts: Sequence[PartPostings]) -> CollectionPostings:
    """Renumber each part's terms into the collection's and stack the parts' rows in order,
    into arrays allocated once."""
    ids: dict[str, int] = {}
    words: dict[str, str] = {}
    total = sum(t.shape[0] for part in parts for t, _, _ in part.pieces)
    terms, rows, tfs = (np.empty(total, dtype=np.int32) for _ in range(3))
    at, offset = 0, 0
    for part in parts:
        local = np.fromiter((ids.setdefault(t, len(ids)) for t in part.terms), dtype=np.int32,
                            count=len(part.terms))
        for piece_terms, piece_rows, piece_tfs in part.pieces:
            end = at + piece_terms.shape[0]
            np.take(local, piece_terms, out=terms[at:end])
            np.add(piece_rows, np.int32(offset), out=rows[at:end])
            tfs[at:end] = piece_tfs
            at = end
        offset += part.lengths.shape[0]
        words.update(part.words)
    lengths = (np.concatenate([part.lengths for part in parts]) if parts
               else np.empty(0, dtype=np.int32))
    return CollectionPostings(list(ids), words, terms, rows, tfs, lengths)


def default_workers() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def part_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering 0..n (fewer when n is smaller)."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def analyze(texts: Sequence[str], config: AnalyzerConfig, workers: int | None = None
            ) -> CollectionPostings:
    """The collection's postings, its parts analyzed by ``workers`` threads (default: one
    per core)."""
    ranges = part_ranges(len(texts), workers or default_workers())
    if len(ranges) == 1:
        return merge_parts([analyze_part(texts, config)])
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="analyze") as pool:
        parts = list(pool.map(lambda r: analyze_part(texts[r[0]:r[1]], config), ranges))
    return merge_parts(parts)
