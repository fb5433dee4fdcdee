"""The index the framework examples search: the one named on the command line, or a
five-document one built in a temporary folder (so the examples need no prepared data)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from indexes.build import build_index
from indexes.docstore import Document as Passage
from indexes.encoders import SentenceTransformerEncoder

# A five-document corpus, so the example needs no prepared data.
DOCUMENTS = [
    Passage("d1", "Statin therapy lowers LDL cholesterol and the rate of major cardiovascular "
            "events in adults at elevated risk.", "Statins and heart disease",
            {"department": "cardiology", "year": 2012}),
    Passage("d2", "High-intensity statins reduce recurrent stroke after a first ischemic "
            "stroke, with a small increase in haemorrhagic stroke.", "Statins after stroke",
            {"department": "neurology", "year": 2006}),
    Passage("d3", "Regular aerobic exercise lowers resting blood pressure and improves "
            "cardiac function in older adults.", "Exercise and the heart",
            {"department": "cardiology", "year": 2018}),
    Passage("d4", "Mutations in BRCA1 raise the lifetime risk of breast and ovarian cancer.",
            "BRCA1", {"department": "oncology", "year": 2009}),
    Passage("d5", "Sleep deprivation impairs the consolidation of new memories.",
            "Sleep and memory", {"department": "neurology", "year": 2015}),
]


def index_path() -> Path:
    """The index named on the command line, or a tiny one built now in a temporary folder."""
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    root = Path(tempfile.mkdtemp(prefix="retrieval-example-")) / "index"
    build_index(DOCUMENTS, root, encoder=SentenceTransformerEncoder(), progress=False)
    return root
