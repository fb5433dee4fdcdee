"""Demo metadata: deterministic department / doc_type / year fields derived from a document id.

For collections without metadata (the BEIR sets), so that filters can be tried on them
(``retrieval build --demo-metadata``, ``make demo``). The values carry no meaning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from indexes.docstore import Document

DEPARTMENTS = ("cardiology", "oncology", "neurology", "immunology", "genetics")
DOC_TYPES = ("review", "trial", "cohort", "case-report", "meta-analysis")


def demo_metadata(doc_id: str) -> dict[str, object]:
    """Deterministic department / doc_type / year for a document id (a filter demo aid)."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return {
        "department": DEPARTMENTS[digest[0] % len(DEPARTMENTS)],
        "doc_type": DOC_TYPES[digest[1] % len(DOC_TYPES)],
        "year": 1995 + digest[2] % 30,
    }


def with_demo_metadata(documents: Iterator[Document] | list[Document]) -> Iterator[Document]:
    """The same documents with demo metadata added (existing fields win)."""
    for doc in documents:
        yield Document(doc.id, doc.text, doc.title, {**demo_metadata(doc.id), **doc.metadata})
