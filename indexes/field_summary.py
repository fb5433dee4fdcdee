"""What a filter can name: each metadata field's kind, coverage, common values or range.

One computation behind ``retrieval describe`` (text) and the service's ``GET /v1/index``
(JSON, which the console builds its filter controls from).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from indexes.metadata import FieldKind, MetadataIndex


@dataclass(frozen=True)
class FieldSummary:
    """One metadata field as filters see it."""

    name: str
    kind: FieldKind
    documents: int  # documents holding a value
    of: int  # documents in the build
    distinct: int = 0  # keyword fields: distinct values
    common: list[tuple[str, int]] = field(default_factory=list)  # (value, documents), top first
    multi_valued: bool = False  # a document holds several values (a list field)
    low: float | None = None  # number and date fields: the range (dates in epoch seconds)
    high: float | None = None

    def as_dict(self) -> dict[str, object]:
        shown = {"kind": self.kind, "documents": self.documents, "of": self.of}
        if self.kind == "keyword":
            return {**shown, "distinct": self.distinct, "multi_valued": self.multi_valued,
                    "common": [[value, n] for value, n in self.common]}
        bounds: dict[str, object] = {"min": self.low, "max": self.high}
        if self.kind == "date" and self.low is not None and self.high is not None:
            bounds = {"min": iso_date(self.low), "max": iso_date(self.high)}
        return {**shown, **bounds}

    def text(self) -> str:
        """``retrieval describe``'s line for the field."""
        if self.kind == "keyword":
            shown = ", ".join(f"{value!r} ({n})" for value, n in self.common)
            more = self.distinct - len(self.common)
            listed = ", list values" if self.multi_valued else ""
            return (f"{self.name} (keyword, {self.distinct} distinct values{listed}): {shown}"
                    + (f", ... {more} more" if more > 0 else ""))
        if self.low is None or self.high is None:
            return f"{self.name} ({self.kind}): no values"
        show = iso_date if self.kind == "date" else _number
        return (f"{self.name} ({self.kind}, {self.documents} of {self.of} documents): "
                f"{show(self.low)} .. {show(self.high)}")


def summarize_fields(metadata: MetadataIndex, top: int) -> list[FieldSummary]:
    """Every field, by name, with up to ``top`` common values per keyword field."""
    return [summarize_field(metadata, name, kind, top)
            for name, kind in sorted(metadata.kinds.items())]


def summarize_field(metadata: MetadataIndex, name: str, kind: FieldKind, top: int
                    ) -> FieldSummary:
    if kind == "keyword":
        values, offsets, rows = metadata.keyword_postings(name)
        counts = np.diff(offsets)
        # nlargest, not a full sort: an id-like field can hold a value per document.
        best = heapq.nlargest(top, range(len(values)), key=lambda i: (int(counts[i]), _neg(i)))
        holders = int(np.unique(np.asarray(rows)).size) if len(rows) else 0
        return FieldSummary(name, kind, holders, metadata.n_live, len(values),
                            [(values[i], int(counts[i])) for i in best],
                            multi_valued=len(rows) > holders)
    column = metadata.numeric_column(name)
    present = column[~np.isnan(column)]
    if not present.size:
        return FieldSummary(name, kind, 0, metadata.n_live)
    return FieldSummary(name, kind, int(present.size), metadata.n_live, low=float(present.min()),
                        high=float(present.max()))


def iso_date(seconds: float) -> str:
    """The UTC time ``seconds`` after the epoch; past what a datetime holds (a date of year 1
    at a positive offset is in year 0 in UTC) the seconds themselves."""
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return f"{seconds:.0f} seconds from 1970-01-01T00:00:00Z"


def _neg(i: int) -> int:
    """Ties go to the value first in sorted order (values are stored sorted)."""
    return -i


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"
