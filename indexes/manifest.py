"""Build manifest, checksums and atomic publication of builds.

Layout::

    <root>/builds/<build_id>/manifest.json   plus the component directories
    <root>/CURRENT                            names the live build

A build is written into ``builds/.tmp-<build_id>``, checksummed, renamed into place, and only
then ``CURRENT`` is replaced (temp file, fsync, rename). A crash at any point leaves
``CURRENT`` on the previous build. A staged build (``publish=False``) stops after the rename:
it sits in ``builds/``, and ``CURRENT`` is flipped to it later (``indexes.publish``). Every
flip is recorded in ``HISTORY.jsonl`` (``indexes.history``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from indexes.errors import (
    CorpusError,
    CorruptArtifactError,
    FormatVersionError,
    MissingArtifactError,
    PublishError,
)
from indexes.history import check_history, flipping, read_current, rollback_target
from indexes.long_documents import WindowReport
from indexes.passages import PassageInfo
from indexes.storage import fsync_path, mint_id, read_json, sync_tree, write_json

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_SHA256 = "manifest.json.sha256"
CURRENT = "CURRENT"


class EncoderInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoder_id: str
    model: str
    dim: int
    vector_dtype: str


LiveWrites = Literal["superseded", "replayed"]


class LiveWritesInfo(BaseModel):
    """What a build from a corpus did with the writes logged on the live build before it
    started (``indexes.rebuild``): ``superseded`` by the export (the default) or
    ``replayed`` onto it. Writes logged after it started are applied on top either way."""

    model_config = ConfigDict(extra="forbid")

    policy: LiveWrites
    sealed_seq: int  # the log's last acknowledged write when the build started
    records: int  # records logged on the live build up to then (after its log_seq)
    upserted: int  # documents those records upserted (their last version)
    deleted: int  # ids they deleted

    def describe(self) -> str:
        if not self.records:
            return (f"live writes: none pending when the build started (log at seq "
                    f"{self.sealed_seq}); later writes are applied on top of it")
        what = (f"{self.records} logged writes before the build started (through seq "
                f"{self.sealed_seq}: {self.upserted} documents upserted, {self.deleted} "
                "deleted)")
        if self.policy == "superseded":
            return (f"live writes: {what} are superseded by the corpus export (keep them with "
                    "--live-writes replayed); writes logged after the build started are "
                    "applied on top of it")
        return (f"live writes: {what} are replayed onto the corpus export; writes logged "
                "after the build started are applied on top of it")


class BuildSettings(BaseModel):
    """The build's choices its files do not always tell, kept by every compaction
    (``indexes.compaction``), which rebuilds as a fresh build with them would: the postings'
    format, the typo dictionary, the dense leg's index and the dense leg asked of each shard
    (``BuildConfig`` and ``build_index(dense=)``: a shard below the IVF threshold, or whose
    vectors do not cluster, gets exact search whatever was asked)."""

    model_config = ConfigDict(extra="forbid")

    postings: Literal["plain", "compact"] = "plain"
    typo_tolerance: bool = True
    ann: Literal["ivf", "hnsw"] = "ivf"
    dense: Literal["ivf", "exact"] = "ivf"


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int
    build_id: str
    created_at: str
    n_docs: int
    analyzer: dict[str, Any]
    analyzer_fingerprint: str
    encoder: EncoderInfo
    bm25: dict[str, Any]
    metadata_fields: dict[str, str]
    files: dict[str, str]  # relative path -> sha256
    # The write-ahead log's records up to this sequence number are folded into this build
    # (indexes.wal): readers apply only later ones on top of it.
    log_seq: int = 0
    # Documents longer than the encoder's window (None: not measured, e.g. given vectors).
    window: WindowReport | None = None
    # Set when rows are passages of documents (``passages/`` holds parents and offsets).
    passages: PassageInfo | None = None
    # Whether live upserts may add metadata fields (``BuildConfig.allow_new_fields``).
    allow_new_fields: bool = False
    # A build from a corpus on a root with a log: what it did with the live writes.
    live_writes: LiveWritesInfo | None = None
    # The log position the last corpus export behind this build accounts for: a build from a
    # corpus, its log_seq; a compaction, its base's. A rebuild replaying live writes replays
    # from here (None: written before this was recorded, its log_seq).
    export_seq: int | None = None
    # When that export was read (UTC, ISO 8601): two exports read with no write between them
    # share their export_seq, and only this tells the older (None: not recorded).
    exported_at: str | None = None
    # The settings a compaction builds with (None: written before they were recorded, or by a
    # streamed build: ``indexes.compaction`` reads them from the build's files).
    settings: BuildSettings | None = None

    @property
    def replay_from(self) -> int:
        """The seq after which live writes are in no corpus export (``export_seq``)."""
        return self.log_seq if self.export_seq is None else self.export_seq


def new_build_id() -> str:
    """Sortable, unique: UTC timestamp plus random suffix (``indexes.storage.mint_id``)."""
    return mint_id()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: list[Path]) -> list[str]:
    """``sha256_file`` of each path, on every core: hashlib releases the GIL while it hashes,
    and a 1M-passage build is ~4 GB of files to hash."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(sha256_file, paths))


