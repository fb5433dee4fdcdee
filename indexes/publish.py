"""Publishing primitives over an index root: make a staged build live, roll back, list builds.

No checks of a build's *content* here (that is the serving layer's publish gate,
``retrieval.publishing``, which needs searches): these functions verify checksums, flip
``CURRENT`` and record the flip in the history (``indexes.history``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from indexes.docstore import DocStore
from indexes.errors import ArtifactError, CorruptArtifactError, MissingArtifactError, PublishError
from indexes.going_live import go_live
from indexes.history import (
    FlipRecord,
    How,
    check_history,
    ever_live,
    flips,
    live_build_id,
    rollback_target,
)
from indexes.manifest import MANIFEST, Manifest, read_manifest, verify_build
from indexes.passages import PassageMap
from indexes.storage import load_array, tree_size
from indexes.vectors import content_hashes
from indexes.wal.split import whole_documents


class UnknownBuildError(PublishError):
    """The build id names no build under the index root."""


class NoRollbackTargetError(PublishError):
    """The flip history does not say which build was live before the live one."""


Status = Literal["live", "rollback target", "previously live", "staged"]


@dataclass(frozen=True)
class BuildInfo:
    """One row of ``retrieval builds``."""

    build_id: str
    created_at: str
    n_docs: int
    encoder_id: str
    size_bytes: int
    status: Status


def is_build_name(build_id: str) -> bool:
    """One visible name (``..``, ``.tmp-*`` and paths are not)."""
    return (isinstance(build_id, str) and build_id == Path(build_id).name != ""
            and not build_id.startswith(".") and "\0" not in build_id)


def build_dir(root: Path, build_id: str) -> Path:
    """The directory of a placed build; ``UnknownBuildError`` listing the ones there are. A
    build id is one name under ``builds/``: a path (absolute, with a separator or ``..``) or
    a hidden staging name is none, so no caller (the console's sides, the gate) opens a
    directory outside the root."""
    directory = Path(root) / "builds" / build_id
    if not is_build_name(build_id) or not (directory / MANIFEST).is_file():
        known = ", ".join(b.build_id for b in list_builds(root)) or "none"
        raise UnknownBuildError(f"no build {build_id!r} under {root}/builds (builds there: "
                                f"{known}); see `retrieval builds {root}`")
    return directory


def publish_build(root: Path, build_id: str, how: How = "plain", note: str = "",
                  replaces: str | None = None) -> FlipRecord:
    """Verify every checksum of a placed build, then flip ``CURRENT`` to it and record how;
    ``LogGapError`` when the log no longer holds writes it lacks, ``LiveBuildChangedError``
    when ``replaces`` (the live build it was checked against) is live no more
    (``indexes.going_live``)."""
    directory = build_dir(root, build_id)
    verify_build(directory, read_manifest(directory))
    return go_live(Path(root), build_id, how, note, replaces=replaces)[0]


def rollback(root: Path, to: str | None = None) -> FlipRecord:
    """Flip back to the build that was live before the live one (or to ``to``).

    Rolling back twice returns to where the first rollback started: the build live before a
    rollback is, after it, the previously live one.
    """
    root = check_root(Path(root))
    live = live_build_id(root)
    if to is None:  # the target comes from the history: as gc, not from a damaged one
        try:
            check_history(root)
        except CorruptArtifactError as exc:
            raise NoRollbackTargetError(f"{exc}; or pass --to BUILD_ID (`retrieval builds "
                                        f"{root}` lists them)") from exc
    target = to or rollback_target(root)
    if target is None:
        raise NoRollbackTargetError(
            f"the flip history in {root} does not name a build that was live before "
            f"{live!r}; pick one from `retrieval builds {root}` and pass --to BUILD_ID")
    if target == live:
        raise PublishError(f"build {target!r} is already live under {root}; nothing to roll back")
    if target not in ever_live(root):
        raise PublishError(f"build {target!r} was never live under {root}, so there is nothing "
                           f"to roll back to: publish it (`retrieval publish {root} {target}`, "
                           "through the gate) instead")
    # From the build it was chosen against: a build published while the target's checksums
    # were read (seconds at scale) was silently undone, to a target it never had.
    return publish_build(root, target, "rollback", note=f"from {live}", replaces=live)


def check_root(root: Path) -> Path:
    """``root`` when it is an index root (a directory holding ``builds/``), as ``gc`` checks
    it: a build directory given instead listed no builds, and rollback said no build "was live
    before None"."""
    if not Path(root).is_dir():
        raise MissingArtifactError(f"no index root at {root}: give the directory a build was "
                                   "written to", root)
    if not (Path(root) / "builds").is_dir():
        what = ("a build directory, not an index root" if (Path(root) / MANIFEST).is_file()
                else "no index root")
        raise MissingArtifactError(f"{root} is {what} (no builds/ in it): give the directory "
                                   "a build was written to, which holds CURRENT and builds/",
                                   Path(root) / "builds")
    return root


def list_builds(root: Path) -> list[BuildInfo]:
    """Every placed build, newest first, with its status from ``CURRENT`` and the history."""
    check_root(root)
    builds = Path(root) / "builds"
    live, target, was_live = live_build_id(root), rollback_target(root), ever_live(root)
    rows = []
    for directory in sorted(builds.iterdir(), key=lambda p: p.name, reverse=True):
        if directory.name.startswith(".") or not (directory / MANIFEST).is_file():
            continue
        manifest = read_manifest(directory)
        rows.append(BuildInfo(
            build_id=manifest.build_id, created_at=manifest.created_at, n_docs=manifest.n_docs,
            encoder_id=manifest.encoder.encoder_id, size_bytes=tree_size(directory),
            status=_status(manifest.build_id, live, target, was_live)))
    return rows


def _status(build_id: str, live: str | None, target: str | None, was_live: set[str]) -> Status:
    if build_id == live:
        return "live"
    if build_id == target:
        return "rollback target"
    return "previously live" if build_id in was_live else "staged"


def history(root: Path) -> list[FlipRecord]:
    """Every flip of ``CURRENT`` under ``root``, oldest first (``indexes.history.flips``:
    not a record whose process was killed before it replaced ``CURRENT``)."""
    return flips(Path(root))


@dataclass(frozen=True)
class BuildContents:
    """What a comparison of two builds reads: manifest, external ids and content hashes."""

    manifest: Manifest
    doc_ids: list[str]
    content_hashes: np.ndarray  # (n_docs,) S16, row-aligned with doc_ids


def read_contents(directory: Path) -> BuildContents:
    """Manifest, ids and content hashes of a build (typed errors name a missing file); of a
    passage build, its documents' (each reassembled and hashed as a build of whole documents
    hashes it: a hash of its passages' hashes made a corpus cut into other passages, or built
    whole, count as every document changed)."""
    manifest = read_manifest(directory)
    try:
        store = DocStore.load(directory / "docstore", mmap=True, prefault=False)
        if manifest.passages is not None:
            documents = whole_documents(store, PassageMap.load(directory / "passages"),
                                        range(len(store)))
            return BuildContents(manifest, [d.id for d in documents],
                                 content_hashes([d.content for d in documents]))
        ids = store.all_ids()
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read the documents of {directory}: {exc}",
                            directory / "docstore") from exc
    hashes = np.asarray(load_array(directory / "vectors" / "content_hashes.npy"))
    return BuildContents(manifest, ids, hashes)
