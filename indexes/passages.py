"""Passages: long documents split, at build time, into pieces the encoder reads whole.

A sentence-transformers encoder reads at most ``max_seq_length`` tokens (256 for MiniLM) and
silently drops the rest. ``split_text`` cuts a document's text into passages of at most
``max_tokens`` tokens counted with the model's own tokenizer, preferring paragraph breaks,
then sentence ends, and cutting inside a sentence only when one sentence alone is too long.

Offsets: each passage is ``text[start:end]`` of its parent's ``text`` (the body, not the
title). Consecutive passages tile the text: the next one starts where the previous ends, or
earlier when it repeats up to ``overlap_tokens`` of the previous passage's last sentences,
so a range of neighbouring passages is itself one exact slice of the parent.

Title: every passage is indexed and embedded as ``title + " " + passage`` (the title gives a
passage the context its document's first sentences gave it), so the title's tokens are taken
from each passage's budget. Offsets never count the title.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from indexes.errors import CorpusError
from indexes.storage import load_array, save_array

SPECIAL_TOKENS = 2  # [CLS] and [SEP]: part of the window, not of any text
TOKENIZE_BATCH = 2048
# A title may take at most this share of a passage's budget; a longer one is still embedded
# whole, and the window report counts the passages it pushes past the window.
TITLE_SHARE = 4
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?;])[\"')\]]*\s+")


class PassageConfig(BaseModel):
    """How documents are split; lengths in the encoder's tokens (special tokens included)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=32, description="passage length, at most the encoder's "
                            "window (256 for all-MiniLM-L6-v2)")
    overlap_tokens: int = Field(32, ge=0, description="tokens of the previous passage's last "
                                "sentences repeated at the start of the next one, when a "
                                "passage is cut inside a paragraph")
    tokenizer: str | None = Field(None, description="model directory whose tokenizer.json "
                                  "counts tokens when the build is given precomputed vectors "
                                  "(default: the packaged all-MiniLM-L6-v2)")

    @model_validator(mode="after")
    def _overlap_below_half(self) -> PassageConfig:
        if self.overlap_tokens * 2 > self.max_tokens:
            raise ValueError(f"overlap_tokens={self.overlap_tokens} is more than half of "
                             f"max_tokens={self.max_tokens}; lower it")
        return self


@dataclass(frozen=True)
class Span:
    """One passage of a parent text: ``parent_text[start:end]``, ``tokens`` long."""

    start: int
    end: int
    tokens: int


class TokenCounter:
    """The encoder's tokenizer without truncation: counts and token offsets of texts."""

    def __init__(self, model_dir: Path, window: int) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.window = window

    @classmethod
    def for_model(cls, model_dir: Path) -> TokenCounter:
        from indexes.onnx_encoder import max_seq_length

        return cls(model_dir, max_seq_length(Path(model_dir)))

    def _encodings(self, texts: list[str]) -> Iterator[Any]:
        # In batches: a tokenizer Encoding holds several Python objects per token.
        for at in range(0, len(texts), TOKENIZE_BATCH):
            yield from self._tokenizer.encode_batch(texts[at:at + TOKENIZE_BATCH],
                                                    add_special_tokens=False)

    def starts(self, texts: list[str]) -> list[np.ndarray]:
        """Character offset where each token of each text starts (special tokens excluded)."""
        return [np.fromiter((o[0] for o in e.offsets), dtype=np.int64, count=len(e.offsets))
                for e in self._encodings(texts)]

    def count(self, texts: list[str]) -> np.ndarray:
        """Tokens the encoder would read of each whole text, special tokens included."""
        return np.array([len(e.ids) + SPECIAL_TOKENS for e in self._encodings(texts)],
                        dtype=np.int64)


def _units(text: str, token_starts: np.ndarray, budget: int) -> list[tuple[int, int, bool]]:
    """(start, end, ends_paragraph) of sentences; sentences over ``budget`` tokens are cut
    at token starts. Units tile ``text``: each one runs to where the next begins."""
    cuts: list[tuple[int, bool]] = []
    for match in _PARAGRAPH.finditer(text):
        cuts.append((match.end(), True))
    for match in _SENTENCE_END.finditer(text):
        cuts.append((match.end(), False))
    ends = sorted({c for c in cuts if 0 < c[0] < len(text)}, key=lambda c: (c[0], not c[1]))
    units: list[tuple[int, int, bool]] = []
    start = 0
    for end, paragraph in [*ends, (len(text), True)]:
        if end <= start:
            continue
        first, last = np.searchsorted(token_starts, [start, end])
        while last - first > budget:  # one sentence longer than a passage: cut between tokens
            taken = _word_cut(text, token_starts, first, budget)
            cut = int(token_starts[first + taken])
            if cut <= start:  # tokens sharing a start offset: no place to cut here
                break
            units.append((start, cut, False))
            start, first = cut, first + taken
        units.append((start, end, paragraph))
        start = end
    return units


