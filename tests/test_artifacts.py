"""Artifacts: save/load round trips, checksums, atomic publication, typed errors."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.manifest import CURRENT, EncoderInfo, read_manifest
from retrieval import (
    CorpusError,
    CorruptArtifactError,
    EncoderMismatchError,
    FilterTypeError,
    FormatVersionError,
    InvalidQueryError,
    LimitExceededError,
    MalformedFilterError,
    MissingArtifactError,
    Retriever,
    UnknownFieldError,
)

SUBSET = 200


@pytest.fixture(scope="module")
def small_root(dataset, tmp_path_factory, build_subset) -> Path:
    docs = list(itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), SUBSET))
    root = tmp_path_factory.mktemp("small")
    build_subset(docs, root)
    return root


@pytest.fixture(scope="module")
def small(small_root, encoder) -> Retriever:
    return Retriever.load(small_root, encoder=encoder)


def _copy_build(root: Path, tmp_path: Path) -> Path:
    build = root / "builds" / (root / CURRENT).read_text().strip()
    target = tmp_path / build.name
    shutil.copytree(build, target)
    return target


def test_save_load_gives_identical_results(small, small_root, encoder, tmp_path):
    moved = Retriever.load(_copy_build(small_root, tmp_path), encoder=encoder)
    for query in ("cell differentiation", "cancer risk", "protein folding in neurons"):
        a, b = small.search(query, k=10), moved.search(query, k=10)
        assert [(h.doc_id, h.score, h.text) for h in a.hits] == [
            (h.doc_id, h.score, h.text) for h in b.hits]


def test_flipped_byte_in_any_artifact_names_the_file(small_root, encoder, tmp_path):
    build = _copy_build(small_root, tmp_path)
    files = sorted(read_manifest(build).files)
    assert len(files) >= 10
    for relative in files:
        path = build / relative
        original = path.read_bytes()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))
        with pytest.raises(CorruptArtifactError) as info:
            Retriever.load(build, encoder=encoder)
        assert info.value.path == path and str(path) in str(info.value)
        path.write_bytes(original)
    Retriever.load(build, encoder=encoder)  # restored: loads again


def test_missing_file_and_unknown_format_version(small_root, encoder, tmp_path):
    build = _copy_build(small_root, tmp_path)
    (build / "bm25" / "rows.npy").unlink()
    with pytest.raises(MissingArtifactError, match="rows.npy"):
        Retriever.load(build, encoder=encoder)
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["format_version"] = 99
    (build / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatVersionError, match="format_version 99"):
        Retriever.load(build, encoder=encoder)
    with pytest.raises(MissingArtifactError, match="neither a build directory"):
        Retriever.load(tmp_path / "nowhere", encoder=encoder)


def test_rebuild_reuses_vectors_by_content_hash(dataset, encoder, tmp_path):
    docs = list(itertools.islice(read_corpus(dataset("scifact")), 60))
    first = build_index(docs[:50], tmp_path, encoder=encoder, progress=False)
    changed = [Document(d.id, d.text + " (revised)", d.title) for d in docs[:5]]
    second = build_index(changed + docs[5:60], tmp_path, encoder=encoder, progress=False)
    assert (first.vectors_reused, first.vectors_encoded) == (0, 50)
    assert (second.vectors_reused, second.vectors_encoded) == (45, 15)
    reloaded = Retriever.load(tmp_path, encoder=encoder)
    assert reloaded.build_id == second.build_id
    fresh = encoder.encode([d.content for d in changed + docs[5:60]])
    np.testing.assert_allclose(reloaded.snapshot.vectors.reconstruct_all(), fresh, atol=1e-5)


_KILLABLE_BUILD = """
import sys, numpy as np
from indexes.build import build_index
from indexes.manifest import EncoderInfo
from indexes.docstore import Document
n, dim = 20000, 4096
docs = [Document(f"d{i}", f"word{i % 97} text{i % 13}") for i in range(n)]
vectors = np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)
build_index(docs, sys.argv[1], vectors=vectors, progress=False,
            encoder_info=EncoderInfo(encoder_id="random:none:fp32:4096", model="random",
                                     dim=dim, vector_dtype="float32"))
