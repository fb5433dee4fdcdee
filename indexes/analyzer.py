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

# The token rule of builds made before combining marks were kept in words: runs of two or more
# word characters, as scikit-learn and bm25s split text. Python's ``\w`` leaves out combining
# marks (Unicode categories Mn, Mc, Me), so this rule cut "i\u0307stanbul" (İstanbul
# lower-cased) to "stanbul" and Hindi, Thai or Tamil words into one-letter pieces that were
# dropped. Builds that recorded it keep analyzing with it (their manifest holds the pattern).
WORD_CHARACTER_TOKEN_PATTERN = r"(?u)\b\w\w+\b"

# The code points of Unicode 14.0.0 (Python 3.11's unicodedata) in categories Mn, Mc and Me,
# as hexadecimal ranges. Written out rather than derived at import, so the token pattern (and
# with it the analyzer's fingerprint) is the same whatever Unicode version a Python carries.
_MARKS_UNICODE_14 = """
    0300-036F 0483-0489 0591-05BD 05BF 05C1-05C2 05C4-05C5 05C7 0610-061A 064B-065F 0670
    06D6-06DC 06DF-06E4 06E7-06E8 06EA-06ED 0711 0730-074A 07A6-07B0 07EB-07F3 07FD 0816-0819
    081B-0823 0825-0827 0829-082D 0859-085B 0898-089F 08CA-08E1 08E3-0903 093A-093C 093E-094F
    0951-0957 0962-0963 0981-0983 09BC 09BE-09C4 09C7-09C8 09CB-09CD 09D7 09E2-09E3 09FE
    0A01-0A03 0A3C 0A3E-0A42 0A47-0A48 0A4B-0A4D 0A51 0A70-0A71 0A75 0A81-0A83 0ABC 0ABE-0AC5
    0AC7-0AC9 0ACB-0ACD 0AE2-0AE3 0AFA-0AFF 0B01-0B03 0B3C 0B3E-0B44 0B47-0B48 0B4B-0B4D
    0B55-0B57 0B62-0B63 0B82 0BBE-0BC2 0BC6-0BC8 0BCA-0BCD 0BD7 0C00-0C04 0C3C 0C3E-0C44
    0C46-0C48 0C4A-0C4D 0C55-0C56 0C62-0C63 0C81-0C83 0CBC 0CBE-0CC4 0CC6-0CC8 0CCA-0CCD
    0CD5-0CD6 0CE2-0CE3 0D00-0D03 0D3B-0D3C 0D3E-0D44 0D46-0D48 0D4A-0D4D 0D57 0D62-0D63
    0D81-0D83 0DCA 0DCF-0DD4 0DD6 0DD8-0DDF 0DF2-0DF3 0E31 0E34-0E3A 0E47-0E4E 0EB1 0EB4-0EBC
    0EC8-0ECD 0F18-0F19 0F35 0F37 0F39 0F3E-0F3F 0F71-0F84 0F86-0F87 0F8D-0F97 0F99-0FBC 0FC6
    102B-103E 1056-1059 105E-1060 1062-1064 1067-106D 1071-1074 1082-108D 108F 109A-109D
    135D-135F 1712-1715 1732-1734 1752-1753 1772-1773 17B4-17D3 17DD 180B-180D 180F 1885-1886
    18A9 1920-192B 1930-193B 1A17-1A1B 1A55-1A5E 1A60-1A7C 1A7F 1AB0-1ACE 1B00-1B04 1B34-1B44
    1B6B-1B73 1B80-1B82 1BA1-1BAD 1BE6-1BF3 1C24-1C37 1CD0-1CD2 1CD4-1CE8 1CED 1CF4 1CF7-1CF9
    1DC0-1DFF 20D0-20F0 2CEF-2CF1 2D7F 2DE0-2DFF 302A-302F 3099-309A A66F-A672 A674-A67D
    A69E-A69F A6F0-A6F1 A802 A806 A80B A823-A827 A82C A880-A881 A8B4-A8C5 A8E0-A8F1 A8FF
    A926-A92D A947-A953 A980-A983 A9B3-A9C0 A9E5 AA29-AA36 AA43 AA4C-AA4D AA7B-AA7D AAB0
    AAB2-AAB4 AAB7-AAB8 AABE-AABF AAC1 AAEB-AAEF AAF5-AAF6 ABE3-ABEA ABEC-ABED FB1E FE00-FE0F
    FE20-FE2F 101FD 102E0 10376-1037A 10A01-10A03 10A05-10A06 10A0C-10A0F 10A38-10A3A 10A3F
    10AE5-10AE6 10D24-10D27 10EAB-10EAC 10F46-10F50 10F82-10F85 11000-11002 11038-11046 11070
    11073-11074 1107F-11082 110B0-110BA 110C2 11100-11102 11127-11134 11145-11146 11173
    11180-11182 111B3-111C0 111C9-111CC 111CE-111CF 1122C-11237 1123E 112DF-112EA 11300-11303
    1133B-1133C 1133E-11344 11347-11348 1134B-1134D 11357 11362-11363 11366-1136C 11370-11374
    11435-11446 1145E 114B0-114C3 115AF-115B5 115B8-115C0 115DC-115DD 11630-11640 116AB-116B7
    1171D-1172B 1182C-1183A 11930-11935 11937-11938 1193B-1193E 11940 11942-11943 119D1-119D7
    119DA-119E0 119E4 11A01-11A0A 11A33-11A39 11A3B-11A3E 11A47 11A51-11A5B 11A8A-11A99
    11C2F-11C36 11C38-11C3F 11C92-11CA7 11CA9-11CB6 11D31-11D36 11D3A 11D3C-11D3D 11D3F-11D45
    11D47 11D8A-11D8E 11D90-11D91 11D93-11D97 11EF3-11EF6 16AF0-16AF4 16B30-16B36 16F4F
    16F51-16F87 16F8F-16F92 16FE4 16FF0-16FF1 1BC9D-1BC9E 1CF00-1CF2D 1CF30-1CF46 1D165-1D169
    1D16D-1D172 1D17B-1D182 1D185-1D18B 1D1AA-1D1AD 1D242-1D244 1DA00-1DA36 1DA3B-1DA6C 1DA75
    1DA84 1DA9B-1DA9F 1DAA1-1DAAF 1E000-1E006 1E008-1E018 1E01B-1E021 1E023-1E024 1E026-1E02A
    1E130-1E136 1E2AE 1E2EC-1E2EF 1E8D0-1E8D6 1E944-1E94A E0100-E01EF
"""