def checksum_tree(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` except the manifest (and its own sha256),
    keyed by relative path."""
    paths = [path for path in sorted(directory.rglob("*"))
             if path.is_file() and path.name not in (MANIFEST, MANIFEST_SHA256)]
    return {path.relative_to(directory).as_posix(): digest
            for path, digest in zip(paths, sha256_files(paths), strict=True)}


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """The manifest, and beside it its own sha256 (no file names the manifest's checksum but
    this one: a flipped ``log_seq`` would otherwise replay or drop logged writes unseen)."""
    write_json(directory / MANIFEST, manifest.model_dump(mode="json"))
    (directory / MANIFEST_SHA256).write_text(sha256_file(directory / MANIFEST) + "\n")


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    raw = read_json(path)
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if version != FORMAT_VERSION:  # asked first: another version may seal it otherwise
        raise FormatVersionError(
            f"{path} has format_version {version!r}; this library reads version "
            f"{FORMAT_VERSION}. Rebuild the index with this version.",
            path,
        )
    _check_own_sha256(directory)
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise CorruptArtifactError(f"{path} is not a valid manifest: {exc}", path) from exc


def _check_own_sha256(directory: Path) -> None:
    """The manifest against the sha256 written beside it (builds older than that have none)."""
    sidecar = directory / MANIFEST_SHA256
    if not sidecar.is_file():
        return
    if sha256_file(directory / MANIFEST) != sidecar.read_text(encoding="utf-8").strip():
        raise CorruptArtifactError(
            f"checksum mismatch in {directory / MANIFEST}: the manifest changed after the "
            "build; restore it, or publish another build", directory / MANIFEST)


def verify_build(directory: Path, manifest: Manifest, parts: bool = True) -> None:
    """Check every file named by the manifest exists and matches its sha256; with ``parts``,
    every build inside it too (a sharded build's shards, each against its own manifest)."""
    paths = [directory / relative for relative in manifest.files]
    for path in paths:
        if not path.is_file():
            raise MissingArtifactError(f"missing index file {path}; rebuild the index", path)
    for path, expected, digest in zip(paths, manifest.files.values(), sha256_files(paths),
                                      strict=True):
        if digest != expected:
            raise CorruptArtifactError(
                f"checksum mismatch in {path}: the file changed after the build; rebuild the "
                "index or restore the file",
                path,
            )
    if parts:
        for path in paths:
            if path.name == MANIFEST and path.parent != directory:
                verify_build(path.parent, read_manifest(path.parent))


def resolve_build_dir(path: Path) -> Path:
    """A build directory itself, or the build ``CURRENT`` names under an index root."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    current = path / CURRENT
    if current.is_file():
        name = read_current(path)
        if not name or name != Path(name).name or name.startswith("."):  # "../x", "/x", ".tmp-"
            raise CorruptArtifactError(
                f"{current} names {name!r}, which is not a build id of this root (a name under "
                f"{path / 'builds'}); publish a build with `retrieval publish` or roll back",
                current)
        build = path / "builds" / name
        if not (build / MANIFEST).is_file():
            raise MissingArtifactError(f"{current} names build {name!r} but {build} has no "
                                       f"{MANIFEST}: roll back (`retrieval rollback {path}`) or "
                                       f"publish another build (`retrieval builds {path}` "
                                       "lists them)", build / MANIFEST)
        return build
    raise MissingArtifactError(
        f"{path} is neither a build directory (no {MANIFEST}) nor an index root (no {CURRENT}); "
        "build one with `retrieval build --corpus PATH --out DIR`",
        path,
    )


def check_new_root(root: Path) -> None:
    """Refuse, before any work, an ``--out`` that cannot be an index root: a file, a build
    directory (nothing reads a root nested in it, and the build's files would change), or
    a root's ``builds/``."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CorpusError(f"{root} is a file; give a directory for the index root")
    inside_builds = root.name == "builds" and (root.parent / CURRENT).is_file()
    if (root / MANIFEST).is_file() or inside_builds:
        what = "the builds of an index root" if inside_builds else "a build directory"
        raise CorpusError(f"{root} is {what}, not an index root: give the root (the "
                          f"directory holding {CURRENT} and builds/)")


def current_build_dir(root: Path) -> Path | None:
    """The live build under ``root``, or None when nothing has been published."""
    try:
        return resolve_build_dir(root) if (root / CURRENT).is_file() else None
    except MissingArtifactError:
        return None


@contextmanager
def staging_dir(root: Path, build_id: str) -> Iterator[Path]:
    """A new staging directory for ``build_id``, held (an exclusive ``flock`` on its
    ``.lock`` file beside it) while the build writes it: ``collect_garbage`` removes a staging
    directory nobody holds at once (a crashed build), whatever its age."""
    staging = root / "builds" / f".tmp-{build_id}"
    staging.mkdir(parents=True, exist_ok=False)
    lock = staging.with_name(staging.name + ".lock")
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield staging
        finally:
            lock.unlink(missing_ok=True)


def _abandoned(staging: Path, now: float, stale_seconds: float) -> bool:
    """Whether no build holds ``staging`` (its lock is free), or, for a staging directory
    without a lock file, whether it is older than ``stale_seconds``."""
    lock = staging.with_name(staging.name + ".lock")
    try:
        handle = open(lock, "r+")  # noqa: SIM115 - closed below, after the probe
    except FileNotFoundError:
        return now - staging.stat().st_mtime > stale_seconds
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def place(staging: Path, root: Path, build_id: str) -> Path:
    """Move a written build into ``builds/``, leaving ``CURRENT`` alone. Its manifest's
    checksums were computed from the staged files by the writer a moment ago, so they are not
    hashed again here (every load and ``publish_build`` verifies them). The staged files are
    made durable before the move: no later flip can name a build a power loss leaves partial."""
    final = root / "builds" / build_id
    sync_tree(staging)
    os.replace(staging, final)
    fsync_path(final.parent)
    return final


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def collect_garbage(root: Path, keep: int, stale_staging_seconds: float = 3600.0) -> list[Path]:
    """Delete all but the newest ``keep`` builds and abandoned staging dirs.

    Never deleted: the live build and the build ``rollback`` would return to (from the flip
    history). A staging directory whose build still holds its lock is left alone; one nobody
    holds (a crashed build) is removed; one without a lock file (written before the lock
    existed) only once older than ``stale_staging_seconds``. Returns what was removed.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise PublishError(f"keep must be an integer of at least 1 (the live build is never "
                           f"removed), not {keep!r}")
    builds = root / "builds"
    if not builds.is_dir():
        raise MissingArtifactError(f"{root} is no index root (no {builds}); give the directory "
                                   "a build was written to", builds)
    check_history(root)  # the rollback target comes from it: a damaged one could name none
    with flipping(root):  # no publish picks a build this removes, or the reverse
        live = current_build_dir(root)
        target = rollback_target(root)
        protected = {live, builds / target if target else None}
        published = sorted((p for p in builds.iterdir()
                            if p.is_dir() and not p.name.startswith(".")),
                           key=lambda p: p.name, reverse=True)
        doomed = [p for p in published[keep:] if p not in protected]
        now = time.time()
        doomed += [p for p in builds.glob(".tmp-*")
                   if p.is_dir() and _abandoned(p, now, stale_staging_seconds)]
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
            path.with_name(path.name + ".lock").unlink(missing_ok=True)
    return doomed
