"""The filter DSL: a lazy tokenizer and a recursive-descent parser (precedence NOT > AND > OR)::

    year >= 2010 AND (dept = "cardiology" OR dept = 'oncology') AND NOT retracted = true
    tags CONTAINS "x" AND tags ALL ("a", "b") AND tags ANY ("c", "d") AND NOT reviewer EXISTS
"""

from __future__ import annotations

import re
from typing import NamedTuple

from retrieval.errors import MalformedFilterError
from retrieval.filters.nodes import DSL_OPS, Filter, conj, disj, neg, show
from retrieval.filters.validate import Context

_SPACE = re.compile(r"\s*")
_TOKEN = re.compile(
    r"""(?P<number>-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)
    |(?P<op><=|>=|!=|=|<|>)
    |(?P<punct>[(),])
    |(?P<string>"[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')
    |(?P<quoted>`[^`\\]*(?:\\.[^`\\]*)*`)
    |(?P<word>[^\W\d][\w.\-]*)""",
    re.VERBOSE | re.DOTALL,
)
# Operators of other languages, recognised only to say what to write instead.
_FOREIGN = {"==": "=", "&&": "AND", "||": "OR"}
WORD_OPS = {"contains", "any", "all", "exists"}
_WORDS = {"and": "and", "or": "or", "not": "not", "in": "in", "true": "bool", "false": "bool"}
_ESCAPE = re.compile(  # a \u high+low surrogate pair first: together they are one character
    r"\\(u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)", re.DOTALL
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\",
            '"': '"', "'": "'", "`": "`"}


class _Token(NamedTuple):
    kind: str  # number, op, string, field, bool, and, or, not, in, end, or the punctuation
    text: str
    value: object
    pos: int


MAX_DIGITS = 4300  # int()'s default limit on the digits of a string it converts


def _number(text: str, start: int) -> float | int:
    """A float, except an integer literal no float holds exactly: kept whole, so the field's
    check can refuse it instead of matching its rounded neighbours (or infinity)."""
    value = float(text)
    if value == 0.0 and any(c in "123456789" for c in text.lower().partition("e")[0]):
        raise MalformedFilterError(f"filter syntax error at position {start}: {text[:40]!r} "
                                   "is too small for a float, which holds it as 0; no field "
                                   "holds it")
    if not text.lstrip("-").isdigit():
        return value
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:  # past what int() reads from text
        raise MalformedFilterError(f"filter syntax error at position {start}: a number of "
                                   f"{digits} digits; no field holds one that long")
    whole = int(text)
    return whole if value != whole else value  # exact: Python compares float and int exactly


def _unescape(body: str, start: int) -> str:
    """JSON escapes (a JSON string literal is a valid DSL string) plus \\' and \\`."""

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code in _ESCAPES:
            return _ESCAPES[code]
        if len(code) == 1:  # unknown, or a \u without its four hex digits
            raise MalformedFilterError(f"filter syntax error at position {start + match.start()}:"
                                       f" bad escape {show(chr(92) + code)}; write a backslash "
                                       "as two backslashes, \\u with four hex digits")
        if len(code) > 5:
            return chr(0x10000 + ((int(code[1:5], 16) - 0xD800) << 10) + int(code[7:], 16) - 0xDC00)
        return chr(int(code[1:], 16))

    return _ESCAPE.sub(replace, body)


