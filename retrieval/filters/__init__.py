"""Exact metadata filters: an immutable AST, a dict language, a string DSL, cache keys, masks.

Both languages produce the same AST::

    {"year": {"gte": 2010}, "$or": [{"dept": "cardiology"}, {"dept": "oncology"}]}
    year >= 2010 AND (dept = "cardiology" OR dept = 'oncology') AND NOT retracted = true

``parse_filter`` validates against the index's field kinds and normalizes values: keyword values
become the indexed strings (booleans ``"true"``/``"false"``; the document ``id`` takes strings
only), number and date values floats (dates as epoch seconds UTC). ``canonical`` gives one JSON
string per filter whatever the key order, child order, duplicates or nesting, for cache keys.
``evaluate`` builds a boolean mask with numpy; NOT (also ``ne``, ``nin``, ``!=``, ``NOT IN``)
complements over all documents, so it keeps documents that lack the field.
"""

from __future__ import annotations

from retrieval.filters.evaluate import evaluate, evaluate_counted
from retrieval.filters.nodes import (
    And,
    Eq,
    Filter,
    In,
    Mask,
    Not,
    Or,
    Range,
    Scalar,
    canonical,
)
from retrieval.filters.parse import parse_filter

__all__ = ["And", "Eq", "Filter", "In", "Mask", "Not", "Or", "Range", "Scalar", "canonical",
           "evaluate", "evaluate_counted", "parse_filter"]
