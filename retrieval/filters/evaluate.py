"""Filter evaluation: boolean masks over the metadata index, remembered per filter and leaf."""

from __future__ import annotations

import numpy as np

from indexes.doc_ids import ID_FIELD, id_mask
from indexes.metadata import MetadataIndex
from retrieval.errors import FilterTypeError, UnknownFieldError
from retrieval.filters.nodes import And, Eq, Filter, In, Mask, Not, Or, Range, Scalar
from retrieval.filters.validate import coerce, document_id, unknown_field_message


def evaluate(filter: Filter, metadata: MetadataIndex) -> Mask:
    """Boolean mask of length ``metadata.n_docs``: True where the document matches.

    The mask is read-only: it may be remembered in ``metadata.masks`` and shared by later
    calls with an equal filter (the whole filter and each leaf are remembered; a repeated
    filter costs a dict lookup, a new combination of known leaves one pass per child).
    """
    return _remembered(filter, metadata, count=False)[0]


def evaluate_counted(filter: Filter, metadata: MetadataIndex) -> tuple[Mask, int]:
    """``evaluate`` and the number of allowed documents, remembered together: counting a
    1M-document mask costs ~50 us, several cached lookups."""
    mask, allowed = _remembered(filter, metadata, count=True)
    return mask, int(np.count_nonzero(mask)) if allowed is None else allowed


def _remembered(filter: Filter, metadata: MetadataIndex, count: bool
                ) -> tuple[Mask, int | None]:
    """(mask, allowed count or None) from the cache, else evaluated (and counted if
    ``count``) and remembered."""
    if not _cacheable(filter):
        mask = _evaluate(filter, metadata)[0]
        mask.flags.writeable = False
        return mask, None
    entry = metadata.masks.get(filter)
    if entry is not None and (entry[1] is not None or not count):
        return entry
    mask = _evaluate(filter, metadata)[0] if entry is None else entry[0]
    allowed = int(np.count_nonzero(mask)) if count else None
    return metadata.masks.put(filter, mask, allowed), allowed


def _cacheable(filter: Filter) -> bool:
    """Whether the filter may key the mask cache (itself: frozen ASTs hash and compare
    structurally in ~0.5 us, ``canonical`` takes ~18 us).

    Parsed ASTs hold only str and float values. A hand-built AST holding other types is not
    cached: ``Eq("year", True) == Eq("year", 1.0)`` in Python, yet the first must raise.
    """
    kind = type(filter)
    if kind is And or kind is Or:
        return all(map(_cacheable, filter.children))  # type: ignore[union-attr]
    if kind is Not:
        return _cacheable(filter.child)  # type: ignore[union-attr]
    if kind is Eq:
        return type(filter.value) in _KEY_TYPES  # type: ignore[union-attr]
    if kind is In:
        return filter.plain  # type: ignore[union-attr]
    bounds = (filter.gt, filter.gte, filter.lt, filter.lte)  # type: ignore[union-attr]
    return all(b is None or type(b) is float for b in bounds)


_KEY_TYPES = (str, float)


def _evaluate(filter: Filter, metadata: MetadataIndex) -> tuple[Mask, bool]:
    """(mask, owned): owned masks are fresh and may be modified in place; others are shared."""
    match filter:
        case And(children) | Or(children):
            is_and = isinstance(filter, And)
            if not children:  # hand-built only: the parser never makes an empty AND/OR
                return np.full(metadata.n_docs, is_and), True
            combine = np.logical_and if is_and else np.logical_or
            first, *rest = [_evaluate(child, metadata) for child in children]
            mask, owned = first
            for child, _ in rest:
                if owned:
                    combine(mask, child, out=mask)
                else:  # the first two shared masks combine into a fresh array
                    mask, owned = combine(mask, child), True
            return mask, owned
        case Not(child):
            mask = np.logical_not(_evaluate(child, metadata)[0])
            if metadata.live_rows is not None:
                mask &= metadata.live_rows
            return mask, True
    if not _cacheable(filter):
        return _leaf_mask(filter, metadata), True
    entry = metadata.masks.get(filter)
    if entry is not None:
        return entry[0], False
    return metadata.masks.put(filter, _leaf_mask(filter, metadata)), False


def _leaf_mask(leaf: Eq | In | Range, metadata: MetadataIndex) -> Mask:
    if leaf.field == ID_FIELD:
        return _id_mask(leaf, metadata)
    kind = metadata.kinds.get(leaf.field)
    if kind is None:
        raise UnknownFieldError(unknown_field_message(leaf.field, metadata.kinds))
    if kind == "keyword":
        if isinstance(leaf, Range):
            if (leaf.gt, leaf.gte, leaf.lt, leaf.lte) == (None, None, None, None):
                return _holds_any(leaf.field, metadata)  # {"exists": true}
            raise FilterTypeError(f"field {leaf.field!r} is a keyword field: range filters need "
                                  "a number or date field")
        values: tuple[Scalar, ...]
        if isinstance(leaf, Eq):
            values, strings, joined = (leaf.value,), type(leaf.value) is str, None
        else:  # remembered by the node
            values, strings, joined = leaf.values, leaf.strings, leaf.joined
        if not strings:  # hand-built: booleans and others take the checked path
            values = tuple(str(coerce(leaf.field, kind, v)) for v in values)
            joined = None
        return metadata.keyword_mask(leaf.field, values, joined)  # type: ignore[arg-type]
    column = metadata.numeric_column(leaf.field)
    if isinstance(leaf, Eq):
        return np.equal(column, _number(leaf.field, kind, leaf.value))
    if isinstance(leaf, In):
        return np.isin(column, [_number(leaf.field, kind, v) for v in leaf.values])
    bounds = [(b, op) for b, op in zip((leaf.gt, leaf.gte, leaf.lt, leaf.lte),
                                       (np.greater, np.greater_equal, np.less, np.less_equal),
                                       strict=True) if b is not None]
    if not bounds:
        return ~np.isnan(column)  # no bounds: every document with a value
    # A comparison with NaN is False, so missing values drop out without an isnan pass.
    (first, op), *rest = bounds
    mask = op(column, _number(leaf.field, kind, first))
    for bound, op in rest:
        np.logical_and(mask, op(column, _number(leaf.field, kind, bound)), out=mask)
    return mask


def _holds_any(field: str, metadata: MetadataIndex) -> Mask:
    """Rows holding any value of a keyword field: every row of its postings."""
    mask = np.zeros(metadata.n_docs, dtype=bool)
    mask[np.asarray(metadata.keyword_postings(field)[2])] = True
    return mask


def _id_mask(leaf: Eq | In | Range, metadata: MetadataIndex) -> Mask:
    if isinstance(leaf, Range):
        raise FilterTypeError(f"{ID_FIELD!r} is the document id: filter it with = or IN")
    values = (leaf.value,) if isinstance(leaf, Eq) else leaf.values
    if not (isinstance(leaf, In) and leaf.strings):  # a parsed IN list of ids is known good
        # Hand-built: str(True) is "True", which no id filter means.
        values = tuple(map(document_id, values))
    assert metadata.ids is not None, "a snapshot's metadata knows its ids"
    return id_mask(metadata.ids, values, metadata.n_docs)  # type: ignore[arg-type]


def _number(field: str, kind: str, value: object) -> float:
    """Parsed ASTs hold floats already; hand-built ones may hold ints or ISO date strings."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return float(coerce(field, kind, value))
