"""What the log says on top of a base build: the latest version of every upserted document
and the ids deleted since. Shared by compaction (offline) and the serving delta."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from indexes.docstore import Document
from indexes.wal.log import Record


@dataclass
class Changes:
    """Records folded into one state, in sequence order.

    ``upserts`` keeps first-upsert order (a later version replaces an earlier one in place):
    compaction appends these documents after the base's surviving rows in this order, and the
    serving delta numbers its rows the same way, so both rank ties alike.
    """

    upserts: dict[str, tuple[Document, np.ndarray]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    last_seq: int = 0
    # Passage builds: each upserted document's passage offsets; its ``upserts`` entry then
    # holds the passages' vectors (n, dim).
    spans: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # Each upserted document's ``Record.encoder``: the model its vectors came from.
    encoders: dict[str, str] = field(default_factory=dict)

    def apply(self, record: Record) -> None:
        if record.op == "upsert":
            for doc, vector, spans in record.per_document():
                self.deleted.discard(doc.id)
                self.upserts[doc.id] = (doc, vector)
                self.spans[doc.id] = spans
                self.encoders[doc.id] = record.encoder
        else:
            for doc_id in record.ids:
                self.upserts.pop(doc_id, None)
                self.spans.pop(doc_id, None)
                self.encoders.pop(doc_id, None)
                self.deleted.add(doc_id)
        self.last_seq = max(self.last_seq, record.seq)

    def replaced(self) -> set[str]:
        """Ids whose base row no longer serves: deleted, or superseded by an upsert."""
        return self.deleted | self.upserts.keys()

    @classmethod
    def of(cls, records: Iterable[Record], after: int = 0) -> Changes:
        changes = cls(last_seq=after)
        for record in records:
            if record.seq > after:
                changes.apply(record)
        return changes