"""


def test_build_killed_half_way_leaves_current_on_old_build(small_root, encoder, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(small_root, root)
    before = (root / CURRENT).read_text()
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE_BUILD, str(root)])
    deadline = time.monotonic() + 120
    while not list((root / "builds").glob(".tmp-*")):
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert (root / CURRENT).read_text() == before
    retriever = Retriever.load(root, encoder=encoder)
    assert retriever.search("cell", k=3).hits


def test_failed_build_raises_typed_error_and_publishes_nothing(small_root, tmp_path, encoder,
                                                               build_subset):
    root = tmp_path / "root"
    shutil.copytree(small_root, root)
    before = (root / CURRENT).read_text()
    mixed = [Document("a", "x y", metadata={"year": 2001}),
             Document("b", "y z", metadata={"year": "soon"})]
    with pytest.raises(CorpusError, match="year"):
        build_subset(mixed, root)
    with pytest.raises(CorpusError, match="duplicate"):
        build_index([Document("a", "x"), Document("a", "y")], root, encoder=encoder)
    with pytest.raises(CorpusError, match="empty"):
        build_index([], root, encoder=encoder)
    vectors = np.ones((3, 4), dtype=np.float32)
    vectors[2, 1] = np.nan
    info = EncoderInfo(encoder_id="given", model="given", dim=4, vector_dtype="float32")
    with pytest.raises(CorpusError, match="row 2 holds NaN or infinity"):
        build_index([Document(i, "x y") for i in "abc"], root, vectors=vectors,
                    encoder_info=info)
    for odd, named in ((np.full((3, 4), "0.5"), "<U3"), (vectors.astype(complex), "complex")):
        with pytest.raises(CorpusError, match=f"hold {named}.* values; give real numbers"):
            build_index([Document(i, "x y") for i in "abc"], root, vectors=odd,
                        encoder_info=info)
    assert (root / CURRENT).read_text() == before


def test_float16_refuses_values_it_cannot_hold(tmp_path):
    """Past 65,504 float16 stores infinity, and every search then scored all rows alike (and
    every compaction failed): refused at the build and at a write."""
    from indexes import BuildConfig
    from indexes.errors import InvalidWriteError
    from indexes.writer import IndexWriter

    info = EncoderInfo(encoder_id="given", model="given", dim=4, vector_dtype="float32")
    docs = [Document(i, "x y") for i in "abc"]
    large = np.eye(3, 4, dtype=np.float32)
    large[1, 0] = 1e6
    config = BuildConfig(vector_dtype="float16")
    with pytest.raises(CorpusError, match="row 1 holds a value float16 cannot hold"):
        build_index(docs, tmp_path, vectors=large, encoder_info=info, config=config)
    build_index(docs, tmp_path, vectors=np.eye(3, 4, dtype=np.float32), encoder_info=info,
                config=config)
    with IndexWriter(tmp_path) as writer, pytest.raises(InvalidWriteError, match="float16"):
        writer.upsert([Document("d", "x")], vectors=large[1:2])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"query": ""}, InvalidQueryError, "empty"),
        ({"query": "   \t\n"}, InvalidQueryError, "empty"),
        ({"query": 42}, InvalidQueryError, "string"),
        ({"query": "cell", "k": 0}, InvalidQueryError, "at least 1"),
        ({"query": "cell", "k": 10**6}, LimitExceededError, "max_k"),
        ({"query": "cell", "k": "10"}, InvalidQueryError, "integer"),
        ({"query": "cell", "candidates": 0}, InvalidQueryError, "candidates"),
        ({"query": "x" * 5000}, LimitExceededError, "max_query_chars"),
        ({"query": "cell", "filters": {"colour": "red"}}, UnknownFieldError, "colour"),
        ({"query": "cell", "filters": {"year": "recent"}}, FilterTypeError, "year"),
        ({"query": "cell", "filters": {"department": {"gte": 3}}}, FilterTypeError, "department"),
        ({"query": "cell", "filters": {"year": {"between": [1, 2]}}}, MalformedFilterError,
         "between"),
        ({"query": "cell", "filters": "year >= "}, MalformedFilterError, "position 8"),
        ({"query": "cell", "filters": 7}, MalformedFilterError, "not int"),
    ],
)
def test_bad_input_is_a_typed_error_and_the_retriever_keeps_serving(small, kwargs, error, message):
    with pytest.raises(error, match=message):
        small.search(**kwargs)
    assert small.search("cell", k=2).hits


def test_query_vector_of_wrong_dimension(small):
    with pytest.raises(EncoderMismatchError, match="dimension"):
        small.search("cell", query_vector=np.ones(17, dtype=np.float32))


class _OtherEncoder:
    """A real (if useless) encoder of our Encoder interface with a different model id."""

    encoder_id = "other-model:torch:fp32:384"
    model = "other-model"
    dim = 384

    def encode(self, texts, *, batch_size=64, progress=False):
        return np.ones((len(texts), self.dim), dtype=np.float32) / np.sqrt(self.dim)


def test_encoder_model_mismatch_is_refused(small_root):
    with pytest.raises(EncoderMismatchError, match="other-model"):
        Retriever.load(small_root, encoder=_OtherEncoder())


class _BrokenEncoder:
    """Our Encoder interface in memory, returning what a faulty model could: a NaN row, or
    rows of another width than it says."""

    encoder_id, model = "broken:fp32:4", "broken"

    def __init__(self, dim: int, width: int, nan_row: int | None) -> None:
        self.dim, self.width, self.nan_row = dim, width, nan_row

    def encode(self, texts, *, batch_size=64, progress=False):
        vectors = np.full((len(texts), self.width), 0.5, dtype=np.float32)
        if self.nan_row is not None:
            vectors[self.nan_row] = np.nan
        return vectors


@pytest.mark.parametrize(("width", "nan_row", "says"), [
    (4, 2, "returned NaN or infinity for row 2 \\('third text'"),
    (5, None, r"shape \(4, 5\) for 4 texts; it says it makes 4-dimensional"),
])
def test_vectors_an_encoder_got_wrong_are_refused_naming_them(tmp_path, width, nan_row,
                                                              says):
    """A NaN row was stored, and every search then scored every row 1.0 in row order; a
    wrong width was numpy's broadcast error."""
    from indexes.errors import CorpusError

    docs = [Document(f"d{i}", text) for i, text in
            enumerate(["first text", "second text", "third text", "fourth text"])]
    with pytest.raises(CorpusError, match=says):
        build_index(docs, tmp_path, encoder=_BrokenEncoder(4, width, nan_row), progress=False)
    assert not (tmp_path / CURRENT).exists()


