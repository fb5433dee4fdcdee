"""A small index root built from precomputed vectors (random, 8-dimensional) for live-update
tests: no model is needed, so writer subprocesses start fast. The texts are real (SciFact)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from indexes import BuildConfig, Document, EncoderInfo, build_index, read_corpus
from indexes.demo_metadata import with_demo_metadata

DIM = 8
INFO = EncoderInfo(encoder_id="test/random-8", model="random-8", dim=DIM, vector_dtype="float32")


def unit_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def scifact_docs(dataset_dir: Path, n: int) -> list[Document]:
    return list(itertools.islice(with_demo_metadata(read_corpus(dataset_dir)), n))


def build_small(root: Path, docs: list[Document], seed: int = 0,
                shards: int | None = None, allow_new_fields: bool = False) -> np.ndarray:
    """Build ``docs`` under ``root`` with random unit vectors (in ``shards`` shards with exact
    dense legs, when given); returns the vectors."""
    vectors = unit_vectors(len(docs), seed)
    build_index(docs, root, vectors=vectors, encoder_info=INFO, progress=False, shards=shards,
                dense="exact", config=BuildConfig(allow_new_fields=allow_new_fields))
    return vectors