class DslParser:
    def __init__(self, text: str, ctx: Context) -> None:
        self.text, self.ctx, self.pos = text, ctx, 0
        self.tok = self._scan()  # one token of lookahead: limits stop huge input early

    def _scan(self) -> _Token:
        space = _SPACE.match(self.text, self.pos)  # \s* always matches; the check is for mypy
        start = space.end() if space else self.pos
        if start == len(self.text):
            return _Token("end", "", None, start)
        foreign = self.text[start:start + 2]
        if foreign in _FOREIGN:
            raise MalformedFilterError(
                f"filter syntax error at position {start}: {foreign!r} is not part of the filter "
                f"language; use {_FOREIGN[foreign]!r}{self._near(start)}")
        match = _TOKEN.match(self.text, start)
        if match is None:
            char = self.text[start]
            what = "unterminated string" if char in "\"'`" else f"unexpected character {char!r}"
            raise MalformedFilterError(f"filter syntax error at position {start}: {what}"
                                       f"{self._near(start)}")
        self.pos, text, group = match.end(), match.group(), match.lastgroup
        if group == "number":
            return _Token("number", text, _number(text, start), start)
        if group in ("string", "quoted"):
            body = _unescape(text[1:-1], start + 1)
            return _Token("string" if group == "string" else "field", text, body, start)
        if group == "word":
            kind = _WORDS.get(text.lower(), "field")
            return _Token(kind, text, text.lower() == "true" if kind == "bool" else text, start)
        return _Token(text if group == "punct" else "op", text, text, start)

    def _near(self, pos: int) -> str:
        return f" (near {show(self.text[max(0, pos - 15) : pos + 15])})"

    def _error(self, expected: str, hint: str = "") -> MalformedFilterError:
        got = "end of filter" if self.tok.kind == "end" else show(self.tok.text)
        return MalformedFilterError(f"filter syntax error at position {self.tok.pos}: expected "
                                    f"{expected}, got {got}{self._near(self.tok.pos)}{hint}")

    def _take(self, kind: str, expected: str) -> _Token:
        if self.tok.kind != kind:
            raise self._error(expected)
        token, self.tok = self.tok, self._scan()
        return token

    def parse(self) -> Filter:
        result = self._or(0)
        self._take("end", "AND, OR or the end of the filter")
        return result

    def _or(self, depth: int) -> Filter:
        """OR of ANDs of NOT-terms: the precedence NOT > AND > OR."""
        terms = [[self._not(depth)]]
        while self.tok.kind in ("and", "or"):
            if self._take(self.tok.kind, "AND or OR").kind == "or":
                terms.append([])
            terms[-1].append(self._not(depth))
        return disj(conj(term) for term in terms)

    def _not(self, depth: int) -> Filter:
        negations = 0  # a loop, not recursion: a long NOT chain cannot exhaust the stack
        while self.tok.kind == "not":
            negations += 1
            self.ctx.nest(depth + negations)
            self._take("not", "NOT")
        result = self._primary(depth + negations)
        return neg(result) if negations % 2 else result

    def _primary(self, depth: int) -> Filter:
        if self.tok.kind == "(":
            opened = self._take("(", "'('")
            self.ctx.nest(depth + 1)
            inner = self._or(depth + 1)
            self._take(")", f"')' to close the '(' at position {opened.pos}")
            return inner
        field = str(self._take("field", "a field name, NOT or '('").value)
        self.ctx.kind(field)
        word = self.tok.text.lower() if self.tok.kind in ("field", "in") else ""
        if word in WORD_OPS:  # not reserved words: a field may still be called "all"
            self._take(self.tok.kind, word)
            if word == "exists":
                return self.ctx.exists(field, True)
            if word == "contains":
                return self.ctx.contains(field, self._value())
            values = self._list(field)
            return (self.ctx.all_of(field, values) if word == "all"
                    else self.ctx.member(field, values, negate=False))
        if self.tok.kind == "op":
            op = DSL_OPS[self._take("op", "an operator").text]
            return self.ctx.compare(field, op, self._value())
        negate = self.tok.kind == "not"
        if negate:
            self._take("not", "NOT")
        self._take("in", "IN after NOT" if negate else
                   f"an operator (=, !=, <, <=, >, >=, IN, NOT IN, CONTAINS, ANY, ALL, "
                   f"EXISTS) after field {field!r}")
        return self.ctx.member(field, self._list(field), negate)

    def _value(self) -> object:
        if self.tok.kind not in ("string", "number", "bool"):
            raise self._error("a value (a quoted string, a number, true or false)",
                              '; quote text values, e.g. "cardiology"')
        return self._take(self.tok.kind, "a value").value

    def _list(self, field: str) -> list[object]:
        self._take("(", "'(' to start the IN list, e.g. IN (\"a\", \"b\")")
        values: list[object] = []
        if self.tok.kind != ")":  # IN () is allowed: it matches nothing, NOT IN () everything
            values.append(self._value())
            while self.tok.kind == ",":
                self._take(",", "','")
                values.append(self._value())
                self.ctx.check_in_count(field, len(values))
        self._take(")", "',' or ')' in the IN list")
        return values