@pytest.mark.parametrize(("document", "says"), [
    (Document("a\ud800", "x y"), "a document id 'a\\\\ud800' holding a lone surrogate"),
    (Document("a", "x y", "t\udc00"), "a title 't\\\\udc00' holding a lone surrogate"),
    (Document("a", "x \ud800 y"), "a text 'x \\\\ud800 y' holding a lone surrogate"),
    (Document("a", "x y", metadata={"lab": "l\ud800"}),
     "metadata field 'lab' holds a value 'l\\\\ud800' holding a lone surrogate"),
])
def test_a_lone_surrogate_is_refused_naming_where(tmp_path, document, says):
    """JSON's "\\ud800" escape reads as half a UTF-16 pair, which no file stores as UTF-8:
    a UnicodeEncodeError at the end of the build, from the doc store or a JSON writer; and
    from a live write's digest."""
    from indexes.errors import CorpusError, InvalidWriteError
    from indexes.writer import IndexWriter

    info = EncoderInfo(encoder_id="given", model="given", dim=2, vector_dtype="float32")
    docs = [Document("b", "x y", metadata={"lab": "l1"}), document]
    with pytest.raises(CorpusError, match=says):
        build_index(docs, tmp_path, vectors=np.ones((2, 2), np.float32), encoder_info=info,
                    progress=False)
    build_index(docs[:1], tmp_path, vectors=np.ones((1, 2), np.float32), encoder_info=info,
                progress=False)
    with IndexWriter(tmp_path) as writer, pytest.raises(InvalidWriteError, match="surrogate"):
        writer.upsert([document], vectors=np.ones((1, 2), np.float32))
