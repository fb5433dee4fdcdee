"""A small real index (the first Cranfield documents, the real model) for request-path tests
that need a Retriever but not a whole collection. Built under ``RETRIEVAL_TEST_INDEXES`` so a
later session reuses its vectors by content hash."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

import pytest

from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import Encoder

REPO = Path(__file__).resolve().parents[1]
QUERIES = [
    "what similarity laws must be obeyed when constructing aeroelastic models",
    "boundary layer transition on a flat plate at supersonic speed",
    "heat transfer to a blunt body in hypersonic flow",
    "buckling of thin cylindrical shells under axial compression",
    "pressure distribution on a wing at high angle of attack",
    "shock wave interaction with a turbulent boundary layer",
    "flutter of panels in supersonic flow",
    "laminar viscous flow in a slip regime",
    "stagnation point heat transfer with dissociation",
    "vibration of rotating beams and blades",
    "skin friction in compressible turbulent flow",
    "slender body theory for lift and drag",
    "ablation of a reentry vehicle heat shield",
]


def small_index(dataset_dir: Path, encoder: Encoder, n_docs: int = 200) -> Path:
    base = Path(os.environ.get("RETRIEVAL_TEST_INDEXES", REPO / "build" / "test-indexes"))
    root = base / f"cranfield-{n_docs}"
    docs = list(islice(with_demo_metadata(read_corpus(dataset_dir)), n_docs))
    build_index(docs, root, encoder=encoder, progress=False)
    return root


@pytest.fixture(scope="module", name="index")
def index_fixture(dataset, encoder) -> Path:
    """The small index (import ``index_fixture`` into a test module to use ``index``)."""
    return small_index(dataset("cranfield"), encoder)


@pytest.fixture(scope="module", name="query_encoder")
def query_encoder_fixture():
    """The default ONNX INT8 query encoder (about 1 ms a query)."""
    from indexes.onnx_encoder import make_encoder

    return make_encoder("onnx-int8", None)
