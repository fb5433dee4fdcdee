"""The on-disk layout of a sharded build: one build directory holding S shard builds.

::

    <root>/builds/<build_id>/
      manifest.json            n_docs = N of the whole collection; ``files`` = sha256 of
                               shards.json and of every shard's manifest.json
      shards.json              the shards in row order: name, [start, stop), build id, the
                               sha256 of its manifest; the global statistics they share
      shards/shard-000/        a complete build (manifest.json with its own checksums, bm25/,
      shards/shard-001/ ...    vectors/, metadata/, docstore/, ann/) of rows [start, stop)

Shard k holds the contiguous global rows ``[start, stop)``, so a global row is ``start`` plus
the shard's row: merged ties broken by the lower global row equal the unsharded tie-breaks.
The whole sharded build is published by one flip of ``CURRENT``: every shard goes live at once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from indexes.errors import ArtifactError, CorpusError, CorruptArtifactError
from indexes.manifest import MANIFEST, read_manifest, resolve_build_dir, sha256_file, verify_build
from indexes.passages import PassageMap
from indexes.storage import load_array, read_json
from indexes.vectors import VectorStore

SHARDS_FILE = "shards.json"
SHARDS_DIR = "shards"


class ShardCountError(CorpusError):
    """The corpus cannot be split into the requested number of shards."""


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    start: int
    stop: int
    build_id: str
    manifest_sha256: str


class ShardLayout(BaseModel):
    """shards.json: the shards in row order and the statistics they all score with."""

    model_config = ConfigDict(extra="forbid")

    n_docs: int
    avgdl: float
    n_terms: int
    shards: list[ShardEntry]

    def shard_dir(self, build_dir: Path, index: int) -> Path:
        return build_dir / SHARDS_DIR / self.shards[index].name


def shard_ranges(n_docs: int, shards: int) -> list[tuple[int, int]]:
    """S contiguous [start, stop) row ranges of sizes differing by at most one."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ShardCountError(f"shards must be a positive integer, got {shards!r}")
    if shards > n_docs:
        raise ShardCountError(f"cannot split {n_docs} documents into {shards} shards: every "
                              "shard needs at least one document; ask for fewer shards")
    bounds = [n_docs * i // shards for i in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def is_sharded(path: Path) -> bool:
    """Whether ``path`` (a build directory or an index root) is a sharded build."""
    return (resolve_build_dir(Path(path)) / SHARDS_FILE).is_file()


def read_layout(path: Path, verify: bool = True) -> tuple[Path, ShardLayout]:
    """(build directory, layout) of a sharded build or of the live build of an index root.

    With ``verify``, the top manifest's checksums (shards.json and every shard manifest) are
    checked; each shard's own files are checked when the shard is loaded.
    """
    directory = resolve_build_dir(Path(path))
    if not (directory / SHARDS_FILE).is_file():
        raise ArtifactError(f"{directory} is not a sharded build (no {SHARDS_FILE}): load it "
                            "with Retriever, or build with --shards", directory)
    if verify:  # each shard checks its own files when it is loaded
        verify_build(directory, read_manifest(directory), parts=False)
    raw = read_json(directory / SHARDS_FILE)
    try:
        layout = ShardLayout.model_validate(raw)
    except ValidationError as exc:
        raise CorruptArtifactError(f"{directory / SHARDS_FILE} is not a valid shard layout: "
                                   f"{exc}", directory / SHARDS_FILE) from exc
    for i, entry in enumerate(layout.shards):
        manifest = layout.shard_dir(directory, i) / MANIFEST
        if verify and sha256_file(manifest) != entry.manifest_sha256:
            raise CorruptArtifactError(f"{manifest} differs from the checksum in "
                                       f"{SHARDS_FILE}; rebuild the index", manifest)
    return directory, layout


def build_parts(path: Path) -> list[Path]:
    """The directories holding a build's rows, in row order: the shards of a sharded build,
    else the build directory itself."""
    directory = resolve_build_dir(Path(path))
    if not (directory / SHARDS_FILE).is_file():
        return [directory]
    directory, layout = read_layout(directory, verify=False)
    return [layout.shard_dir(directory, i) for i in range(len(layout.shards))]


def joined_passages(directory: Path, layout: ShardLayout) -> PassageMap | None:
    """The passage map of a sharded passage build over global rows (each shard holds whole
    documents and its own map), or None for a build of whole documents."""
    dirs = [layout.shard_dir(directory, i) for i in range(len(layout.shards))]
    if not (dirs[0] / "passages").is_dir():
        return None
    return PassageMap.joined([PassageMap.load(d / "passages") for d in dirs])


def stored_vectors(path: Path) -> tuple[np.ndarray, VectorStore]:
    """(content hashes S16 (n,), vectors (n, d)) of a build, whole or sharded, in global row
    order: what a rebuild, the log's writer and compaction reuse by content hash."""
    parts = build_parts(path)
    if len(parts) == 1:
        return (load_array(parts[0] / "vectors" / "content_hashes.npy"),
                VectorStore.load(parts[0] / "vectors"))
    hashes = [load_array(part / "vectors" / "content_hashes.npy") for part in parts]
    blocks = [VectorStore.load(part / "vectors").reconstruct_all() for part in parts]
    return np.concatenate(hashes), VectorStore.build(np.concatenate(blocks), "float32")
