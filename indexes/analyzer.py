"""Text analyzer: Unicode normalization, case folding, tokenization, stop words, stemming.

The same analyzer must tokenize documents at build time and queries at search time; its
fingerprint is written to the manifest and checked at load.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from functools import cached_property
from typing import Literal

import Stemmer
from pydantic import BaseModel, ConfigDict

# bm25s's English stop word list (33 words); BENCHMARKS.md measured quality with it.
ENGLISH_STOP_WORDS: tuple[str, ...] = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
    "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
    "these", "they", "this", "to", "was", "will", "with",
)

# Tokens of two or more word characters, as scikit-learn and bm25s split text.
TOKEN_PATTERN = r"(?u)\b\w\w+\b"


class AnalyzerConfig(BaseModel):
    """What the analyzer does; stored in the manifest so queries are analyzed the same way."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    normalization: Literal["NFC", "NFD", "NFKC", "NFKD"] = "NFKC"
    lowercase: bool = True
    token_pattern: str = TOKEN_PATTERN
    stop_words: tuple[str, ...] = ENGLISH_STOP_WORDS
    stemmer: str | None = "english"


class Analyzer:
    """Turns text into the list of index terms."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        self._pattern = re.compile(self.config.token_pattern)
        self._stop = frozenset(self.config.stop_words)
        # No stem cache (PyStemmer's default keeps 10,000): the analysis stems each distinct
        # word once, and purging the full cache made stemming 200,000 distinct words 0.30-0.41 s
        # against 0.09 s without it; a query's few words take ~0.4 us each either way.
        self._stemmer = (Stemmer.Stemmer(self.config.stemmer, 0) if self.config.stemmer
                         else None)

    @property
    def stop_words(self) -> frozenset[str]:
        return self._stop

    @cached_property
    def fingerprint(self) -> str:
        """Stable hash of the configuration (and the stemmer library version)."""
        payload = self.config.model_dump(mode="json")
        payload["stemmer_version"] = Stemmer.version() if self._stemmer else None
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __call__(self, text: str) -> list[str]:
        return self.stem(self.words(text))

    def words(self, text: str) -> list[str]:
        """The text's words before stemming: normalized, case-folded, stop words out."""
        text = unicodedata.normalize(self.config.normalization, text)
        if self.config.lowercase:
            text = text.lower()
        return [t for t in self._pattern.findall(text) if t not in self._stop]

    def stem(self, words: list[str]) -> list[str]:
        """The index terms of ``words`` (the words themselves without a stemmer)."""
        return self._stemmer.stemWords(words) if self._stemmer is not None else words