def _mark_ranges(text: str) -> tuple[tuple[int, int], ...]:
    bounds = (item.partition("-") for item in text.split())
    return tuple((int(first, 16), int(last or first, 16)) for first, _, last in bounds)


# (first, last) code point of each range of combining marks (the compiled analysis's table).
MARK_RANGES: tuple[tuple[int, int], ...] = _mark_ranges(_MARKS_UNICODE_14)


def _escaped(code_point: int) -> str:
    return f"\\u{code_point:04X}" if code_point <= 0xFFFF else f"\\U{code_point:08X}"


_MARK_CLASS = "".join(_escaped(a) if a == b else f"{_escaped(a)}-{_escaped(b)}"
                      for a, b in MARK_RANGES)

# A token starts with a word character and goes on through word characters and combining
# marks, so a mark stays in the word it modifies; two or more code points long. A run of marks
# after a non-word character starts no token (the word after it starts one).
TOKEN_PATTERN = r"(?u)\w[\w" + _MARK_CLASS + r"]+"


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
        # ASCII text holds no combining marks: there TOKEN_PATTERN's tokens are the runs of two
        # or more word characters, which ``re`` finds in about half the time (most queries).
        self._ascii_pattern = (re.compile(WORD_CHARACTER_TOKEN_PATTERN)
                               if self.config.token_pattern == TOKEN_PATTERN else self._pattern)
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
        pattern = self._ascii_pattern if text.isascii() else self._pattern
        return [t for t in pattern.findall(text) if t not in self._stop]

    def stem(self, words: list[str]) -> list[str]:
        """The index terms of ``words`` (the words themselves without a stemmer)."""
        return self._stemmer.stemWords(words) if self._stemmer is not None else words
