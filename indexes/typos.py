"""Typo tolerance for the keyword leg: a deletion dictionary of the corpus's words (SymSpell).

A query word whose stem no document holds is matched to a corpus word within a small edit
distance, by the word's length as Meilisearch does (``max_edits``: 1 edit from 5 letters, 2
from 9, none past ``MAX_LETTERS``), and searched as that word's stem, weighted below exact
terms. Words are matched before stemming: a typo often breaks the suffix the stemmer would
strip ("transcritpion"), so stems of misspelt words are far from the right stem while the
words are one swap apart.

The dictionary maps a 64-bit hash of every string made by deleting up to ``max_edits``
letters of a corpus word to that word (FNV-1a over its code points, computed by
``indexes.typos_kernels``; builds made before it hashed with blake2b, ``key``, and are read
with it); a query word's own deletions find every corpus word
within that many edits (insertions, deletions, substitutions, adjacent swaps), each then
checked by its optimal-string-alignment distance. Only alphabetic words of at least
``MIN_LETTERS`` whose stem two or more rows hold are corrected to (checked again against the
serving build's counts, live writes included): a word once in the corpus is as likely a typo
as the query's. A live view adds the words of its live documents (``LiveTypos``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property, lru_cache
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from rapidfuzz.distance import OSA

from indexes.storage import load_array, read_json, save_array, write_json
from indexes.typos_kernels import word_keys

MIN_LETTERS = 5
TWO_EDITS_FROM = 9
# Longer words are neither corrected nor corrected to. A word's deletions grow with its
# length squared, and building each with its length: a query word of 4,096 letters took
# about a minute of CPU, 256 letters 44 ms, 32 letters 0.5 ms (the few longer real words
# are seldom the typo).
MAX_LETTERS = 32
MIN_ROWS = 2  # a stem fewer rows hold is not a correction target
MEMO_WORDS = 65_536
KEY_SCHEME = "fnv1a64-code-points"  # words.json "keys"; absent in builds hashed with ``key``


def max_edits(word: str) -> int:
    """Edits allowed for a word of this length: 0 under 5 letters, 1 from 5, 2 from 9, 0
    past ``MAX_LETTERS``."""
    if len(word) < MIN_LETTERS or len(word) > MAX_LETTERS:
        return 0
    return 1 if len(word) < TWO_EDITS_FROM else 2


def deletions(word: str, edits: int) -> set[str]:
    """``word`` and every string made by deleting up to ``edits`` of its letters."""
    out = {word}
    for n in range(1, edits + 1):
        for cut in combinations(range(len(word)), n):
            drop = set(cut)
            out.add("".join(c for i, c in enumerate(word) if i not in drop))
    return out


def key(text: str) -> int:
    """The 64-bit hash of builds made before ``KEY_SCHEME`` (Python's own is salted per
    process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def osa_distance(a: str, b: str, limit: int) -> int:
    """Optimal string alignment distance (an adjacent swap is one edit), ``limit + 1`` once
    it exceeds ``limit``: rapidfuzz's C++ kernel, ~50x a Python loop (the pure-Python one
    took three quarters of a cold lookup)."""
    return int(OSA.distance(a, b, score_cutoff=limit))


class TypoIndex:
    """Corpus words, the stem each is searched as, and the deletion dictionary over them."""

    def __init__(self, words: list[str], stems: list[str], rows: list[int], keys: np.ndarray,
                 word_ids: np.ndarray, key_scheme: str | None = KEY_SCHEME) -> None:
        self.key_scheme = key_scheme  # None: a build hashed with ``key``
        self.words = words
        self.stems = stems
        self.rows = rows  # rows holding each word's stem: ties go to the commoner stem
        self.keys = np.asarray(keys)  # uint64, sorted
        self.word_ids = np.asarray(word_ids)  # int32, aligned with keys
        self._memo = lru_cache(maxsize=MEMO_WORDS)(self._lookup)

    def __reduce__(self) -> tuple[type[TypoIndex], tuple[Any, ...]]:
        """Pickled without its memo (a streamed build sends the dictionary to its tasks)."""
        return TypoIndex, (self.words, self.stems, self.rows, self.keys, self.word_ids,
                           self.key_scheme)

    @classmethod
    def build(cls, words: Iterable[str], stem: Callable[[list[str]], list[str]],
              rows_of_stems: Callable[[list[str]], np.ndarray]) -> TypoIndex:
        """Over ``words`` (the corpus's distinct words, before stemming); ``rows_of_stems``:
        how many rows hold each of a list of stems (the BM25 document frequencies, in one
        call: a Python call per word was a third of this at 111k passages)."""
        candidates = sorted(w for w in words
                            if MIN_LETTERS <= len(w) <= MAX_LETTERS and w.isalpha())
        stems = stem(candidates)
        rows = np.asarray(rows_of_stems(stems), dtype=np.int64)
        if not len(stems) == len(rows) == len(candidates):
            raise ValueError(f"{len(candidates)} words gave {len(stems)} stems and "
                             f"{len(rows)} row counts: give one of each per word")
        kept = np.flatnonzero(rows >= MIN_ROWS).tolist()
        words = [candidates[i] for i in kept]
        keys, ids = word_keys(words, [max_edits(w) for w in words])
        order = np.argsort(keys, kind="stable")
        return cls(words, [stems[i] for i in kept], rows[kept].tolist(), keys[order],
                   ids[order])

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / "words.json", {"words": self.words, "stems": self.stems,
                                              "rows": self.rows, "keys": self.key_scheme})
        save_array(directory / "keys.npy", self.keys)
        save_array(directory / "word_ids.npy", self.word_ids)

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> TypoIndex | None:
        """The saved index, or None for a build made before typo tolerance."""
        if not (directory / "keys.npy").is_file():
            return None
        vocab = read_json(directory / "words.json")
        return cls(vocab["words"], vocab["stems"], vocab["rows"],
                   load_array(directory / "keys.npy", mmap),
                   load_array(directory / "word_ids.npy", mmap), vocab.get("keys"))

    def rows_of(self, stem: str) -> int:
        """Rows holding ``stem`` when the build was made (0 for a stem not entered)."""
        return self._rows_by_stem.get(stem, 0)

    @cached_property
    def _rows_by_stem(self) -> dict[str, int]:
        return dict(zip(self.stems, self.rows, strict=True))

    def forget(self) -> None:
        """Drop the remembered lookups (each query word is looked up once, then remembered)."""
        self._memo.cache_clear()

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.word_ids.nbytes)

    def closest(self, word: str, rows_of_stem: Callable[[str], int]) -> str | None:
        """The stem of the corpus word nearest ``word``: see ``nearest``."""
        return nearest((self,), word, rows_of_stem)

    def candidates(self, word: str) -> tuple[tuple[int, str], ...]:
        """(distance, stem) of every entered word within ``max_edits`` of ``word``."""
        return self._memo(word)

    @cached_property
    def word_set(self) -> frozenset[str]:
        return frozenset(self.words)

    def _lookup(self, word: str) -> tuple[tuple[int, str], ...]:
        edits = max_edits(word)
        if edits == 0 or not self.keys.size:
            return ()
        if self.key_scheme == KEY_SCHEME:
            probes = word_keys([word], [edits])[0]
        else:
            probes = np.array([key(v) for v in deletions(word, edits)], dtype=np.uint64)
        starts = np.searchsorted(self.keys, probes, side="left")
        ends = np.searchsorted(self.keys, probes, side="right")
        ids = {int(i) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
               for i in self.word_ids[s:e]}
        found = []
        for i in ids:
            distance = osa_distance(word, self.words[i], edits)
            if distance <= edits:
                found.append((distance, self.stems[i]))
        return tuple(found)


