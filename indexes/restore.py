"""Restoring a snapshot (``indexes.snapshot``) into a new index root: nothing is left at the
root until every member is checked against ``SNAPSHOT.json`` and the restored root passes
what ``retrieval verify`` runs (see ``indexes.snapshot`` for the format).

A restored root keeps its source's build id and numbers its writes on from the source's seqs:
``<build>+<seq>`` would name two diverging states alike once each takes writes (a staging
copy and its production source sharing one result cache served each other's results). Each
restore therefore gives the root's log a new identity, ``wal/LOG_ID`` (``log_id``), which
the live view's id carries (``retrieval.live.view``). Snapshots never hold it (they hold only
the log's segments under ``wal/``), so a restore of a restored root gets a new one too.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import secrets
import shutil
import tarfile
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from indexes.errors import (
    CorruptArtifactError,
    FormatVersionError,
    MissingArtifactError,
)
from indexes.leftovers import sweep, temporary_path
from indexes.manifest import CURRENT, read_manifest, resolve_build_dir, verify_build
from indexes.snapshot import (
    FORMAT_VERSION,
    SNAPSHOT_JSON,
    Member,
    RestoreReport,
    RestoreTargetError,
    SnapshotCorruptError,
    SnapshotInfo,
    UnsafeMemberError,
    hash_stream,
)
from indexes.storage import fsync_path, sync_tree
from indexes.wal.log import (
    ACKED,
    check_log,
    read_all,
    segments,
    wal_dir,
    write_acked,
)

LOG_ID = "LOG_ID"  # under wal/: the identity a restore gave the root's log
_LOG_ID_TEXT = re.compile(r"[0-9a-f]{16}")

# What reading a damaged or cut-off snapshot raises: tarfile's own errors, and the
# decompressors' of a compressed one (``r:*``), which tarfile passes through (a .tar.gz cut
# short in transfer raises EOFError, a flipped byte zlib.error). Never OSError as such: a
# full disk while extracting is not a damaged snapshot. The bz2 decompressor's damaged data is
# an OSError though, told apart by ``damaged``: catch ``READ_ERRORS`` and ask it.
DAMAGED = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)
READ_ERRORS = (*DAMAGED, OSError)


def damaged(exc: BaseException) -> bool:
    """Whether ``exc``, raised reading a snapshot, says the file is damaged: one of
    ``DAMAGED``, or the bz2 decompressor's "Invalid data stream" (a .tar.bz2 damaged
    mid-stream), an OSError without an errno raised inside the bz2 module. An OSError with an
    errno (ENOSPC, EIO) is the disk's, not the snapshot's."""
    if isinstance(exc, DAMAGED):
        return True
    return isinstance(exc, OSError) and exc.errno is None and _raised_in_bz2(exc)


def _raised_in_bz2(exc: BaseException) -> bool:
    """Whether a frame of ``exc``'s traceback runs the bz2 module's code (its reader: the
    decompressor itself, in C, has no frame)."""
    frames = traceback.walk_tb(exc.__traceback__)
    return any(frame.f_globals.get("__name__") == bz2.__name__ for frame, _ in frames)


# The magic numbers of what ``r:*`` decompresses: a file starting with one is compressed,
# so a tar that cannot be read from it is more likely damaged than not a tar.
MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def _compressed_as(file: Path) -> str | None:
    """The compression ``file`` starts with the magic number of, if any."""
    try:
        with open(file, "rb") as handle:
            head = handle.read(6)
    except OSError:
        return None
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def log_id(root: Path) -> str:
    """The identity a restore gave ``root``'s log (``wal/LOG_ID``); "" for a root never
    restored (its log is the original one). Written before the restored root exists, never
    by a reader: every process serving the root reads the same one."""
    path = wal_dir(root) / LOG_ID
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return ""
    if not _LOG_ID_TEXT.fullmatch(text):  # read as "": would share the source's names
        raise CorruptArtifactError(
            f"{path} holds {text[:40]!r}, not a log id (16 hex digits): it tells this restored "
            "root's writes apart from its source's in cache keys; write a new random one "
            "(e.g. `python -c 'import secrets; print(secrets.token_hex(8))'`)", path)
    return text


def restore_snapshot(file: str | Path, root: str | Path) -> RestoreReport:
    """Restore the snapshot ``file`` into the new index root ``root`` (absent or empty)."""
    file, root = Path(file), Path(root)
    if root.resolve() == Path.cwd().resolve():  # its parent would be itself: "." has none
        raise RestoreTargetError(
            f"{root} is the current directory: restore creates the root by renaming a finished "
            "copy onto it; give a path to a new directory (e.g. ./restored)", root)
    _require_empty(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    sweep(root, "restore")  # what a killed restore to this root left
    staging = temporary_path(root, "restore")
    staging.mkdir()
    try:
        info = _extract(file, staging)
        _finish(staging, info)
        _verify_root(staging, info)
        sync_tree(staging)
        _require_empty(root)  # again: another process may have created it meanwhile
        os.replace(staging, root)  # onto an empty directory too (rename(2) allows it)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_path(root.parent)
    return RestoreReport(root, info.build_id, info.log_seq, info.last_seq, len(info.members),
                         sum(m.size for m in info.members.values()))


def _require_empty(root: Path) -> None:
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise RestoreTargetError(
            f"{root} exists and is not empty: restore writes a new index root and never "
            "overwrites one; pass a new (or empty) directory, or remove this one first", root)


def _extract(file: Path, staging: Path) -> SnapshotInfo:
    """Write every member under ``staging``, each checked against SNAPSHOT.json."""
    try:
        tar = tarfile.open(file, mode="r:*")
    except FileNotFoundError as exc:
        raise MissingArtifactError(f"no snapshot file {file}", file) from exc
    except tarfile.TarError as exc:  # its message lists every compression tried: not shown
        compression = _compressed_as(file)
        if compression is not None:  # its first block would not decompress to a tar
            raise SnapshotCorruptError(
                f"{file} is {compression} data that does not read as a snapshot: damaged (take "
                "the snapshot again), or not a snapshot", file) from exc
        raise SnapshotCorruptError(f"{file} is not a snapshot (not a tar file); take one "
                                   "with `retrieval snapshot ROOT FILE`", file) from exc
    except READ_ERRORS as exc:  # a compressed snapshot cut short or damaged in its first member
        if not damaged(exc):
            raise
        raise SnapshotCorruptError(f"{file} is damaged ({exc}); take the snapshot again",
                                   file) from exc
    with tar:
        members = _members(tar, file)
        info = _read_info(tar, next(members, None), file)
        seen: set[str] = set()
        for member in members:
            if member.isdir():
                continue
            _check_listed(member.name, info, seen, file)
            try:
                _write_member(tar, member, staging, info.members[member.name], file)
            except READ_ERRORS as exc:  # e.g. a member cut short by a truncated file
                if not damaged(exc):
                    raise
                raise SnapshotCorruptError(f"{file}: member {member.name!r} cannot be read "
                                           f"({exc}); take the snapshot again", file,
                                           member.name) from exc
    absent = sorted(set(info.members) - seen)
    if absent:
        raise SnapshotCorruptError(f"{file} lacks member {absent[0]!r} that {SNAPSHOT_JSON} "
                                   "lists: the file is truncated; take the snapshot again",
                                   file, absent[0])
    return info


def _members(tar: tarfile.TarFile, file: Path) -> Iterator[tarfile.TarInfo]:
    """The tar's members, each refused before anything is written when its name or type is
    unsafe; a damaged tar is a ``SnapshotCorruptError`` naming the member it follows."""
    last = None
    try:
        for member in tar:
            _check_safe(member, file)
            yield member
            last = member.name
    except READ_ERRORS as exc:
        if not damaged(exc):
            raise
        where = f" after member {last!r}" if last is not None else ""
        raise SnapshotCorruptError(f"{file} is damaged{where} ({exc}); take the snapshot "
                                   "again", file, last) from exc


def _check_safe(member: tarfile.TarInfo, file: Path) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts or "\\" in member.name or not name.parts:
        raise UnsafeMemberError(f"{file} holds member {member.name!r}, which would be written "
                                "outside the restored root; refusing the file (it is not a "
                                "snapshot this library wrote)", file, member.name)
    if not (member.isfile() or member.isdir()):
        raise UnsafeMemberError(f"{file} holds member {member.name!r}, which is not a regular "
                                "file (a link or device); refusing the file", file, member.name)


def _read_info(tar: tarfile.TarFile, first: tarfile.TarInfo | None, file: Path) -> SnapshotInfo:
    source = tar.extractfile(first) if first is not None and first.name == SNAPSHOT_JSON \
        else None
    if source is None:
        raise SnapshotCorruptError(f"{file} does not start with {SNAPSHOT_JSON}: it is not a "
                                   "snapshot; take one with `retrieval snapshot ROOT FILE`",
                                   file, SNAPSHOT_JSON)
    try:
        raw = source.read()
    except READ_ERRORS as exc:  # the file cut short inside it
        if not damaged(exc):
            raise
        raise SnapshotCorruptError(f"{file} is damaged ({exc}); take the snapshot again",
                                   file, SNAPSHOT_JSON) from exc
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotCorruptError(f"{file}: {SNAPSHOT_JSON} is not JSON: {exc}", file,
                                   SNAPSHOT_JSON) from exc
    version = body.get("format_version") if isinstance(body, dict) else None
    if version != FORMAT_VERSION:  # before the schema: another version may have another one
        raise FormatVersionError(f"{file} is snapshot format version {version!r}; this library "
                                 f"restores version {FORMAT_VERSION}: restore it with the "
                                 "version that took it", file)
    try:
        return SnapshotInfo.model_validate(body)
    except ValidationError as exc:
        raise SnapshotCorruptError(f"{file}: {SNAPSHOT_JSON} is not valid: {exc}", file,
                                   SNAPSHOT_JSON) from exc


def _check_listed(name: str, info: SnapshotInfo, seen: set[str], file: Path) -> None:
    if name not in info.members:
        raise SnapshotCorruptError(f"{file} holds member {name!r}, which {SNAPSHOT_JSON} does "
                                   "not list: refusing an altered snapshot", file, name)
    if name in seen:
        raise SnapshotCorruptError(f"{file} holds member {name!r} twice: refusing an altered "
                                   "snapshot", file, name)
    seen.add(name)


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path,
                  expected: Member, file: Path) -> None:
    """Copy one member under ``staging`` (hashing on the way; ``sync_tree`` makes the whole
    root durable before it moves into place); its size and sha256 must be the listed ones."""
    target = staging / member.name
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None  # a regular file (checked by _check_safe)
    with open(target, "wb") as out:
        got = hash_stream(source, out)
    if got != expected:
        raise SnapshotCorruptError(
            f"{file}: member {member.name!r} does not match {SNAPSHOT_JSON} (size {got.size}, "
            f"listed {expected.size}; sha256 {got.sha256[:12]}..., listed "
            f"{expected.sha256[:12]}...): the file was damaged after it was taken; restore "
            "another snapshot", file, member.name)


def _finish(staging: Path, info: SnapshotInfo) -> None:
    """``CURRENT`` naming the build, a new ``wal/LOG_ID`` (also without a log yet: the writes
    to come must not share the source's names), and ``wal/ACKED`` at the end of the newest
    segment (made durable with the rest of the root by ``sync_tree``)."""
    (staging / CURRENT).write_text(f"{info.build_id}\n", encoding="utf-8")
    wal_dir(staging).mkdir(exist_ok=True)
    (wal_dir(staging) / LOG_ID).write_text(f"{secrets.token_hex(8)}\n", encoding="ascii")
    listed = segments(staging)
    if not listed:
        return
    first, path = listed[-1]
    fd = os.open(wal_dir(staging) / ACKED, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_acked(fd, first, path.stat().st_size)
    finally:
        os.close(fd)


def _verify_root(staging: Path, info: SnapshotInfo) -> None:
    """What ``retrieval verify`` checks (the build's checksums, the whole log), and that the
    restored root holds the build and records ``SNAPSHOT.json`` says."""
    build = resolve_build_dir(staging)
    manifest = read_manifest(build)
    verify_build(build, manifest)
    check_log(staging)
    records = read_all(staging, after=manifest.log_seq)
    last = records[-1].seq if records else manifest.log_seq
    if (manifest.build_id, manifest.log_seq, last) != (info.build_id, info.log_seq,
                                                       info.last_seq):
        raise SnapshotCorruptError(
            f"the restored root holds build {manifest.build_id} (log_seq {manifest.log_seq}) "
            f"and records up to seq {last}, but {SNAPSHOT_JSON} says build {info.build_id} "
            f"(log_seq {info.log_seq}) up to seq {info.last_seq}; the snapshot is "
            "inconsistent, take it again", staging, SNAPSHOT_JSON)
