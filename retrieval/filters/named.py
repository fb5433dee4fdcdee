"""Named filters: a filter registered once (per tenant, per user group) and referred to by name;
its mask is computed once per build, when the build is bound, never on a request.

``NamedFilters`` holds the registered specs (build-independent); ``bind`` evaluates all of them
against one build's metadata and returns a ``BoundFilters``, an immutable name -> (filter,
canonical key, read-only mask, allowed count) table for that build. A serving layer binds the
next build before swapping it in, so the first request after a swap finds its masks ready.

A search refers to a named filter with the top-level key ``"$named"`` of a dict filter, alone
(``{"$named": "tenant-42"}``) or with inline clauses, which are ANDed with it
(``{"$named": "tenant-42", "year": {"gte": 2020}}``). Being part of the filter object, the
reference travels unchanged through the HTTP service, ``RemoteRetriever`` and the framework
adapters. Result-cache keys hold a digest of the named filter's canonical form, so
re-registering a name under another spec never serves the old results.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexes.metadata import MetadataIndex
from retrieval.errors import InvalidQueryError, MalformedFilterError, UnknownNamedFilterError
from retrieval.filters.evaluate import evaluate_counted
from retrieval.filters.nodes import Filter, Mask, canonical
from retrieval.filters.parse import parse_filter


@dataclass(frozen=True)
class NamedMask:
    filter: Filter | None  # None: the spec was empty (allows everything)
    key: str  # canonical form: part of result-cache keys, like an inline filter's
    mask: Mask | None
    allowed: int
    digest: str  # short stand-in for ``key`` (which holds every value of a large IN)


@dataclass(frozen=True)
class BoundFilters:
    """The named filters of one build."""

    entries: Mapping[str, NamedMask]

    def get(self, name: str) -> NamedMask:
        entry = self.entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self.entries)[:20]) or "(none registered)"
            raise UnknownNamedFilterError(f"no filter named {name!r}; register it first "
                                          f"(registered: {known})")
        return entry


class NamedFilters:
    """Registered filter specs by name; ``bind`` computes their masks for a build.

    ``max_clauses`` / ``max_in_values`` are the limits specs are parsed with (a named filter
    is validated like an inline one, when it is registered and again for each build, since a
    new build may lack a field).
    """

    def __init__(self, max_clauses: int = 64, max_in_values: int = 100_000) -> None:
        self._specs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.max_clauses, self.max_in_values = max_clauses, max_in_values

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._specs)

    def register(self, name: str, spec: Any, bound: BoundFilters | None,
                 metadata: MetadataIndex) -> BoundFilters:
        """Add or replace ``name`` (validated against ``metadata``, the live build) and return
        ``bound`` with only that entry recomputed. Raises InvalidQueryError for a bad spec
        (nothing is registered then)."""
        if not isinstance(name, str) or not name:
            raise InvalidQueryError(f"a filter name is a non-empty string, not {name!r}")
        entry = self._evaluate(spec, metadata)
        owned = _own_copy(spec)  # once valid, so its depth is bounded; each bind parses it again
        with self._lock:
            self._specs[name] = owned
        entries = dict(bound.entries) if bound is not None else {}
        entries[name] = entry
        return BoundFilters(entries)

    def unregister(self, name: str, bound: BoundFilters) -> BoundFilters:
        with self._lock:
            self._specs.pop(name, None)
        return BoundFilters({k: v for k, v in bound.entries.items() if k != name})

    def bind(self, metadata: MetadataIndex) -> BoundFilters:
        """Every registered filter's mask for the build of ``metadata`` (call before the swap).

        A spec the new build rejects (a field it lacks) raises: the swap should not go ahead
        with a named filter that can no longer be served.
        """
        with self._lock:
            specs = dict(self._specs)
        return BoundFilters({name: self._evaluate(spec, metadata)
                             for name, spec in specs.items()})

    def _evaluate(self, spec: Any, metadata: MetadataIndex) -> NamedMask:
        parsed = parse_filter(spec, metadata.kinds, max_clauses=self.max_clauses,
                              max_in_values=self.max_in_values)
        if parsed is None:
            return NamedMask(None, "", None, metadata.n_live, _digest(""))
        mask, allowed = evaluate_counted(parsed, metadata)
        key = canonical(parsed)
        return NamedMask(parsed, key, mask, allowed, _digest(key))


def _own_copy(spec: Any) -> Any:
    """``spec`` in containers of its own: a caller appending to the list it registered (an
    access list) changed the filter at the next build or live write, not at registration, or
    made every rebinding fail, so no write could be served."""
    if isinstance(spec, Mapping):
        return {key: _own_copy(value) for key, value in spec.items()}
    if isinstance(spec, list | tuple):
        return list(map(_own_copy, spec))
    return spec  # strings, numbers, dates: immutable


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


NAMED_KEY = "$named"
NO_NAMED_FILTERS = BoundFilters({})


def split_named(spec: Any) -> tuple[str | None, Any]:
    """(the name a filter refers to or None, the filter without the reference or None)."""
    if not isinstance(spec, Mapping) or NAMED_KEY not in spec:
        return None, spec
    name = spec[NAMED_KEY]
    if not isinstance(name, str) or not name:
        raise MalformedFilterError(f"{NAMED_KEY} takes the name of a registered filter (a "
                                   f"non-empty string), got {name!r}")
    rest = {key: value for key, value in spec.items() if key != NAMED_KEY}
    return name, rest or None


def named_key(entry: NamedMask, inline_key: str) -> str:
    """The filter key of a search using ``entry`` (and an inline filter of key
    ``inline_key``): what result-cache keys hold."""
    own = f"{NAMED_KEY}={entry.digest}"
    return f"{own}&{inline_key}" if inline_key else own


def combined_mask(entry: NamedMask, inline: Filter | None, metadata: MetadataIndex
                  ) -> tuple[Mask | None, int]:
    """(mask, allowed) of a named filter ANDed with an inline one (None: everything allowed).

    The named mask alone is returned as bound (no work); the AND of the two is remembered in
    the build's mask cache, under the named filter's digest and the inline filter.
    """
    if inline is None:
        return entry.mask, entry.allowed
    mask, allowed = evaluate_counted(inline, metadata)
    if entry.mask is None:
        return mask, allowed
    key = (NAMED_KEY, entry.digest, inline)
    found = metadata.masks.get(key)
    if found is not None and found[1] is not None:
        return found[0], found[1]
    both = np.logical_and(entry.mask, mask)
    count = int(np.count_nonzero(both))
    return metadata.masks.put(key, both, count), count
