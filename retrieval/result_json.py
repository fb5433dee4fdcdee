"""JSON of a result, without serializing a cache hit's hits again.

A result served from the cache is a copy of one shared decoded result with its own query text,
timings and cache status (``served_from_cache``); everything else, the hits above all, is the
shared result's own objects. Serializing such a copy whole costs as much as the search hit
itself (~60 us for 10 hits), so the JSON of each shared field is kept once per cache entry,
and a copy's JSON is those pieces with its own three fields dumped between them: the same
bytes ``model_dump_json()`` gives, field for field in the model's order. A copy whose shared
fields were replaced since (checked by identity; hits are frozen) is dumped whole.
"""

from __future__ import annotations

from operator import is_
from typing import Any

from pydantic import TypeAdapter

from retrieval.models import CacheInfo, SearchResult

# The fields a served copy sets for itself; the others are the shared result's own objects.
# Their adapters dump exactly as the model's fields do (tests compare the bytes).
OWN_FIELDS: dict[str, TypeAdapter[Any]] = {
    "query": TypeAdapter(str), "timings": TypeAdapter(dict[str, float]),
    "cache": TypeAdapter(CacheInfo)}
SHARED_FIELDS = tuple(name for name in SearchResult.model_fields if name not in OWN_FIELDS)
# The model's fields in order: (name, b'"name":' and its adapter) for own fields, None for shared.
FIELD_ORDER = tuple((name, (b'"%s":' % name.encode(), OWN_FIELDS[name])
                     if name in OWN_FIELDS else None) for name in SearchResult.model_fields)


class SharedFields:
    """The shared fields of one cache entry's decoded result, and their JSON once dumped.

    It holds the field values, not the result, so a result pointing at it makes no cycle.
    """

    __slots__ = ("hits", "pieces", "values")

    def __init__(self, result: SearchResult) -> None:
        fields = result.__dict__
        self.values = tuple(fields[name] for name in SHARED_FIELDS if name != "hits")
        self.hits = tuple(fields["hits"])
        self.pieces: dict[str, bytes] | None = None

    # A cache annotation, invisible to the result's equality and never pickled: results with
    # and without it compare equal, and a pickled result arrives unshared (dumped whole).
    def __eq__(self, other: object) -> bool:
        return other is None or isinstance(other, SharedFields)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _unshared, ()

    def held_by(self, result: SearchResult) -> bool:
        fields = result.__dict__
        values = (fields[name] for name in SHARED_FIELDS if name != "hits")
        hits = fields["hits"]
        return (all(map(is_, values, self.values)) and len(hits) == len(self.hits)
                and all(map(is_, hits, self.hits)))

    def json_pieces(self, result: SearchResult) -> dict[str, bytes]:
        """``"name":value`` of each shared field, exactly as the whole model writes it."""
        if self.pieces is None:  # two threads racing here compute equal bytes
            self.pieces = {name: result.model_dump_json(include={name}).encode()[1:-1]
                           for name in SHARED_FIELDS}
        return self.pieces


def _unshared() -> None:
    return None


def share(result: SearchResult) -> SearchResult:
    """Mark a cache entry's decoded result; copies made from it (``model_copy``) keep the mark."""
    result._shared = SharedFields(result)
    return result


def result_json(result: SearchResult) -> bytes:
    """``result.model_dump_json()`` as bytes, from the shared pieces where they still apply."""
    shared = result._shared
    if not isinstance(shared, SharedFields) or not shared.held_by(result):
        return result.model_dump_json().encode()
    pieces = shared.json_pieces(result)
    parts = [pieces[name] if own is None else own[0] + own[1].dump_json(getattr(result, name))
             for name, own in FIELD_ORDER]
    return b"{" + b",".join(parts) + b"}"
