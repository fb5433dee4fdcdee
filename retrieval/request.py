"""Validation of search input: every problem becomes a typed error that says how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from indexes.errors import InvalidQueryError, LimitExceededError
from retrieval.config import RetrieverConfig
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
    limit = config.limits.max_query_chars
    if len(query) > limit:
        raise LimitExceededError(f"query has {len(query)} characters, more than the limit "
                                 f"{limit}; shorten it or raise limits.max_query_chars")
    return query


def validate(
    query: Any, filters: Any, k: Any, candidates: Any, config: RetrieverConfig,
    kinds: Mapping[str, str],
) -> SearchRequest:
    """Check every argument of a search against the config and the index's field kinds."""
    text = check_query_text(query, config)
    limits = config.limits
    k = _check_int("k", config.default_k if k is None else k, 1, limits.max_k)
    c = _check_int("candidates", config.candidates if candidates is None else candidates, 1,
                   limits.max_candidates)
    parsed = parse_filter(filters, kinds, max_clauses=limits.max_filter_clauses,
                          max_in_values=limits.max_in_values)
    key = canonical(parsed) if parsed is not None else ""
    return SearchRequest(text, parsed, key, k, max(c, k))