def nearest(parts: Sequence[TypoIndex], word: str, rows_of_stem: Callable[[str], int]
            ) -> str | None:
    """The stem of the word nearest ``word`` in any of ``parts`` whose stem ``MIN_ROWS`` rows
    hold now (``rows_of_stem``: the serving build's document frequency, live writes
    included); ties go to the stem more rows hold, then the first in order. None if none."""
    found = {hit for part in parts for hit in part.candidates(word)}
    scored = [(distance, -rows, stem) for distance, stem in found
              if (rows := rows_of_stem(stem)) >= MIN_ROWS]
    return min(scored)[2] if scored else None


class LiveTypos:
    """A live view's dictionary: the base build's, plus the words only its live documents
    hold (usually few: it is built at each compose over those alone)."""

    def __init__(self, base: TypoIndex, live_words: Iterable[str],
                 stem: Callable[[list[str]], list[str]]) -> None:
        self.base = base
        new = [w for w in set(live_words) if w not in base.word_set]
        # Each stem counted as enough rows: rows are checked when a correction is used.
        self.delta = TypoIndex.build(new, stem, lambda stems: np.full(len(stems), MIN_ROWS))

    def closest(self, word: str, rows_of_stem: Callable[[str], int]) -> str | None:
        return nearest((self.base, self.delta), word, rows_of_stem)

    def rows_of(self, stem: str) -> int:
        return self.base.rows_of(stem)

    def forget(self) -> None:
        self.base.forget()
        self.delta.forget()
