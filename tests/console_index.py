"""An index root with two builds for the console's tests: the live one (150 Cranfield
documents) and a staged candidate (the first 120), with a keyword, a list, a number and a
date field, so every kind of filter control appears."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.docstore import Document
from indexes.encoders import Encoder
from indexes.history import live_build_id
from indexes.publish import list_builds

TAGS = ("flow", "heat", "wing", "shell", "shock")
LIVE_DOCS, STAGED_DOCS = 150, 120


def with_fields(i: int, doc: Document) -> Document:
    return Document(doc.id, doc.text, doc.title, {
        "department": ("aero", "structures", "heat")[i % 3],
        "tags": [TAGS[i % 5], TAGS[(i * 3 + 1) % 5]],
        "year": 1950 + i % 20,
        # A keyword field named as the year's range inputs were (ids "f-year-from"): every
        # console search failed on the clash.
        "year-from": ("early", "late")[i % 2],
        "published": f"19{50 + i % 20}-0{1 + i % 9}-01"})


def console_root(root: Path, cranfield: Path, encoder: Encoder) -> tuple[str, str]:
    """Build both under ``root``; returns (live build id, staged build id)."""
    docs = [with_fields(i, d) for i, d in enumerate(islice(read_corpus(cranfield), LIVE_DOCS))]
    build_index(docs, root, encoder=encoder, progress=False)
    staged = build_index(docs[:STAGED_DOCS], root, encoder=encoder, progress=False,
                         publish=False)
    live = live_build_id(root)
    assert live is not None and len(list_builds(root)) == 2
    return live, staged.build_id
