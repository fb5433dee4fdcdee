"""Snapshots of an index root: one file holding the live build, the log since it and the flip
history, taken while writes go on, restored into a new root verified by checksums.

The file is an uncompressed tar::

    SNAPSHOT.json            first: format version, build id, its log_seq, the last seq
                             included, created_at, and sha256 + size of every other member
    HISTORY.jsonl            the flip history (whole lines)
    builds/<build_id>/...    the live build, all of it (shards included)
    wal/<first seq>.wal      the segments holding records after the build's log_seq, each
                             cut after its last whole record (never ACKED nor the lock)
    relevance.json, ...      the root's own files beside them (its calibration, its distilled
                             query encoder), hidden ones (locks, temporaries) left out

Uncompressed: most of a build is float32 vectors, which gzip barely shrinks, and compressing
would lengthen a snapshot (so its chance of racing a compaction) and make restore CPU-bound;
compress the file to ship it (restore reads gzip too, ``r:*``).

Consistent while writes go on, without the writer's lock: ``CURRENT`` is read first, then the
history (a flip appends to it before replacing ``CURRENT``), the build's files are hashed,
then each segment (``ACKED`` before its bytes, as readers do), cut after its last whole
record: later records are not included, and the snapshot's sequence is the last one it
holds. A segment retired meanwhile or ``CURRENT`` naming another build at the end means a
publish or compaction ran: start over (``ATTEMPTS`` times, then ``SnapshotConflictError``).

Nothing is held between the two passes but names, sizes and hashes (``SNAPSHOT.json`` comes
first, so every member is hashed before the tar is written): each file is opened once to hash
it and once more to copy it, hashed again on the way, so a sharded build's thousands of files
never need as many open descriptors, and a log of any length is never in memory (a segment
is read a record at a time, and copied up to its cut). A file gone or changed by the second
pass (a build collected, a segment retired, a calibration replaced) also means start over.

Restore leaves nothing at ``ROOT`` until all is checked: it extracts regular files (no absolute
or ``..`` names) into a sibling temporary directory, checks each against ``SNAPSHOT.json``,
writes ``CURRENT`` and ``wal/ACKED``, runs what ``retrieval verify`` runs, then renames it to
``ROOT``. ``ACKED`` is written (absent would read as 0, also safe) because every restored
record was whole and verified: later damage inside them then reads as corruption, not as a
torn tail the next writer would cut off. The history may name builds the snapshot does not
hold: a rollback there says so (``UnknownBuildError``).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Protocol

from pydantic import BaseModel, ConfigDict

from indexes.errors import (
    ArtifactError,
    CorruptArtifactError,
    MissingArtifactError,
)
from indexes.history import HISTORY, live_build_id
from indexes.leftovers import sweep, temporary_path
from indexes.manifest import CURRENT, MANIFEST, Manifest, read_manifest, resolve_build_dir
from indexes.storage import fsync_path
from indexes.wal.log import (
    HEADER,
    LogCorruptionError,
    acked_end,
    scan,
    segments,
)

FORMAT_VERSION = 1
SNAPSHOT_JSON = "SNAPSHOT.json"
ATTEMPTS = 5
CHUNK = 1 << 20


class SnapshotCorruptError(CorruptArtifactError):
    """A snapshot file is not whole: not a tar, no valid ``SNAPSHOT.json``, or a member that is
    missing, unlisted, or whose size or sha256 differs (``member`` names it)."""

    def __init__(self, message: str, path: Path | str | None = None,
                 member: str | None = None) -> None:
        super().__init__(message, path)
        self.member = member


class UnsafeMemberError(SnapshotCorruptError):
    """A snapshot member would be written outside the restored root (an absolute or ``..``
    name) or is not a regular file (a link, a device)."""


class RestoreTargetError(ArtifactError):
    """The restore target exists and is not empty: restore never overwrites an index root."""


class SnapshotConflictError(ArtifactError):
    """The index root changed under every attempt (publishes or compactions kept retiring
    what a snapshot was reading)."""


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str
    size: int


class SnapshotInfo(BaseModel):
    """``SNAPSHOT.json``."""

    model_config = ConfigDict(extra="forbid")

    format_version: int
    build_id: str
    log_seq: int  # records up to here are folded into the build
    last_seq: int  # the newest record included (log_seq when the log adds nothing)
    created_at: str
    members: dict[str, Member]  # every other member of the tar, by name


@dataclass(frozen=True)
class SnapshotReport:
    file: Path
    build_id: str
    log_seq: int
    last_seq: int
    files: int  # members besides SNAPSHOT.json
    bytes: int  # their total size
    attempts: int


@dataclass(frozen=True)
class RestoreReport:
    root: Path
    build_id: str
    log_seq: int
    last_seq: int
    files: int
    bytes: int


@dataclass
class _View:
    """One consistent read of a root: each member's sha256 and size, and where its bytes are:
    the history's in memory, every other's in its file (``size`` bytes of it), read again
    while the tar is written."""

    manifest: Manifest
    last_seq: int
    sources: dict[str, bytes | Path] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)


class _Changed(Exception):
    """The root changed while it was read: start over."""


# -- taking a snapshot ---------------------------------------------------------------------


def take_snapshot(root: str | Path, file: str | Path) -> SnapshotReport:
    """Write a snapshot of the index root ``root`` to ``file`` (replaced atomically)."""
    root, file = Path(root), Path(file)
    if not (root / CURRENT).is_file():
        raise MissingArtifactError(f"{root} is not an index root (no {CURRENT}): snapshot an "
                                   "index root that has a published build", root / CURRENT)
    if file.is_dir():
        raise ArtifactError(f"{file} is a directory: name the snapshot file to write, "
                            f"e.g. {file / 'snapshot.tar'}", file)
    check_snapshot_file(root, file)
    for attempt in range(1, ATTEMPTS + 1):
        try:  # the tar's writing too: it reads every file again
            view = _capture(root)
            _write_tar(view, file)
        except _Changed:
            continue
        return SnapshotReport(file, view.manifest.build_id, view.manifest.log_seq,
                              view.last_seq, len(view.members),
                              sum(m.size for m in view.members.values()), attempts=attempt)
    raise SnapshotConflictError(
        f"{root} changed under each of {ATTEMPTS} snapshot attempts (a publish or compaction "
        "retired what was being read each time); retry when it is quieter, e.g. not during "
        "`retrieval compact`", root)


def check_snapshot_file(root: Path, file: Path) -> None:
    """Refuse a snapshot file inside the root (written over ``CURRENT`` it left the root
    unloadable; elsewhere there each snapshot held the ones before) and one that would
    replace a file that is not a snapshot (run as root, ``/etc/passwd`` was replaced; a
    device or FIFO, ``/dev/null`` too: its size 0 read as mktemp's empty file)."""
    if file.resolve().is_relative_to(root.resolve()):
        raise ArtifactError(f"{file} is inside the index root {root}: write the snapshot "
                            "elsewhere (a snapshot holds the whole root)", file)
    try:
        status = file.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(status.st_mode):
        raise ArtifactError(f"{file} exists and is not a regular file (a device, a FIFO or "
                            "a socket): it is not replaced; name a new file or a snapshot "
                            "to replace", file)
    if status.st_size and not _is_snapshot(file):  # mktemp's: empty
        raise ArtifactError(f"{file} exists and is not a snapshot: it is not replaced; remove "
                            "it or name another file", file)


def _is_snapshot(file: Path) -> bool:
    """Whether ``file`` is a tar whose first member is ``SNAPSHOT.json`` (as written here)."""
    try:
        with tarfile.open(file, mode="r:") as tar:
            first = tar.next()
    except (OSError, tarfile.TarError):
        return False
    return first is not None and first.name == SNAPSHOT_JSON


def _capture(root: Path) -> _View:
    """Hash the live build, history, log and the root's own files; ``_Changed`` when the root
    moved meanwhile. An error with ``CURRENT`` unchanged is real (a damaged build or log) and
    is raised."""
    name = live_build_id(root)
    try:
        build = resolve_build_dir(root)
        history = _history_bytes(root)
        manifest = read_manifest(build)
        view = _View(manifest, manifest.log_seq)
        if history is not None:
            _add_blob(view, HISTORY, history)
        _hash_build(build, f"builds/{build.name}", view)
        _read_log(root, view)
        _add_beside(root, view)
    except (FileNotFoundError, ArtifactError) as exc:
        if live_build_id(root) != name:
            raise _Changed from exc
        if isinstance(exc, FileNotFoundError):
            raise MissingArtifactError(f"{exc.filename} vanished while {root} was not "
                                       "changing; run `retrieval verify` on it", root) from exc
        raise
    if live_build_id(root) != name or build.name != name:
        raise _Changed
    return view


def _add_beside(root: Path, view: _View) -> None:
    """The root's own files beside its builds and log (its relevance calibration, its
    distilled query encoder): a restored root ranks and encodes as this one."""
    for path in sorted(_beside(root)):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):  # locks, temporaries
            continue
        try:
            view.members[relative.as_posix()] = _hash_file(path)
        except FileNotFoundError:
            continue  # removed meanwhile (a calibration replaced): not the root's any more
        view.sources[relative.as_posix()] = path


