"""A compaction builds with the settings of the build it folds (``Manifest.settings``), so it
makes the choices a fresh build with those settings makes: it rebuilt with a default
``BuildConfig`` (compact postings came back plain, a build without typo tolerance gained a
typo dictionary, an HNSW leg became IVF), and kept a sharded root's dense leg exact wherever
its shards were exact, though a shard below the IVF threshold is exact whatever was asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from live_index import DIM, INFO

from indexes import BuildConfig, Document, build_index
from indexes.manifest import (
    MANIFEST,
    MANIFEST_SHA256,
    BuildSettings,
    read_manifest,
    resolve_build_dir,
    sha256_file,
)
from indexes.shard_build import GivenRows, build_streamed
from indexes.sharding.layout import build_parts
from indexes.writer import IndexWriter
from retrieval import Retriever, RetrieverConfig

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
GROWN = 1_400  # two shards of 700 rows: past the IVF threshold (624 rows) each


def documents(n: int, prefix: str, seed: int) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [Document(f"{prefix}{i:05d}", " ".join(rng.choice(WORDS, size=5)),
                     metadata={"group": f"g{i % 3}"}) for i in range(n)]


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit vectors around 64 centres: IVF lists reach the recall target on them (random
    vectors do not cluster, and their leg falls back to exact search)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(64, DIM))
    vectors = centres[rng.integers(0, 64, n)] + 0.05 * rng.normal(size=(n, DIM))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def legs(root: Path) -> list[str]:
    return [json.loads((part / "ann" / "ann.json").read_text())["kind"]
            for part in build_parts(resolve_build_dir(root))]


def keyword_files(root: Path) -> list[tuple[bool, bool]]:
    """(compact postings, typo dictionary) of each part."""
    return [((part / "bm25" / "compact.json").is_file(), (part / "bm25" / "typos").exists())
            for part in build_parts(resolve_build_dir(root))]


def grow_and_compact(root: Path, n: int) -> None:
    with IndexWriter(root) as writer:
        writer.upsert(documents(n, "x", 1), vectors=clustered(n, 1))
        writer.compact()


@pytest.mark.parametrize("shards", [None, 2])
def test_a_compaction_keeps_compact_postings_and_no_typo_dictionary(tmp_path, shards):
    """Compaction of a build with postings="compact" and typo_tolerance=False wrote plain
    postings and a typo dictionary."""
    config = BuildConfig(postings="compact", typo_tolerance=False)
    build_index(documents(30, "d", 0), tmp_path, vectors=clustered(30, 0), encoder_info=INFO,
                progress=False, shards=shards, config=config)
    grow_and_compact(tmp_path, 1)
    assert keyword_files(tmp_path) == [(True, False)] * (shards or 1)
    assert read_manifest(resolve_build_dir(tmp_path)).settings == BuildSettings(
        postings="compact", typo_tolerance=False)
    with Retriever.load(tmp_path, RetrieverConfig(cache={"backend": "none"})) as retriever:
        assert retriever.search("alpha beta", k=3, query_vector=clustered(1, 5)[0]).hits


@pytest.mark.parametrize(("shards", "ann", "dense"),
                         [(2, "ivf", "ivf"), (2, "ivf", "exact"), (None, "hnsw", "ivf")])
def test_a_grown_root_compacts_to_the_dense_leg_a_fresh_build_chooses(tmp_path, shards, ann,
                                                                      dense):
    """Built small, every leg is exact by size; grown past the IVF threshold, the compaction
    kept a sharded root exact though IVF was asked, and turned an HNSW leg into IVF."""
    config = BuildConfig(ann=ann)  # type: ignore[arg-type]
    small = documents(40, "d", 0)
    build_index(small, tmp_path / "live", vectors=clustered(40, 0), encoder_info=INFO,
                progress=False, shards=shards, dense=dense, config=config)
    assert set(legs(tmp_path / "live")) == {"exact"}
    grow_and_compact(tmp_path / "live", GROWN)
    build_index(small + documents(GROWN, "x", 1), tmp_path / "fresh",
                vectors=np.concatenate([clustered(40, 0), clustered(GROWN, 1)]),
                encoder_info=INFO, progress=False, shards=shards, dense=dense, config=config)
    assert legs(tmp_path / "fresh") == [ann if dense == "ivf" else "exact"] * (shards or 1)
    assert legs(tmp_path / "live") == legs(tmp_path / "fresh")


def test_a_streamed_build_records_its_settings_and_compaction_keeps_them(tmp_path):
    """A streamed build records its settings as ``build_index`` does (it recorded none, and
    exact legs asked of small shards turned IVF once the root grew)."""
    docs, vectors = documents(GROWN, "d", 0), clustered(GROWN, 0)
    half = GROWN // 2
    build_streamed([GivenRows(docs[:half], vectors[:half]), GivenRows(docs[half:], vectors[half:])],
                   tmp_path, encoder_info=INFO, dense="exact",
                   config=BuildConfig(postings="compact", typo_tolerance=False))
    assert read_manifest(resolve_build_dir(tmp_path)).settings == BuildSettings(
        postings="compact", typo_tolerance=False, dense="exact")
    grow_and_compact(tmp_path, 1)
    assert keyword_files(tmp_path) == [(True, False)] * 2
    assert legs(tmp_path) == ["exact", "exact"]


def test_a_build_written_before_settings_were_recorded_loads_and_keeps_its_hnsw_leg(tmp_path):
    """An older manifest has no ``settings``: it loads, and its compaction reads the postings'
    format, the typo dictionary and the HNSW leg from the build's files."""
    config = BuildConfig(postings="compact", typo_tolerance=False, ann="hnsw")
    build_index(documents(700, "d", 0), tmp_path, vectors=clustered(700, 0), encoder_info=INFO,
                progress=False, config=config)
    build = resolve_build_dir(tmp_path)
    raw = json.loads((build / MANIFEST).read_text())
    raw.pop("settings", None)  # as a build of an earlier version wrote it
    (build / MANIFEST).write_text(json.dumps(raw))
    (build / MANIFEST_SHA256).write_text(sha256_file(build / MANIFEST) + "\n")
    assert read_manifest(build).settings is None
    grow_and_compact(tmp_path, 1)
    assert keyword_files(tmp_path) == [(True, False)]
    assert legs(tmp_path) == ["hnsw"]
