"""Validation of search input: every problem becomes a typed error that says how to fix it."""

from __future__ import annotations

import functools
import math
import threading
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from indexes.errors import InvalidQueryError, LimitExceededError
from indexes.lru import LRU
from indexes.metadata import MetadataIndex
from retrieval.config import Limits, RetrieverConfig
from retrieval.filters import Filter, canonical, parse_filter
from retrieval.filters.hints import absent_values
from retrieval.filters.named import (
    NO_NAMED_FILTERS,
    BoundFilters,
    NamedMask,
    named_key,
    split_named,
)
from retrieval.filters.spec_key import spec_key
from retrieval.request_path.grouping import check_grouping

T = TypeVar("T")


@dataclass(frozen=True)
class SearchRequest:
    """A validated request: the analyzed-ready query, parsed filters, k and candidates."""

    query: str
    filter: Filter | None
    filter_key: str
    k: int
    candidates: int
    group_by: str | None = None  # "document": one hit per document, k counts documents
    context: int = 0  # neighbouring passages returned with each hit
    named: NamedMask | None = None  # a registered filter ({"$named": ...}), ANDed with ``filter``
    warnings: tuple[str, ...] = ()  # filter values no document holds (``filters.hints``)
    explain: bool = False  # each hit says why it ranked there (``request_path.explain``)


# Up to this many values in all, a filter is validated in microseconds; a 100,000-value IN list
# takes tens of milliseconds on first sight, which an event loop must not spend itself.
LIGHT_FILTER_VALUES = 1_000
LIGHT_FILTER_CHARS = 16_384


def is_light_filter(filters: Any, budget: int = LIGHT_FILTER_VALUES) -> bool:
    """Whether ``filters`` (dict, DSL string or None) is small enough to validate on an event
    loop: at most ``budget`` keys and list items in all, or a DSL string of at most
    ``LIGHT_FILTER_CHARS`` characters. Stops counting as soon as the budget is spent."""
    if filters is None:
        return True
    if isinstance(filters, str):
        return len(filters) <= LIGHT_FILTER_CHARS
    pending, seen = [filters], 0
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            seen += len(item)
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            seen += len(item)
            children = item
        else:
            continue
        if seen > budget:
            return False
        pending.extend(c for c in children if isinstance(c, Mapping | list | tuple))
    return True


