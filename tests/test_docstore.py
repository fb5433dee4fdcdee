"""The doc store's string columns: packed in chunks, read back as they were given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.docstore import DocStore, Document, metadata_json, pack_metadata, pack_strings
from indexes.errors import CorpusError


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.text(max_size=12), max_size=30), chunk=st.integers(1, 7))
def test_a_column_packs_in_chunks_as_every_string_encoded_alone(values: list[str],
                                                                chunk: int) -> None:
    blob, offsets = pack_strings(values, chunk)
    encoded = [v.encode("utf-8") for v in values]
    assert blob.tobytes() == b"".join(encoded)
    assert offsets.tolist() == np.cumsum([0, *map(len, encoded)]).tolist()


def test_documents_come_back_from_a_saved_store(tmp_path: Path) -> None:
    documents = [
        Document(id="a", text="plain ascii", metadata={"year": 2024}),
        Document(id="b-ü", text="naïve café – 東京", title="Ünïcode",
                 metadata={"tags": ["x", "ÿ"], "score": 0.5}),
        Document(id="c", text=""),
    ]
    DocStore.build(documents).save(tmp_path)
    store = DocStore.load(tmp_path)
    assert store.get_many([2, 0, 1]) == [documents[2], documents[0], documents[1]]
    assert store.row_of("b-ü") == 1


class Label(str):
    """A str subclass: orjson is told to pass these to the standard encoder."""


@pytest.mark.parametrize("metadata", [
    {"year": 2024, "open": True, "missing": None},
    {"score": float("nan")},
    {"bounds": [1.5, float("inf"), -float("inf")]},
    {"big": 2**70, "negative_big": -(2**65)},
    {"nested": {1: "a", False: "b", 2.5: "c"}},
    {"label": Label("x"), "pair": (1, 2)},
    {"text": "null", "unicode": "naïve 東京"},
    {"floats": [1e16, -0.0, 5e-324, 0.1]},
], ids=["plain", "nan", "infinities", "big-ints", "non-str-keys", "subclass-tuple", "null-text",
        "floats"])
def test_metadata_is_stored_as_the_standard_encoder_reads_back(tmp_path: Path,
                                                               metadata: dict) -> None:
    """orjson where it writes what the standard encoder does; otherwise the standard
    encoder: NaN stays NaN, not null; keys and integers orjson refuses are kept."""
    DocStore.build([Document(id="a", text="t", metadata=metadata)]).save(tmp_path)
    stored = DocStore.load(tmp_path).get(0).metadata
    assert repr(stored) == repr(json.loads(json.dumps(metadata, sort_keys=True)))


def test_metadata_neither_encoder_takes_is_refused() -> None:
    with pytest.raises(CorpusError, match="holds a value JSON has no type for"):
        DocStore.build([Document(id="a", text="t", metadata={"tags": {"a", "b"}})])


@pytest.mark.parametrize("n_docs", [0, 1, 6, 7])
def test_metadata_packs_in_chunks_as_each_row_encoded_alone(n_docs: int) -> None:
    docs = [Document(id=str(i), text="", metadata={"i": i, "x": "é" * i, "odd": i % 2 or None})
            for i in range(n_docs)]
    blob, offsets = pack_metadata(docs, chunk=3)
    encoded = [metadata_json(d.metadata) for d in docs]
    assert blob.tobytes() == b"".join(encoded)
    assert offsets.tolist() == np.cumsum([0, *map(len, encoded)]).tolist()
