"""Compaction: fold the write-ahead log into a new full build, publish it, retire the folded
segments.

The new build's manifest records the last folded sequence number (``log_seq``); a serving
process that switches to it drops exactly the delta records up to that number in the same
swap, so no write is invisible or counted twice. A nightly build from a corpus folds the log
itself (``indexes.rebuild``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from indexes.analyzer import AnalyzerConfig
from indexes.ann import ANN_DIR, default_nlist
from indexes.bm25 import BM25Params
from indexes.build import BuildConfig, build_index
from indexes.docstore import DocStore, Document
from indexes.errors import CorpusError, LiveBuildChangedError
from indexes.going_live import go_live, retire_folded
from indexes.manifest import BuildSettings, Manifest, read_manifest, resolve_build_dir
from indexes.passages import TokenCounter
from indexes.sharding.layout import build_parts, is_sharded
from indexes.storage import read_json
from indexes.vectors import Bounds, VectorStore, joined_bounds
from indexes.wal.checks import check_fields_fit, check_records_fit, merged_kinds
from indexes.wal.log import (
    LogCorruptionError,
    check_starts_by,
    read_all,
    segments,
    wal_dir,
)
from indexes.wal.split import passage_config, passage_corpus
from indexes.wal.state import Changes


class Folder(Protocol):
    """What compaction needs of the root's writer (``IndexWriter``), whose lock it holds."""

    root: Path

    def caught_up(self) -> int: ...

    def rotate(self) -> int: ...

    def reopen(self) -> None: ...

    def token_counter(self) -> TokenCounter: ...

    def tokenizer_dir(self) -> Path: ...


ATTEMPTS = 3  # a compaction started again from a build published while it ran


@dataclass(frozen=True)
class CompactionReport:
    build_id: str
    log_seq: int  # records up to here are in the new build
    records_folded: int
    n_docs: int
    segments_retired: int
    seconds: float


def compact(writer: Folder, progress: bool = False) -> CompactionReport:
    """Fold every record acknowledged so far into a new published build (vectors reused).

    Writes made while it runs go to a new segment and stay in the log for the next one. A
    build published meanwhile by another process (a gated nightly build, a rollback) is not
    undone: the compaction starts again from it, a few times at most
    (``LiveBuildChangedError`` then).
    """
    started, attempt = time.perf_counter(), 1
    while True:
        try:
            return _compact_once(writer, progress, started)
        except LiveBuildChangedError:
            if attempt == ATTEMPTS:
                raise
            attempt += 1


def _compact_once(writer: Folder, progress: bool, started: float) -> CompactionReport:
    root = writer.root
    build = resolve_build_dir(root)
    manifest = read_manifest(build)
    if writer.caught_up() <= manifest.log_seq:  # nothing to fold: keep the live build, but
        # retire what it folded (a compaction that stopped after publishing left it behind)
        retired = retire_folded(root)
        return CompactionReport(manifest.build_id, manifest.log_seq, 0, manifest.n_docs,
                                retired, round(time.perf_counter() - started, 3))
    folded = writer.rotate()
    records = [r for r in read_all(root, after=manifest.log_seq) if r.seq <= folded]
    if (records[0].seq != manifest.log_seq + 1) if records else (folded > manifest.log_seq):
        if resolve_build_dir(root) != build:  # builds published meanwhile retired the log
            raise LiveBuildChangedError(f"the live build of {root} changed while compacting")
        listed = segments(root)
        check_starts_by(listed[0][1], listed[0][0], manifest.log_seq)
        raise LogCorruptionError(f"the log has lost writes after seq {manifest.log_seq}: "
                                 "restore it from a backup", wal_dir(root))
    changes = Changes.of(records, after=manifest.log_seq)
    check_records_fit(manifest, changes)
    check_fields_fit(manifest, changes)
    passages = passage_config(manifest)
    if passages is not None:  # whole documents, split again as a fresh passage build does
        passages.tokenizer = str(writer.tokenizer_dir())  # the writer's cuts, the build's too
        docs, vectors = passage_corpus(build, changes, writer.token_counter(), passages)
    else:
        docs, vectors = _live_corpus(build, changes)
    grid = _vector_grid(build)
    if not docs:
        raise CorpusError(
            "every document is deleted, and a build needs at least one: nothing was folded. "
            "Searches find nothing meanwhile; the log keeps the deletes until a document is "
            "upserted, and the next compaction folds them")
    settings = _settings(build, manifest)  # a fresh build with them chooses as this one
    config = BuildConfig(analyzer=AnalyzerConfig(**manifest.analyzer),
                         bm25=BM25Params(**manifest.bm25), passages=passages,
                         vector_dtype=manifest.encoder.vector_dtype,  # type: ignore[arg-type]
                         allow_new_fields=manifest.allow_new_fields,
                         postings=settings.postings, typo_tolerance=settings.typo_tolerance,
                         ann=settings.ann)
    parts = build_parts(build)  # a sharded build compacts into as many shards
    report = build_index(docs, root, vectors=vectors, encoder_info=manifest.encoder,
                         config=config, progress=progress, log_seq=folded,
                         export_seq=manifest.replay_from, exported_at=manifest.exported_at,
                         publish=False,
                         shards=_shard_count(build, len(parts), len(docs)),
                         dense=settings.dense,
                         field_kinds=merged_kinds(manifest.metadata_fields, records,
                                                  manifest.allow_new_fields),
                         vector_grid=grid)
    try:
        _, retired = go_live(root, report.build_id, "plain", replaces=manifest.build_id)
    except LiveBuildChangedError:
        shutil.rmtree(report.path, ignore_errors=True)  # made from a build no longer live
        raise
    writer.reopen()
    return CompactionReport(report.build_id, folded, len(records), report.n_docs, retired,
                            round(time.perf_counter() - started, 3))


