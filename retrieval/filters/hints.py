"""Hints for a filter that names values no document holds (a typo returns no hits silently)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass

from indexes.metadata import MetadataIndex
from retrieval.filters.nodes import And, Eq, Filter, In, Not, Or

MAX_CHECKED_VALUES = 64
MAX_SUGGESTION_VALUES = 20_000  # difflib over more would cost the request tens of ms


@dataclass(frozen=True)
class AbsentValue:
    """``value`` of keyword ``field`` is in the filter but in no document."""

    field: str
    value: str
    closest: str | None

    def message(self) -> str:
        hint = f"; did you mean {self.closest!r}?" if self.closest else ""
        return f"no document has {self.field} = {self.value!r}{hint}"


def absent_values(node: Filter | None, metadata: MetadataIndex) -> list[AbsentValue]:
    """Keyword values the filter compares against that no document of the index holds."""
    found: list[AbsentValue] = []
    for field, value in _keyword_values(node, metadata):
        if not metadata.keyword_rows(field, value).size:
            known = metadata.keyword_values(field)
            closest = (difflib.get_close_matches(value, known, n=1, cutoff=0.5)
                       if len(known) <= MAX_SUGGESTION_VALUES else [])
            if not closest:  # a case slip is the commonest miss: "Oncology" for "oncology"
                closest = [v for v in known if v.casefold() == value.casefold()][:1]
            found.append(AbsentValue(field, value, closest[0] if closest else None))
    return found


def _keyword_values(node: Filter | None, metadata: MetadataIndex) -> Iterator[tuple[str, str]]:
    if isinstance(node, And | Or):
        for child in node.children:
            yield from _keyword_values(child, metadata)
    elif isinstance(node, Not):
        yield from _keyword_values(node.child, metadata)
    elif isinstance(node, Eq | In) and metadata.kinds.get(node.field) == "keyword":
        values = (node.value,) if isinstance(node, Eq) else node.values
        if len(values) > MAX_CHECKED_VALUES:  # an access list: absent ids are expected there
            return
        yield from ((node.field, str(v)) for v in values)
