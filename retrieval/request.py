"""Validation of search input: every problem becomes a typed error that says how to fix it."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from indexes.errors import InvalidQueryError, LimitExceededError
from indexes.lru import LRU
from retrieval.config import Limits, RetrieverConfig
from retrieval.filters import Filter, canonical, parse_filter


@dataclass(frozen=True)
class SearchRequest:
    """A validated request: the analyzed-ready query, parsed filters, k and candidates."""

    query: str
    filter: Filter | None
    filter_key: str
    k: int
    candidates: int


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueryError(f"{name} must be an integer, got {type(value).__name__}")
    if value < low:
        raise InvalidQueryError(f"{name} must be at least {low}, got {value}")
    if value > high:
        raise LimitExceededError(f"{name}={value} exceeds the limit {high}; lower it or raise "
                                 f"limits.max_{name} in the retriever config")
    return value


def check_query_text(query: Any, config: RetrieverConfig) -> str:
    if not isinstance(query, str):
        raise InvalidQueryError(f"query must be a string, got {type(query).__name__}")
    if not query.strip():
        raise InvalidQueryError("query is empty or whitespace; pass the question text to search")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: no tokenizer or cache key can use them
        raise InvalidQueryError(
            f"query is not valid Unicode (unpaired surrogate at position {exc.start}); "
            "decode the input text properly before searching"
        ) from exc
    limit = config.limits.max_query_chars
    if len(query) > limit:
        raise LimitExceededError(f"query has {len(query)} characters, more than the limit "
                                 f"{limit}; shorten it or raise limits.max_query_chars")
    return query


class FilterMemo:
    """Parsed filters by their JSON text, per build: a repeated filter skips parsing.

    Only JSON-representable filters up to ``max_text`` characters are remembered; errors are
    never remembered (they raise again, with the same message, on every call).
    """

    def __init__(self, kinds: Mapping[str, str], limits: Limits, size: int = 1024,
                 max_text: int = 4096) -> None:
        self.kinds = kinds
        self.limits = limits
        self._max_text = max_text
        self._entries: LRU[tuple[bool, str], tuple[Filter | None, str]] = LRU(size)
        self._lock = threading.Lock()

    def parse(self, filters: Any) -> tuple[Filter | None, str]:
        """(parsed filter or None, canonical key)."""
        if filters is None:
            return None, ""
        key = self._memo_key(filters)
        if key is not None:
            with self._lock:
                found = self._entries.get(key)
            if found is not None:
                return found
        parsed = parse_filter(filters, self.kinds, max_clauses=self.limits.max_filter_clauses,
                              max_in_values=self.limits.max_in_values)
        entry = (parsed, canonical(parsed) if parsed is not None else "")
        if key is not None:
            with self._lock:
                self._entries.put(key, entry)
        return entry

    def _memo_key(self, filters: Any) -> tuple[bool, str] | None:
        if isinstance(filters, str):
            text = filters
        elif isinstance(filters, dict):
            try:
                text = json.dumps(filters, sort_keys=True)
            except (TypeError, ValueError):  # dates, numpy scalars, mixed keys: just parse
                return None
        else:
            return None
        return (isinstance(filters, str), text) if len(text) <= self._max_text else None


def check_deadline(deadline_ms: Any, config: RetrieverConfig) -> float | None:
    """The search's budget in ms (the argument, else the config default), or None."""
    if deadline_ms is None:
        return config.deadline_ms
    if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int | float) \
            or not math.isfinite(deadline_ms) or deadline_ms <= 0:
        raise InvalidQueryError(f"deadline_ms must be a positive number of milliseconds, got "
                                f"{deadline_ms!r}; pass None for the config default")
    return float(deadline_ms)


def validate(
    query: Any, filters: Any, k: Any, candidates: Any, config: RetrieverConfig,
    memo: FilterMemo,
) -> SearchRequest:
    """Check every argument of a search against the config and the index's field kinds."""
    text = check_query_text(query, config)
    limits = config.limits
    k = _check_int("k", config.default_k if k is None else k, 1, limits.max_k)
    c = _check_int("candidates", config.candidates if candidates is None else candidates, 1,
                   limits.max_candidates)
    parsed, key = memo.parse(filters)
    return SearchRequest(text, parsed, key, k, max(c, k))
