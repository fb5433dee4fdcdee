"""LlamaIndex ``MetadataFilters`` → the dict filter language, exactly or not at all.

EQ, NE, GT, GTE, LT, LTE, IN, NIN, CONTAINS, ANY and ALL become field operators (the last
three test the values of list fields), IS_EMPTY becomes ``{"exists": false}`` (no value, or an
empty list); AND / OR (nested to any depth) become ``$and`` / ``$or``. Anything else
(TEXT_MATCH, the NOT condition) raises ``UnsupportedFilterError``: dropping a clause would
return documents the caller excluded. NE and NIN keep documents that lack the field, as the
filter language does.

Exact to the meanings ``FilterOperator`` documents (CONTAINS: "metadata array contains value",
IS_EMPTY: "null or empty array"). LlamaIndex's ``SimpleVectorStore`` tests with Python's ``in``
and also matches a substring of a one-string field and ``""`` as empty; neither is expressible
without the field's kind, which this translation does not see (the engine refuses ``""`` as a
number), so those stay as documented rather than guessed.
"""

from __future__ import annotations

from typing import Any

from retrieval.integrations.errors import MissingExtraError, UnsupportedFilterError

try:
    from llama_index.core.vector_stores import (
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
    )
except ImportError as exc:
    raise MissingExtraError("llamaindex", "llama-index-core") from exc

__all__ = ["translate_filters"]

_OPERATORS = {
    FilterOperator.EQ: "eq", FilterOperator.NE: "ne",
    FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
    FilterOperator.LT: "lt", FilterOperator.LTE: "lte",
    FilterOperator.IN: "in", FilterOperator.NIN: "nin",
    FilterOperator.CONTAINS: "contains", FilterOperator.ANY: "any", FilterOperator.ALL: "all",
}
_CONDITIONS = {FilterCondition.AND: "$and", FilterCondition.OR: "$or"}


def translate_filters(filters: MetadataFilters) -> dict[str, Any] | None:
    """The dict filter equivalent to ``filters``; None when it has no clauses."""
    condition = filters.condition or FilterCondition.AND  # LlamaIndex's own default
    if not filters.filters:
        if condition == FilterCondition.OR:  # an OR of nothing matches nothing, not all
            raise UnsupportedFilterError(
                "MetadataFilters with condition 'or' and no filters would match no document; "
                "skip the search, or pass no filters to match every document")
        return None
    if condition not in _CONDITIONS:
        raise UnsupportedFilterError(
            f"MetadataFilters condition {condition.value!r} cannot be translated exactly; use "
            "'and' / 'or', and negate single clauses with the NE or NIN operators")
    children = [_translate(child) for child in filters.filters]
    return children[0] if len(children) == 1 else {_CONDITIONS[condition]: children}


def _translate(item: MetadataFilter | MetadataFilters) -> dict[str, Any]:
    if isinstance(item, MetadataFilters):
        nested = translate_filters(item)
        if nested is None:  # "no clause" would mean match-all under AND but not under OR
            raise UnsupportedFilterError("a nested MetadataFilters has no filters; remove it or "
                                         "give it at least one MetadataFilter")
        return nested
    if item.operator == FilterOperator.IS_EMPTY:
        return {item.key: {"exists": False}}
    op = _OPERATORS.get(item.operator)
    if op is None:
        supported = ", ".join(o.name for o in _OPERATORS)
        raise UnsupportedFilterError(
            f"filter on {item.key!r} uses operator {item.operator.name} ({item.operator.value!r}),"
            f" which the retriever's exact filters cannot express; use one of {supported}")
    return {item.key: {op: item.value}}
