"""The log's lock, and the two things a build does to the log: seal it where the build
starts (``seal``) and delete what the build folded once it is live (``retire``).

A build that reads a corpus export at sequence number S (the last acknowledged write when
it started) seals the newest segment there: writes acknowledged after S go to a new segment,
so once the build is live, retiring the segments of records <= S deletes whole files and
leaves every later write in place for the new build to apply.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from indexes.errors import WriterLockedError
from indexes.storage import fsync_path
from indexes.wal.log import ACKED, repair_tail, segment_name, segments, wal_dir, write_acked

LOCK = ".writer.lock"
LOCK_POLL_SECONDS = 0.001
PINS = "pins"  # a folder of the log's: one empty file per running build (``pin``)
PIN_MAX_AGE_SECONDS = 7 * 24 * 3600.0


def take_lock(handle: IO[str], timeout_seconds: float, root: Path) -> None:
    """The root's exclusive append lock on ``handle`` (its lock file), or ``WriterLockedError``
    after ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise WriterLockedError(
                    f"{wal_dir(root) / LOCK} stayed locked for {timeout_seconds:g} s: another "
                    "writer is appending or stuck; one writer per index root at a time "
                    "(retry, or raise lock_timeout_seconds)") from None
            time.sleep(LOCK_POLL_SECONDS)


@contextmanager
def appends_paused(root: Path, timeout_seconds: float = 10.0) -> Iterator[None]:
    """No writer appends to ``root``'s log meanwhile (its append lock held); nothing to hold
    when the root has no log."""
    if not wal_dir(root).is_dir():
        yield
        return
    with open(wal_dir(root) / LOCK, "a") as handle:
        take_lock(handle, timeout_seconds, root)
        yield  # closing the handle releases the lock


def seal(root: Path, timeout_seconds: float = 10.0) -> int | None:
    """The last acknowledged seq of ``root``'s log, with the next write going to a new
    segment; None when the root has no log. Open writers see the new segment at their next
    append (``IndexWriter`` catches up under the lock)."""
    existing = segments(root)
    if not existing:
        return None
    with appends_paused(root, timeout_seconds):
        first, path = segments(root)[-1]
        last, _ = repair_tail(path)
        sealed = max(last, first - 1)
        if path.stat().st_size == 0:  # already empty: the next write starts it anyway
            return sealed
        fd = os.open(wal_dir(root) / segment_name(sealed + 1), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(wal_dir(root))
        acked = os.open(wal_dir(root) / ACKED, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            write_acked(acked, sealed + 1, 0)
        finally:
            os.close(acked)
        return sealed


def pin(root: Path, seq: int) -> Path:
    """Keep the records after ``seq`` in the log while a build that sealed it there runs
    (``retire`` spares them): a build that reads its corpus hours before it is placed
    (``build_on_ray`` encodes it first) would otherwise find them retired by the compactions
    of those hours, and be refused. ``unpin`` when the build is placed or fails. The pin
    holds its process's identity (``ProcessId``), so a pin left by a killed build is
    dropped as soon as a process of the same machine finds its owner gone."""
    pins = wal_dir(root) / PINS
    pins.mkdir(parents=True, exist_ok=True)
    path = pins / f"{seq}.{os.getpid()}.{time.time_ns()}"
    path.write_text(json.dumps(ProcessId.own().as_json()))
    return path


def unpin(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def pinned(root: Path) -> list[int]:
    """The seqs builds still running pinned. A pin whose process is known gone (``dead``)
    is deleted; one older than ``PIN_MAX_AGE_SECONDS`` is ignored, for the pins no process
    here can judge (another machine's, or written before pins named their process), so the
    log does not grow for ever."""
    pins = wal_dir(root) / PINS
    if not pins.is_dir():
        return []
    now, kept = time.time(), []
    for path in pins.iterdir():
        try:
            fresh = now - path.stat().st_mtime < PIN_MAX_AGE_SECONDS
            owner = path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:  # unpinned meanwhile
            continue
        if dead(owner):
            with suppress(OSError):  # another user's pin on a shared volume: ignored only
                path.unlink(missing_ok=True)
        elif fresh:
            kept.append(int(path.name.split(".", 1)[0]))
    return kept


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from any other that ever had its pid: the machine's boot and
    pid namespace (containers on one host share the boot but not the pids), the pid, and
    when the process started (a pid is reused once its process is gone)."""

    boot: str
    namespace: str
    pid: int
    started: str

    @staticmethod
    def own() -> ProcessId:
        """This process; its namespace "" (no pin it writes or judges is judged) when ``/proc``
        is not its pid namespace's (mounted from another one), where pids there are not its."""
        pid = os.getpid()
        try:
            seen = int(os.readlink("/proc/self"))
        except (OSError, ValueError):
            seen = -1
        namespace = _namespace("self") if seen == pid else ""
        return ProcessId(_read(BOOT_ID), namespace, pid, _started("self"))

    def as_json(self) -> dict[str, object]:
        return {"boot": self.boot, "namespace": self.namespace, "pid": self.pid,
                "started": self.started}


def dead(owner: str) -> bool:
    """Whether the process a pin names (its ``ProcessId`` as JSON) is known gone: it ran in
    this boot and pid namespace, and its pid now names no process or one started since.
    False whenever that cannot be known (an old empty pin, another machine, no ``/proc``)."""
    try:
        named = ProcessId(**json.loads(owner))
    except (ValueError, TypeError):
        return False
    if not isinstance(named.pid, int) or named.pid <= 0:  # 0 and -1 signal groups
        return False
    here = ProcessId.own()
    if not here.boot or not here.namespace or (named.boot, named.namespace) != (
            here.boot, here.namespace):
        return False
    started = _started(str(named.pid))
    if started:
        return started != named.started  # another process took its pid since
    try:  # no /proc entry: gone, or hidden from this user (hidepid): the kernel says which
        os.kill(named.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _read(path: str) -> str:
    """A ``/proc`` file's text; "" where there is none (a pid gone, another system)."""
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _namespace(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _started(pid: str) -> str:
    """When process ``pid`` started, in clock ticks since boot (field 22 of its ``stat``,
    counted after the parenthesized name, which may hold spaces); "" for no such process."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[19] if stat else ""


def retire(root: Path, folded: int) -> int:
    """Delete the segments whose records are all <= ``folded`` (the newest one is kept)."""
    existing = segments(root)
    gone = 0
    for (_, path), (next_first, _) in zip(existing, existing[1:], strict=False):
        if next_first - 1 <= folded:
            path.unlink()
            gone += 1
    if gone:
        fsync_path(wal_dir(root))
    return gone