def _shard_count(build: Path, parts: int, documents: int) -> int | None:
    """As many shards as the build, while the documents left fill them: every shard needs one
    (a sharded root emptied below its shard count folds into fewer)."""
    if not is_sharded(build):
        return None
    return max(1, min(parts, documents))


def _live_corpus(build: Path, changes: Changes) -> tuple[list[Document], np.ndarray]:
    base_docs, base_vectors = _build_documents(build, changes.replaced())
    upserted = list(changes.upserts.values())
    docs = base_docs + [doc for doc, _ in upserted]
    vectors = np.concatenate([base_vectors, np.stack([v for _, v in upserted])]) \
        if upserted else base_vectors
    return docs, vectors


def _build_documents(build: Path, replaced: set[str]) -> tuple[list[Document], np.ndarray]:
    """The surviving documents of a build (whole or sharded), in row order, and their stored
    vectors."""
    docs: list[Document] = []
    vectors: list[np.ndarray] = []
    for part in build_parts(build):
        store = DocStore.load(part / "docstore")
        rows = [r for r in range(len(store)) if store.doc_id(r) not in replaced]
        docs.extend(store.get(r) for r in rows)
        vectors.append(VectorStore.load(part / "vectors").reconstruct_rows(
            np.asarray(rows, np.int64)))
    return docs, np.concatenate(vectors)


def _vector_grid(build: Path) -> Bounds | None:
    """The int8 grid of a build's vectors (its shards share one), None for a float store."""
    grids = [VectorStore.load(part / "vectors").grid() for part in build_parts(build)]
    return joined_bounds([g for g in grids if g is not None]) if grids[0] is not None else None


def _settings(build: Path, manifest: Manifest) -> BuildSettings:
    """The settings the build recorded; a build that recorded none (written before they were,
    or streamed: ``indexes.shard_build``) is read from its files."""
    return manifest.settings or _settings_of_files(build)


def _settings_of_files(build: Path) -> BuildSettings:
    """The settings a build's files tell: its postings' format and typo dictionary, an HNSW
    leg (or its exact fallback), and exact shard legs asked for. A leg exact by its size or by
    a fallback tells nothing of what was asked: those read as the defaults (``ivf``), so a
    grown root gets the leg a fresh build chooses."""
    parts = build_parts(build)
    metas = [part / ANN_DIR / "ann.json" for part in parts]
    legs = [read_json(meta) for meta in metas if meta.is_file()]
    keyword = parts[0] / "bm25"
    return BuildSettings(
        postings="compact" if (keyword / "compact.json").is_file() else "plain",
        typo_tolerance=(keyword / "typos" / "keys.npy").is_file(),
        ann="hnsw" if any(map(_hnsw_leg, legs)) else "ivf",
        dense="exact" if is_sharded(build) and any(map(_asked_exact, legs)) else "ivf")


def _hnsw_leg(meta: dict[str, Any]) -> bool:
    """An HNSW leg, or the exact scan an HNSW graph fell back to (its calibration is keyed by
    k; an IVF one is a list)."""
    return meta["kind"] == "hnsw" or isinstance(meta.get("calibration"), dict)


def _asked_exact(meta: dict[str, Any]) -> bool:
    """An exact leg neither its size nor a fallback explains: exact search was asked for."""
    return meta["kind"] == "exact" and "fallback" not in meta \
        and default_nlist(int(meta["n_docs"])) > 0