def integer(value: Any) -> Any:
    """A numpy integer (the length of an array, a computed k) as the Python int it is; any
    other value as it is, for the caller to check."""
    return int(value) if isinstance(value, np.integer) else value


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    value = integer(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueryError(f"{name} must be an integer, got {type(value).__name__}")
    if value < low:
        raise InvalidQueryError(f"{name} must be at least {low}, got {value}")
    if value > high:
        raise LimitExceededError(f"{name}={value} exceeds the limit {high}; lower it or raise "
                                 f"limits.max_{name} in the retriever config")
    return value


def check_min_seq(value: Any) -> int:
    """``min_seq``: a write's seq, a non-negative integer (a string compared as never
    reached, a NaN as always)."""
    value = integer(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidQueryError(f"min_seq must be a non-negative integer (the seq a write "
                                f"returned), got {value!r}")
    return value


def check_query_text(query: Any, config: RetrieverConfig) -> str:
    if not isinstance(query, str):
        raise InvalidQueryError(f"query must be a string, got {type(query).__name__}")
    limit = config.limits.max_query_chars
    if len(query) > limit:
        raise LimitExceededError(f"query has {len(query)} characters, more than the limit "
                                 f"{limit}; shorten it or raise limits.max_query_chars")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: no tokenizer or cache key can use them
        raise InvalidQueryError(
            f"query is not valid Unicode (unpaired surrogate at position {exc.start}); "
            "decode the input text properly before searching"
        ) from exc
    if not any(visible(char) for char in query):
        raise InvalidQueryError("query is empty or whitespace (or holds only invisible or "
                                "blank characters, combining marks or skin tones); pass the "
                                "question text to search")
    return query


# Unicode's Default_Ignorable_Code_Point (the ranges of DerivedCoreProperties.txt since
# Unicode 14): code points a renderer shows as nothing when it does not support them. Most
# are format characters, marks or unassigned; the Hangul fillers (U+115F, U+1160, U+3164,
# U+FFA0) are blank letters (Lo), printable though they print nothing.
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
# As a set of characters, but for the last range (4,096 tags, selectors, unassigned): compared.
_IGNORABLE_CHARS = frozenset(chr(code) for start, end in _DEFAULT_IGNORABLE[:-1]
                             for code in range(start, end + 1))
_IGNORABLE_TAGS = (chr(_DEFAULT_IGNORABLE[-1][0]), chr(_DEFAULT_IGNORABLE[-1][1]))
# Printable symbols (So) that give a query no text, which no Unicode property names:
# - the two whose glyph is blank by definition: the braille pattern blank (a cell with no dot
#   raised, a blank like a space though not White_Space) and the musical null notehead (an
#   invisible notehead that holds a stem's place);
# - the Specials block's replacement characters: U+FFFC stands for an object that is not text
#   (an image), U+FFFD for undecodable bytes (deleted by the BERT tokenizers).
_BLANK = frozenset("\u2800\U0001d159\ufffc\ufffd")
# Unicode's Emoji_Modifier property (emoji-data.txt): the skin tones (Sk), each modifying the
# emoji before it as a mark does a letter. Other modifier symbols (Sk: ^, `) are text.
_EMOJI_MODIFIERS = range(0x1F3FB, 0x1F400)


def default_ignorable(char: str) -> bool:
    """Whether ``char`` has Unicode's Default_Ignorable_Code_Point property."""
    return char in _IGNORABLE_CHARS or _IGNORABLE_TAGS[0] <= char <= _IGNORABLE_TAGS[1]


def visible(char: str) -> bool:
    """Whether a character gives a query some text to search for.

    Not whitespace, nor a control or format character (a zero-width space, NUL: not
    printable), nor a mark (categories Mn and Me: combining accents, which tokenizers strip,
    variation selectors, enclosing circles) or an emoji modifier (a skin tone): those only
    modify the character before them, nor a default-ignorable code point (the Hangul
    fillers), nor a blank or replacement symbol (``_BLANK``). A query made of those alone was
    embedded as an empty or unknown text ([UNK]), its hits all scored alike.
    """
    return (char.isprintable() and not char.isspace() and char not in _BLANK
            and unicodedata.category(char) not in ("Mn", "Me")
            and ord(char) not in _EMOJI_MODIFIERS and not default_ignorable(char))


class FilterMemo:
    """Parsed filters by their structure (``spec_key``), per build: a repeated filter skips
    parsing, whatever its size (large IN lists are the filters that repeat: access control).
    Measured at 1M passages (``benchmarks.filters``, 10,000 IN values): first sight (parse +
    mask) 12.3 ms p50, a repeat decoded from fresh JSON 0.155 ms (the memo and mask cache).

    At most ``size`` entries holding ``max_weight`` scalars in all (~100 bytes each); errors
    are never remembered (they raise again, with the same message, on every call).
    """

    def __init__(self, kinds: Mapping[str, str], limits: Limits, size: int = 1024,
                 max_weight: int = 400_000, named: BoundFilters = NO_NAMED_FILTERS,
                 metadata: MetadataIndex | None = None) -> None:
        self.kinds = kinds
        self.metadata = metadata  # for the warnings on values no document holds
        self.limits = limits
        self.named = named  # this build's named filters (replaced whole when one registers)
        # Entries weigh their number of filter values: large IN lists are bounded in total.
        self._entries: LRU[Any, tuple[Filter | None, str, tuple[str, ...], int]] = LRU(
            size, max_weight, lambda key, entry: entry[3])
        self._lock = threading.Lock()

    def parse(self, filters: Any) -> tuple[Filter | None, str]:
        """(parsed filter or None, canonical key)."""
        return self.parse_checked(filters)[:2]  # type: ignore[return-value]

    def parse_checked(self, filters: Any) -> tuple[Filter | None, str, tuple[str, ...]]:
        """``parse`` and the warnings on values no document holds, with the closest one (a
        typo would otherwise return no hits silently): remembered together, per build."""
        if filters is None:
            return None, "", ()
        keyed = spec_key(filters)
        if keyed is not None:
            with self._lock:
                found = self._entries.get(keyed[0])
            if found is not None:
                return found[:3]
        parsed = parse_filter(filters, self.kinds, max_clauses=self.limits.max_filter_clauses,
                              max_in_values=self.limits.max_in_values)
        warnings = tuple(a.message() for a in absent_values(parsed, self.metadata)) \
            if parsed is not None and self.metadata is not None else ()
        entry = (parsed, canonical(parsed) if parsed is not None else "", warnings)
        if keyed is not None:  # an entry heavier than max_weight alone is evicted at once
            with self._lock:
                self._entries.put(keyed[0], (*entry, keyed[1]))
        return entry


MAX_DEADLINE_MS = 86_400_000.0  # a day: longer budgets overflow thread timeouts (~9.2e12 ms)


def check_deadline(deadline_ms: Any, config: RetrieverConfig) -> float | None:
    """The search's budget in ms (the argument, else the config default), or None."""
    if deadline_ms is None:
        return config.deadline_ms
    if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int | float) \
            or not math.isfinite(deadline_ms) or deadline_ms <= 0:
        raise InvalidQueryError(f"deadline_ms must be a positive number of milliseconds, got "
                                f"{deadline_ms!r}; pass None for the config default")
    if deadline_ms > MAX_DEADLINE_MS:
        raise LimitExceededError(f"deadline_ms {deadline_ms!r} is more than a day "
                                 f"({MAX_DEADLINE_MS:,.0f} ms); pass None for no deadline")
    return float(deadline_ms)


def check_batch_queries(queries: Any) -> None:
    """A batch's queries must be a list (or tuple) of them: a string would be searched one
    character at a time, a generator has no length to check the limits against."""
    if not isinstance(queries, list | tuple):
        raise InvalidQueryError(f"queries must be a list of query strings, not a "
                                f"{type(queries).__name__}; search() takes one query")


def batch_vectors(query_vectors: Any, queries: int,
                  check: Callable[[Any], np.ndarray]) -> list[np.ndarray]:
    """A batch's given query vectors, one row per query, each passed through ``check`` (the
    index's ``given_query``), before any search runs."""
    rows = list(query_vectors) if isinstance(query_vectors, list | tuple) else None
    if rows is None:
        array = np.asarray(query_vectors)
        if array.ndim != 2:
            raise InvalidQueryError(f"query_vectors has shape {array.shape}; give one row per "
                                    f"query, shape ({queries}, dimension)")
        rows = list(array)
    if len(rows) != queries:
        raise InvalidQueryError(f"query_vectors has {len(rows)} rows for {queries} queries; "
                                "give one row per query")
    return [in_batch(position, functools.partial(check, row))
            for position, row in enumerate(rows)]


def in_batch(position: int, step: Callable[[], T]) -> T:
    """``step()`` for the query at ``position`` of a batch (its validation, its vector, its
    search); its error names the position."""
    try:
        return step()
    except InvalidQueryError as exc:
        raise type(exc)(f"query {position} of the batch: {exc}") from exc


def check_batch_work(queries: int, k: Any, candidates: Any, config: RetrieverConfig,
                     max_hits: int | None = None, max_candidates: int | None = None,
                     where: str = "limits") -> None:
    """Refuse a batch whose total hits (queries x k) or candidates (queries x candidates) pass
    ``max_hits`` / ``max_candidates`` (default ``config.limits``; None: unbounded), before any
    work; ``where`` names the settings to raise. Each query's own k and candidates are checked
    by ``validate``."""
    limits = config.limits
    max_hits = limits.max_batch_hits if max_hits is None else max_hits
    max_candidates = limits.max_batch_candidates if max_candidates is None else max_candidates
    k = integer(config.default_k if k is None else k)
    c = integer(config.candidates if candidates is None else candidates)
    if not (isinstance(k, int) and isinstance(c, int)):
        return  # validate names the bad argument
    c = max(c, k)  # as validate raises each query's candidates to k
    for name, total, limit, key in (
            ("hits (queries x k)", queries * k, max_hits, "max_batch_hits"),
            ("candidates (queries x candidates)", queries * c, max_candidates,
             "max_batch_candidates")):
        if limit is not None and total > limit:
            raise LimitExceededError(f"a batch of {queries} queries asks for {total:,} {name}, "
                                     f"more than the limit {limit:,}; split it, lower k or "
                                     f"candidates, or raise {where}.{key}")


def validate(
    query: Any, filters: Any, k: Any, candidates: Any, config: RetrieverConfig,
    memo: FilterMemo, group_by: Any = None, context: Any = 0, explain: Any = False,
) -> SearchRequest:
    """Check every argument of a search against the config and the index's field kinds."""
    text = check_query_text(query, config)
    return replace(validate_options(filters, k, candidates, config, memo, group_by, context,
                                    explain), query=text)


def validate_options(
    filters: Any, k: Any, candidates: Any, config: RetrieverConfig, memo: FilterMemo,
    group_by: Any = None, context: Any = 0, explain: Any = False,
) -> SearchRequest:
    """``validate`` of everything but the query text (a request with an empty query): what
    the queries of a batch share, checked once, so its errors name no query."""
    limits = config.limits
    k = _check_int("k", config.default_k if k is None else k, 1, limits.max_k)
    c = _check_int("candidates", config.candidates if candidates is None else candidates, 1,
                   limits.max_candidates)
    name, filters = split_named(filters)
    parsed, key, warnings = memo.parse_checked(filters)
    group, around = check_grouping(group_by, context)
    named = memo.named.get(name) if name is not None else None
    if named is not None:
        key = named_key(named, key)
    if not isinstance(explain, bool):
        raise InvalidQueryError(f"explain must be true or false, got {explain!r}")
    return SearchRequest("", parsed, key, k, max(c, k), group, around, named, warnings,
                         explain)
