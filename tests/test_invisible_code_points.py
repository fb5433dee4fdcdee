"""Which characters give a query text, by rule: Unicode's Default_Ignorable_Code_Point
property (written out in ``validate``) and the few symbols whose glyph is blank by definition
(the braille pattern blank, the musical null notehead) or that stand for what is not text
(U+FFFC, U+FFFD) give none; no letter, number, punctuation or other symbol of any script is
refused."""

from __future__ import annotations

import sys
import unicodedata

from retrieval import InvalidQueryError, RetrieverConfig
from retrieval.request_path.validate import check_query_text, visible

NOTHING_TO_SEARCH = {
    "\U0001d159": "musical symbol null notehead (So): an invisible notehead",
    "\U0001d159\U0001d159 \U0001d159": "null noteheads and a space",
    "\u115f\u1160": "Hangul choseong and jungseong fillers (Lo, default-ignorable)",
    "\u3164\uffa0": "Hangul filler and its halfwidth form (Lo, default-ignorable)",
    "\u2061\u2062\u2063\u2064": "function application, invisible times, separator, plus (Cf)",
    "".join(map(chr, range(0x1D173, 0x1D17B))): "musical begin/end beam, tie, slur, phrase",
    "\u00ad": "soft hyphen",
    "\u17b4\u17b5": "Khmer inherent vowels (Mn, default-ignorable)",
    "\u180e\u180f": "Mongolian vowel separator and free variation selector four",
    "\u2066\u2069": "bidi isolates",
    "\U000e0001\U000e0067\U000e007f": "language tag, tag letter, cancel tag",
    "\ufffc": "object replacement character: an embedded object, no text",
    "\ufffc\ufffd": "object and undecodable-bytes replacement characters",
}
# Visible characters of many scripts, each alone, and longer texts of them.
SOMETHING_TO_SEARCH = {
    "检": "CJK ideograph", "検索": "Japanese kanji", "ひ": "Hiragana", "ب": "Arabic letter",
    "بحث": "Arabic word", "검색": "Hangul syllables", "ㄱ": "Hangul compatibility jamo",
    "\u1100": "Hangul choseong kiyeok, next to the fillers", "\u1161": "Hangul jungseong a",
    "\u3165": "Hangul letter after the filler", "\uffa1": "halfwidth Hangul kiyeok",
    "ค้นหา": "Thai word", "ก": "Thai letter", "खोज": "Devanagari word",
    "\u093e": "Devanagari vowel sign (Mc)", "ש": "Hebrew letter", "ж": "Cyrillic letter",
    "👩\u200d💻": "emoji ZWJ sequence", "🇫🇷": "flag: regional indicators",
    "🇫": "one regional indicator", "1\ufe0f\u20e3": "keycap sequence",
    "👍🏽": "emoji and skin tone", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f":
    "subdivision flag: a black flag and tags", "∑": "n-ary summation", "∫": "integral",
    "≠": "not equal", "√2": "square root", "𝔸": "double-struck capital A",
    "\U0001d158": "musical closed notehead, next to the null one", "𝄞": "G clef",
    "\u2801": "braille dots-1", "\u2422": "blank symbol: a visible b with a stroke",
    "\u2420": "symbol for space", "\u303f": "ideographic half fill space (So)",
}


def refused(query: str) -> bool:
    try:
        check_query_text(query, RetrieverConfig())
    except InvalidQueryError as exc:
        assert "query is empty" in str(exc)
        return True
    return False


def test_a_query_of_invisible_code_points_is_empty():
    assert [name for query, name in NOTHING_TO_SEARCH.items() if not refused(query)] == []


def test_the_written_out_property_is_unicodes():
    """``default_ignorable`` against the ``regex`` module's Unicode tables."""
    import regex  # transformers needs it: always installed with the project

    from retrieval.request_path.validate import default_ignorable
    pattern = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    every = (chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    assert [hex(ord(c)) for c in every
            if default_ignorable(c) != bool(pattern.match(c))] == []


def test_visible_characters_are_searched_and_only_the_invisible_refused():
    """Samples of many scripts are searched; and of every printable code point that is no
    space nor mark, ``visible`` refuses only the default-ignorable letters, the blank and
    replacement symbols and the skin tones."""
    assert [name for query, name in SOMETHING_TO_SEARCH.items() if refused(query)] == []
    refused_alone = {c for c in map(chr, range(sys.maxunicode + 1))
                     if c.isprintable() and not c.isspace()
                     and unicodedata.category(c) not in ("Mn", "Me") and not visible(c)}
    assert refused_alone == {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\U0001d159",
                             "\ufffc", "\ufffd", *map(chr, range(0x1F3FB, 0x1F400))}