def _beside(root: Path) -> list[Path]:
    """The files under ``root`` outside its builds and log, which are never walked: a
    build placed or collected meanwhile would vanish under the walk."""
    found: list[Path] = []
    for entry in root.iterdir():
        if entry.name in ("builds", "wal", CURRENT, HISTORY) or entry.name.startswith("."):
            continue
        if entry.is_dir():
            found += [p for p in entry.rglob("*") if p.is_file()]
        elif entry.is_file():
            found.append(entry)
    return found


def _history_bytes(root: Path) -> bytes | None:
    """HISTORY.jsonl up to its last whole line (a flip may be appending), None when absent."""
    try:
        data = (root / HISTORY).read_bytes()
    except FileNotFoundError:
        return None
    return data[:data.rfind(b"\n") + 1]


def _add_blob(view: _View, name: str, data: bytes) -> None:
    view.sources[name] = data
    view.members[name] = Member(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def _hash_file(path: Path) -> Member:
    with open(path, "rb") as handle:
        return hash_stream(handle)


def _hash_build(build: Path, prefix: str, view: _View) -> None:
    """Hash every file of the build, one open at a time (a sharded build has thousands, more
    than a process may hold open); the hashes must match its manifests'."""
    files = _expected_files(build, view.manifest)
    found = set()
    for path in sorted(p for p in build.rglob("*") if p.is_file()):
        relative = path.relative_to(build).as_posix()
        member = _hash_file(path)
        expected = files.get(relative)
        if expected is not None and expected != member.sha256:
            raise CorruptArtifactError(f"checksum mismatch in {path}: the live build is damaged "
                                       "and is not snapshotted; run `retrieval verify` and "
                                       "republish or restore it", path)
        view.sources[f"{prefix}/{relative}"] = path
        view.members[f"{prefix}/{relative}"] = member
        found.add(relative)
    missing = sorted(set(files) - found)
    if missing:
        raise MissingArtifactError(f"{build / missing[0]} is named by the manifest but absent; "
                                   "run `retrieval verify` and rebuild", build / missing[0])


def _expected_files(build: Path, manifest: Manifest) -> dict[str, str]:
    """sha256 by path under ``build`` of every file its manifest names and, for a sharded
    build, every file each shard's manifest names: the top manifest names only shards.json
    and the shard manifests, so a damaged shard file was snapshotted and refused at restore."""
    files = dict(manifest.files)
    for relative in manifest.files:
        inner = build / relative
        if inner.name != MANIFEST or inner.parent == build or not inner.is_file():
            continue  # not a part's manifest, or absent: named missing by the caller
        shard = inner.parent.relative_to(build).as_posix()
        files.update({f"{shard}/{name}": sha for name, sha
                      in _expected_files(inner.parent, read_manifest(inner.parent)).items()})
    return files


def hash_stream(source: IO[bytes], out: IO[bytes] | None = None) -> Member:
    """sha256 and size of what ``source`` holds (copied to ``out`` on the way, when given)."""
    digest, size = hashlib.sha256(), 0
    for chunk in iter(lambda: source.read(CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return Member(sha256=digest.hexdigest(), size=size)


def _read_log(root: Path, view: _View) -> None:
    """The segments holding records after the build's log_seq, each cut after its last whole
    record; the records after log_seq must continue it without a gap."""
    listed = segments(root)
    for i, (_, path) in enumerate(listed):
        newer = listed[i + 1][0] if i + 1 < len(listed) else None
        if newer is not None and newer - 1 <= view.manifest.log_seq:
            continue  # every record in it is folded into the build (retired soon)
        member, seqs = _whole_records(path, newest=newer is None)
        for seq in (s for s in seqs if s > view.manifest.log_seq):
            if seq != view.last_seq + 1:
                raise CorruptArtifactError(
                    f"{path}: seq {seq} follows seq {view.last_seq}, but the log after the live "
                    f"build's log_seq {view.manifest.log_seq} must have no gap (a rollback past a "
                    "compaction that retired them?); publish a build that folds the log first",
                    path)
            view.last_seq = seq
        view.sources[f"wal/{path.name}"] = path
        view.members[f"wal/{path.name}"] = member


def _whole_records(path: Path, newest: bool) -> tuple[Member, list[int]]:
    """sha256 and length of ``path`` up to its last whole record, and the seqs of its records.
    Read a record at a time (a segment holds every write since the last compaction: read
    whole, a snapshot held the log in memory), then what follows the last whole one at once
    (a tail being written, or damage), scanned as readers scan it."""
    acked = acked_end(path)  # before the data, as readers do: what it covers was whole
    digest, seqs, end = hashlib.sha256(), [], 0
    last = int(path.stem) - 1  # a segment's records run on from the seq in its name
    with open(path, "rb") as handle:
        while True:
            record = _next_record(handle)
            seq = _whole_record(record, path, end, acked, last)
            if seq is None:
                break
            _check_follows(path, seq, last, end)
            digest.update(record)
            seqs.append(last := seq)
            end += len(record)
        tail = record + handle.read()
    consumed = 0
    for seq, stop, _ in scan(tail, path=path, after=last, origin=end, acked=acked):
        _check_follows(path, seq, last, end + consumed)
        seqs.append(last := seq)
        consumed = stop
    if not newest and consumed < len(tail):
        raise LogCorruptionError(f"{path}: the record at byte {end + consumed} is damaged and "
                                 "a newer segment follows; restore the log from a backup", path)
    digest.update(tail[:consumed])
    return Member(sha256=digest.hexdigest(), size=end + consumed), seqs


def _next_record(handle: IO[bytes]) -> bytes:
    """The bytes of the record starting at ``handle``'s position (fewer at the file's end)."""
    head = handle.read(HEADER.size)
    if len(head) < HEADER.size:
        return head
    return head + handle.read(HEADER.unpack(head)[0])


def _whole_record(record: bytes, path: Path, at: int, acked: int, last: int) -> int | None:
    """The seq of ``record`` (which starts at byte ``at``) when it is whole and intact; None
    else (what follows decides whether it is a tail or damage)."""
    if len(record) < HEADER.size:
        return None
    found = next(scan(record, path=path, after=last, origin=at, acked=acked), None)
    return found[0] if found is not None else None


def _check_follows(path: Path, seq: int, last: int, at: int) -> None:
    if seq != last + 1:
        raise LogCorruptionError(f"{path}: the record at byte {at} is seq {seq}, not "
                                 f"{last + 1}: the log has lost (or repeated) writes; restore "
                                 "it from a backup", path)


def _write_tar(view: _View, file: Path) -> None:
    """SNAPSHOT.json first, then the members, into a temporary file renamed to ``file``."""
    info = SnapshotInfo(format_version=FORMAT_VERSION, build_id=view.manifest.build_id,
                        log_seq=view.manifest.log_seq, last_seq=view.last_seq,
                        created_at=datetime.now(UTC).isoformat(), members=view.members)
    file.parent.mkdir(parents=True, exist_ok=True)
    sweep(file, "tmp")  # what a killed snapshot to this file left
    tmp = temporary_path(file, "tmp")
    try:
        with open(tmp, "wb") as out:
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                head = info.model_dump_json(indent=1).encode()
                _add(tar, SNAPSHOT_JSON, io.BytesIO(head), len(head))
                for name, source in view.sources.items():
                    if isinstance(source, bytes):
                        _add(tar, name, io.BytesIO(source), len(source))
                    else:
                        _add_file(tar, name, source, view.members[name])
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(file.parent)


def _add_file(tar: tarfile.TarFile, name: str, path: Path, hashed: Member) -> None:
    """The first ``hashed.size`` bytes of ``path``, hashed again on their way into the tar:
    the file gone or its bytes changed since they were hashed means the root moved on (a
    build collected, a segment retired, a calibration replaced): ``_Changed``."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError as exc:
        raise _Changed from exc
    with handle:
        reader = _HashingReader(handle, hashed.size)
        _add(tar, name, reader, hashed.size)
    if reader.member() != hashed:
        raise _Changed


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _HashingReader:
    """At most ``limit`` bytes of ``source``, hashed as they are read; ``_Changed`` when it
    ends sooner (the file was cut since it was hashed)."""

    def __init__(self, source: IO[bytes], limit: int) -> None:
        self.source, self.left = source, limit
        self.digest, self.size = hashlib.sha256(), 0

    def read(self, size: int = -1, /) -> bytes:
        want = self.left if size < 0 else min(size, self.left)
        chunk = self.source.read(want)
        if len(chunk) < want:
            raise _Changed
        self.digest.update(chunk)
        self.left -= len(chunk)
        self.size += len(chunk)
        return chunk

    def member(self) -> Member:
        return Member(sha256=self.digest.hexdigest(), size=self.size)


def _add(tar: tarfile.TarFile, name: str, data: _Readable, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = int(datetime.now(UTC).timestamp())
    tar.addfile(info, data)


# -- restoring -------------------------------------------------------------------------------
