"""The doc store's string columns: packed in chunks, read back as they were given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from indexes.docstore import DocStore, Document, pack_strings


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