def _word_cut(text: str, token_starts: np.ndarray, first: int, budget: int) -> int:
    """Tokens to take from ``first`` for a cut inside a sentence: the most, at most
    ``budget``, that end before a space, so a word is not split between two passages (a word
    piece alone means little to BM25 or the encoder); ``budget`` when the last half of the
    budget has no space (one very long "word", e.g. a sequence or a URL)."""
    for taken in range(budget, budget // 2, -1):
        cut = int(token_starts[first + taken])
        if cut > 0 and text[cut - 1].isspace():
            return taken
    return budget


def split_text(text: str, token_starts: np.ndarray, budget: int, overlap: int) -> list[Span]:
    """Passages of ``text`` of at most ``budget`` text tokens each (see module docstring).

    ``token_starts``: sorted int64 character offsets of the text's tokens.
    """
    if not text:
        return [Span(0, 0, 0)]
    units = _units(text, token_starts, budget)
    counts = np.diff(np.searchsorted(token_starts, [u[0] for u in units] + [len(text)]))
    spans: list[Span] = []
    current: list[int] = []  # unit indices of the passage being filled
    for i in range(len(units)):
        size = int(sum(counts[j] for j in current))
        after_paragraph = bool(current) and units[current[-1]][2]
        if current and (size + counts[i] > budget or (after_paragraph and size * 2 >= budget)):
            spans.append(_span(units, counts, current))
            current = [] if after_paragraph else _overlap_tail(current, counts, overlap)
            # the repeated tail and this unit must still fit
            while current and sum(counts[j] for j in current) + counts[i] > budget:
                current.pop(0)
        current.append(i)
    spans.append(_span(units, counts, current))
    return spans


def _overlap_tail(units: list[int], counts: np.ndarray, overlap: int) -> list[int]:
    """The last whole units of a passage holding at most ``overlap`` tokens."""
    tail: list[int] = []
    total = 0
    for j in reversed(units):
        total += int(counts[j])
        if total > overlap:
            break
        tail.insert(0, j)
    return tail


def _span(units: list[tuple[int, int, bool]], counts: np.ndarray, chosen: list[int]) -> Span:
    return Span(units[chosen[0]][0], units[chosen[-1]][1], int(sum(counts[j] for j in chosen)))


def passage_budget(config: PassageConfig, title_tokens: int) -> int:
    """Text tokens left for a passage after the special tokens and (part of) the title."""
    return config.max_tokens - SPECIAL_TOKENS - min(title_tokens, config.max_tokens // TITLE_SHARE)


def check_config(config: PassageConfig, window: int) -> None:
    if config.max_tokens > window:
        raise CorpusError(f"passages of max_tokens={config.max_tokens} would be truncated: the "
                          f"encoder reads {window} tokens; set max_tokens <= {window}")


# -- the passages/ component of a build ------------------------------------------------------

PASSAGE_ARRAYS = ("parent", "position", "start", "end")


@dataclass(frozen=True)
class PassageMap:
    """Row -> parent document ordinal, position in it, and char offsets into its text.

    Arrays of shape (n_rows,): ``parent`` int32 (passages of one document are consecutive
    rows, positions 0, 1, ...), ``position`` int32, ``start``/``end`` int64.
    """

    parent: np.ndarray
    position: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @property
    def n_rows(self) -> int:
        return int(self.parent.shape[0])

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in PASSAGE_ARRAYS:
            save_array(directory / f"{name}.npy", getattr(self, name))

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> PassageMap:
        return cls(*(load_array(directory / f"{name}.npy", mmap) for name in PASSAGE_ARRAYS))

    def rows_of_documents(self, doc_bounds: list[int]) -> list[int]:
        """The first row of each document ordinal in ``doc_bounds`` (ascending; the number of
        documents maps to ``n_rows``): row ranges holding whole documents."""
        return np.searchsorted(np.asarray(self.parent), doc_bounds).astype(int).tolist()

    def sliced(self, start: int, stop: int) -> PassageMap:
        """Rows [start, stop) (whole documents) as a map of their own, parents from 0."""
        parent = np.asarray(self.parent[start:stop])
        first = int(parent[0]) if parent.size else 0
        return PassageMap((parent - first).astype(np.int32), np.asarray(self.position[start:stop]),
                          np.asarray(self.start[start:stop]), np.asarray(self.end[start:stop]))

    @classmethod
    def joined(cls, parts: list[PassageMap]) -> PassageMap:
        """Consecutive maps as one: each part's parents offset by the documents before it."""
        parents, documents = [], 0
        for part in parts:
            parents.append(np.asarray(part.parent, dtype=np.int32) + documents)
            documents += int(part.parent[-1]) + 1 if part.n_rows else 0
        return cls(np.concatenate(parents),
                   *(np.concatenate([np.asarray(getattr(part, name)) for part in parts])
                     for name in ("position", "start", "end")))

    def info_like(self, info: PassageInfo) -> PassageInfo:
        """``info`` (a whole build's figures) restated for this map's rows."""
        counts = np.bincount(np.asarray(self.parent)) if self.n_rows else np.zeros(1, int)
        return info.model_copy(update={"n_documents": int(np.count_nonzero(counts)),
                                       "n_passages": self.n_rows,
                                       "max_per_document": int(counts.max())})

    def neighbours(self, row: int, context: int) -> tuple[int, int]:
        """First and last row of the passages within ``context`` positions of ``row`` in the
        same document (rows of one document are consecutive)."""
        n = self.n_rows
        parent = self.parent[row]
        first, last = row, row
        while first > 0 and row - first < context and self.parent[first - 1] == parent:
            first -= 1
        while last < n - 1 and last - row < context and self.parent[last + 1] == parent:
            last += 1
        return first, last


class PassageInfo(BaseModel):
    """What the manifest records about a passage build."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int
    overlap_tokens: int
    n_documents: int
    n_passages: int
    max_per_document: int
    title: str = "prepended to every passage for BM25 and the vector; not in the offsets"
    tokenizer: str | None = Field(None, description="the model directory whose tokenizer cut "
                                  "the passages, when the build was given vectors and "
                                  "``PassageConfig.tokenizer`` (None: the encoder's, else the "
                                  "packaged model's); live writes and compaction cut with it")


def describe(info: Any) -> str:
    return (f"{info.n_passages} passages from {info.n_documents} documents "
            f"(at most {info.max_per_document} per document)")
