"""The flip history of an index root: every change of ``CURRENT``, append-only.

``<root>/HISTORY.jsonl`` holds one JSON object per flip: the build made live, when, how
(``gate`` passed, ``forced`` past a refusing gate, ``rollback``, or ``plain`` publish without a
gate) and which build was live before. "Previous" therefore means previously *live*, not
previously built, and rollback and garbage collection read it from here.

A flip appends its record first and replaces ``CURRENT`` second, so a serving process that sees
the new ``CURRENT`` always finds the record saying who published it. A crash between the two
leaves a record for a flip that did not happen; ``CURRENT`` stays the truth, and readers match
records against it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from indexes.errors import CorruptArtifactError
from indexes.storage import fsync_write

log = logging.getLogger(__name__)

HISTORY = "HISTORY.jsonl"
LOCK = ".flip.lock"
CURRENT_FILE = "CURRENT"  # same name as indexes.manifest.CURRENT (kept here to avoid a cycle)

How = Literal["gate", "forced", "rollback", "plain"]


class FlipRecord(BaseModel):
    """One change of ``CURRENT``."""

    model_config = ConfigDict(extra="forbid")

    build_id: str
    at: str
    how: How
    previous: str | None = None
    note: str = ""


def live_build_id(root: Path) -> str | None:
    """The build ``CURRENT`` names, or None before the first publish."""
    try:
        return read_current(Path(root)) or None
    except FileNotFoundError:
        return None


def read_current(root: Path) -> str:
    """What ``CURRENT`` under ``root`` says (FileNotFoundError when absent);
    ``CorruptArtifactError`` when it is no text (a file copied over it)."""
    current = root / CURRENT_FILE
    try:
        return current.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as exc:
        raise CorruptArtifactError(
            f"{current} is not the name of a build ({exc}): something else was written over "
            "it; roll back (`retrieval rollback ROOT --to BUILD_ID`, `retrieval builds ROOT` "
            "lists them)", current) from exc


def read_history(root: Path) -> list[FlipRecord]:
    """Every flip record, oldest first. A torn last line (a crash mid-append) is skipped, and
    so is a damaged one elsewhere (logged; ``check_history`` names it)."""
    return _read(Path(root))[0]


def check_history(root: Path) -> None:
    """``CorruptArtifactError`` naming a damaged line that is not a torn last one (the flip
    history decides the rollback target, which gc keeps and the log keeps writes for)."""
    damaged = _read(Path(root))[1]
    if damaged:
        path = Path(root) / HISTORY
        raise CorruptArtifactError(
            f"{path} line {damaged[0]} is damaged (not a torn last line): the rollback target "
            "cannot be trusted. Fix the line from a backup, or remove it if the flip it records "
            "is known", path)


def _read(root: Path) -> tuple[list[FlipRecord], list[int]]:
    """(the readable records, the numbers of damaged lines other than a torn last one)."""
    path = root / HISTORY
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    lines = text.splitlines()
    records, damaged = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(FlipRecord.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            log.warning("%s line %d unreadable, skipped: %s", path, number, exc)
            if number < len(lines) or text.endswith("\n"):  # whole, so not torn mid-append
                damaged.append(number)
    return records, damaged


def append_record(root: Path, record: FlipRecord) -> None:
    """Append one line and fsync it; the caller holds ``flipping(root)``, so no other append
    runs meanwhile. A torn last line (an append cut short: a crash, a full disk) is cut off
    first, so this record is a line of its own rather than the end of a damaged one; a last
    line that reads whole without its newline (a hand edit) gets the newline instead."""
    line = (record.model_dump_json() + "\n").encode("utf-8")
    fd = os.open(Path(root) / HISTORY, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _cut_torn_line(fd)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_line(fd: int) -> None:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    at = size
    while at > 0:  # back to the end of the last whole line
        step = min(4096, at)
        at -= step
        newline = os.pread(fd, step, at).rfind(b"\n")
        if newline != -1:
            at += newline + 1
            break
    try:
        FlipRecord.model_validate_json(os.pread(fd, size - at, at))
    except ValidationError:
        log.warning("%s: a torn last line of %d bytes cut off before appending", HISTORY,
                    size - at)
        os.ftruncate(fd, at)
    else:
        os.write(fd, b"\n")


@contextmanager
def flipping(root: Path) -> Iterator[None]:
    """An exclusive lock on ``<root>/.flip.lock``: flips from several processes take turns, so
    each record's ``previous`` is the build its own flip replaced, and what a flip decides from
    the root's state (``indexes.going_live``) sees no other flip meanwhile."""
    with open(Path(root) / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def flip(root: Path, build_id: str, how: How, note: str = "") -> FlipRecord:
    """Record the flip, then replace ``CURRENT`` atomically (temp file, fsync, rename). The
    caller holds ``flipping(root)``."""
    root = Path(root)
    record = FlipRecord(build_id=build_id, at=datetime.now(UTC).isoformat(), how=how,
                        previous=live_build_id(root), note=note)
    append_record(root, record)
    # Flips take turns under the lock, so a temp file of CURRENT here is a killed flip's.
    for leftover in root.glob(f".{CURRENT_FILE}.tmp-*"):
        leftover.unlink(missing_ok=True)
    fsync_write(root / CURRENT_FILE, f"{build_id}\n".encode())
    return record


def flips(root: Path) -> list[FlipRecord]:
    """The records of flips that happened, oldest first: a record is appended before
    ``CURRENT`` is replaced, so one whose process was killed in between names a build that
    never served. A record did not flip when what was live after it (the next record's
    ``previous``, or ``CURRENT`` after the last) is still what was live before it; taken
    for a flip, it listed a build as once live, made it a target rollback takes without the
    gate, and skipped the older-export check. (A damaged record in between proves nothing.)"""
    records = read_history(root)
    then = [after.previous for after in records[1:]] + [live_build_id(root)]
    return [record for record, live in zip(records, then, strict=False)
            if not live == record.previous != record.build_id]


def latest_flip_to(root: Path, build_id: str) -> FlipRecord | None:
    """The newest record that made ``build_id`` live (who published it, and when)."""
    for record in reversed(flips(root)):
        if record.build_id == build_id:
            return record
    return None


def publication_of(root: Path | None, build_id: str) -> dict[str, str | None]:
    """``{"how", "published_at"}`` of the flip that made ``build_id`` live, for reload events.

    Never raises: a root without history (builds older than the history file) says ``None``.
    """
    if root is None:
        return {"how": None, "published_at": None}
    try:
        record = latest_flip_to(root, build_id)
    except OSError:
        record = None
    return {"how": record.how if record else None,
            "published_at": record.at if record else None}


def rollback_target(root: Path) -> str | None:
    """The build that was live before the live one became live (None if unknown)."""
    live = live_build_id(root)
    if live is None:
        return None
    for record in reversed(flips(root)):  # a flip onto itself names no other build
        if record.build_id == live and record.previous not in (None, live):
            return record.previous
    return None


def ever_live(root: Path) -> set[str]:
    """Ids of every build that was made live at some point."""
    return {record.build_id for record in flips(root)}
