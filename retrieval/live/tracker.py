"""Follows an index root's write-ahead log for one ``Retriever``: applies new records into a
fresh snapshot (``view.compose``) and swaps it in atomically, within ``live_lag_seconds``.

A background thread polls cheaply (a directory listing and a read from the last offset, every
``lag / 4``, at most 50 ms apart); ``apply_now`` does the same at once (``Retriever.refresh``).
When a new build is published (seen by ``Retriever.reload``, which the background thread
calls at every poll, or forced by a retired segment), ``rebase`` serves it with only the
records after the sequence number it folded (``manifest.log_seq``), in one swap: a write is
never invisible, nor counted twice. The background thread does not wait for that load: it
goes on applying the records that fit the build served, and the first one logged for the
new build (another model, another kind of build or field) waits for it. A segment retired
before this process read it is covered by that build: seeing one missing triggers the
reload first.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from indexes.errors import InvalidWriteError, RetrievalError
from indexes.wal import Changes, Record
from indexes.wal.checks import check_fields_fit, check_records_fit, merged_kinds
from indexes.wal.log import LogCorruptionError, holds_after, read_from, segments, wal_dir
from retrieval.live.bm25_live import BaseTerms
from retrieval.live.view import Folded, TokenMemo, compose, content_hashes_of
from retrieval.loaded_build import LoadedBuild

log = logging.getLogger(__name__)
# Under a stream of writes, the share of a core a follower spends rebuilding snapshots at most
# (``LogFollower._pause_after``): without a bound, two workers applying every 50 ms poll spent
# both cores of the benchmark machine on it (``benchmarks/writes.py``).
COMPOSE_SHARE = 0.25


class LogFollower:
    """The applied log state of one serving process; every method is thread-safe."""

    def __init__(self, root: Path, base: LoadedBuild, serve: Callable[[LoadedBuild], None],
                 reload: Callable[..., bool], load_pending: Callable[[], bool],
                 lag_seconds: float | None) -> None:
        self.root = root
        # Weak: a Retriever dropped without close() is collected, and its thread then ends.
        self._serve_ref = weakref.WeakMethod(serve)  # type: ignore[arg-type]
        self._reload_ref = weakref.WeakMethod(reload)  # type: ignore[arg-type]
        self._load_pending_ref = weakref.WeakMethod(load_pending)  # type: ignore[arg-type]
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._memo = TokenMemo()
        self._set_base(base)
        self._position = (0, 0)  # (segment's first seq, byte offset) read so far
        self._thread: threading.Thread | None = None
        # Why the log could not be applied (e.g. a damaged record): the last good state
        # serves on, and the service's /readyz says so until a poll succeeds.
        self.failure: str | None = None
        self._lag_seconds = lag_seconds

    def start(self) -> None:
        """Apply what the log holds now, then follow it (every ``lag_seconds``). Called once
        the retriever holds this follower: a reload the first apply asks for (a compaction
        retired the segment it read) must rebase it, not serve the new build past it."""
        self.apply_now()
        if self._lag_seconds is not None:
            self._lag = self._lag_seconds
            self._interval = min(0.05, self._lag_seconds / 4)
            self._thread = threading.Thread(target=self._run, name="retrieval-log",
                                            daemon=True)
            self._thread.start()

    def _serve(self, snapshot: LoadedBuild) -> None:
        serve = self._serve_ref()
        if serve is None:
            self._stop.set()
        else:
            serve(snapshot)

    def _reload(self, wait: bool = True) -> bool:
        reload = self._reload_ref()
        if reload is None:
            self._stop.set()
            return False
        return bool(reload(wait=wait))

    def _load_pending(self) -> bool:
        load_pending = self._load_pending_ref()
        return load_pending is not None and bool(load_pending())

    def _set_base(self, base: LoadedBuild, applied_seq: int | None = None) -> None:
        self.base = base
        self._folded: Folded | None = None
        self._terms: BaseTerms | None = None
        self._base_hashes: np.ndarray | None = None
        self.records: list[Record] = []
        self.applied_seq = base.manifest.log_seq if applied_seq is None else applied_seq

    def _state(self) -> tuple[Any, ...]:
        return (self.base, self._folded, self._terms, self._base_hashes, self.records,
                self.applied_seq, self._memo, self._position)

    def _restore(self, state: tuple[Any, ...]) -> None:
        (self.base, self._folded, self._terms, self._base_hashes, self.records,
         self.applied_seq, self._memo, self._position) = state

    # -- swaps -----------------------------------------------------------------------------

    def rebase(self, base: LoadedBuild) -> None:
        """Serve a newly published build plus the records after the ones it folded. A build
        folding fewer than the one served (a rollback, or a staged build published after a
        compaction) gets the records in between from the log again. ``applied_seq`` rises
        only once the new snapshot serves: ``wait_for_seq`` readers rely on it."""
        with self._lock:
            if base.manifest.log_seq < self.base.manifest.log_seq and not holds_after(
                    self.root, base.manifest.log_seq):  # before anything changes:
                raise self._gap(base.manifest.log_seq)  # the old one serves on
            before = self._state()
            try:
                self._rebase(base)
            except BaseException:  # the old base serves on, with what it applied
                self._restore(before)
                raise

    def _rebase(self, base: LoadedBuild) -> None:
        log_seq, served = base.manifest.log_seq, self.applied_seq
        lower = log_seq < self.base.manifest.log_seq
        kept = [r for r in self.records if r.seq > log_seq]
        same_analyzer = (base.manifest.analyzer_fingerprint
                         == self.base.manifest.analyzer_fingerprint)
        carried = self._carried_terms(base) if same_analyzer else None
        if not same_analyzer:  # the delta's texts analyzed as the new build analyzes
            self._memo = TokenMemo()
        self._set_base(base, applied_seq=served)
        self._terms = carried
        if lower:  # the records after its log_seq, not after what was served
            self._position = (0, 0)
            read = self._read_new(after=log_seq)
            if read is None:  # retired since ``rebase`` checked: the records are gone
                raise self._gap(log_seq)
            kept = read
        applied = max(served, log_seq, kept[-1].seq if kept else 0)
        self.records = kept
        self._publish(applied)
        self.applied_seq = applied

    def check_fits(self, base: LoadedBuild) -> None:
        """Raise InvalidWriteError when the applied records cannot be served on ``base``
        (written for a build with passages and ``base`` has none, or the reverse)."""
        with self._lock:
            changes = Changes.of(self.records, after=base.manifest.log_seq)
            check_records_fit(base.manifest, changes)
            check_fields_fit(base.manifest, changes)

    def _carried_terms(self, base: LoadedBuild) -> BaseTerms | None:
        """The new base's term frequencies from the snapshot served now, when the new base
        is its compaction (same texts, same order): nothing is analyzed again."""
        folded = self._folded
        if folded is None or len(folded.hashes) != base.manifest.n_docs:
            return None
        try:
            same = bool(np.array_equal(content_hashes_of(base), folded.hashes))
        except RetrievalError:
            return None
        return folded.terms if same else None

    def apply_now(self) -> bool:
        """Read and apply every new whole record; True when something was applied."""
        applied = self._apply_new(reloaded=False)
        if applied is None:  # a segment was retired: its records are in a newer build
            self._reload()  # not under the lock: a reload takes the retriever's, then ours
            applied = self._apply_new(reloaded=True)
        return bool(applied)

    def _apply_new(self, reloaded: bool) -> bool | None:
        """Apply the records after ``applied_seq``: whether there were any, None when the
        segment being read was retired (a reload must come first)."""
        with self._lock:
            if reloaded:
                self._position = (0, 0)
            position = self._position
            fresh = self._read_new()
            if fresh is None:
                if reloaded:
                    raise self._gap(self.applied_seq)
                return None
            if not fresh:
                return False
            try:
                check_new_fit(self.base, fresh)
            except InvalidWriteError:
                self._position = position  # read again at the next poll, past what applies
                self._apply_fitting(fresh)
                raise
            try:
                self._publish(fresh[-1].seq, self.records + fresh)
            except BaseException:
                self._position = position  # read again at the next poll, which fails again
                raise
            self._applied(fresh)
            return True

    def _applied(self, records: list[Record]) -> None:
        self.records.extend(records)
        # Only once the snapshot holding them serves: a reader that sees this seq
        # (read-your-writes, ``Retriever.wait_for_seq``) must find the writes served.
        self.applied_seq = records[-1].seq

    def _apply_fitting(self, fresh: list[Record]) -> None:
        """Apply the records before the first one the base cannot take (logged for a build
        loading beside): the writes before it serve now, not once that build has loaded."""
        first = next((i for i, record in enumerate(fresh) if not fits(self.base, [record])),
                     len(fresh))
        prefix = fresh[:first]
        if prefix and fits(self.base, prefix):  # each fits, and together (field kinds)
            self._publish(prefix[-1].seq, self.records + prefix)
            self._applied(prefix)

    def _gap(self, after: int) -> LogCorruptionError:
        """The log does not go on from the served build, even after a reload: records were
        deleted unserved (no publish does that), and the writes after them wait."""
        listed = segments(self.root)
        starts = f"seq {listed[0][0]}" if listed else "nothing"
        return LogCorruptionError(
            f"the write-ahead log of {self.root} starts at {starts}, but the build served "
            f"({self.base.build_id}) holds writes up to seq {after} only: the writes in "
            "between are gone and later ones are not served. Restore the log from a backup, "
            "or publish a build of the whole corpus (compaction refuses a log with a gap)",
            wal_dir(self.root))

    def _publish(self, last_seq: int | None = None, records: list[Record] | None = None) -> None:
        records = self.records if records is None else records
        if records and self._terms is None:
            self._terms = BaseTerms.of(self.base.docs, self.base.analyzer,
                                       self.base.bm25.vocab_list)
        if self._terms is None:  # nothing logged on this base yet
            self._folded = None
            self._serve(self.base)
            return
        changes = Changes.of(records, after=self.base.manifest.log_seq)
        changes.last_seq = self.applied_seq if last_seq is None else last_seq
        kinds = merged_kinds(self.base.metadata.kinds,
                             [r for r in records if r.seq > self.base.manifest.log_seq],
                             self.base.manifest.allow_new_fields)
        if self._base_hashes is None:  # read once: a build deleted meanwhile stays readable
            self._base_hashes = content_hashes_of(self.base)
        snapshot, self._folded = compose(self.base, self._terms, changes, kinds,
                                         self._base_hashes, self._memo)
        self._serve(snapshot)

    def _read_new(self, after: int | None = None) -> list[Record] | None:
        """Whole records after ``after`` (default ``applied_seq``), oldest first; None when
        the segment being read was retired."""
        after = self.applied_seq if after is None else after
        found: list[Record] = []
        first, offset = self._position
        listed = segments(self.root)
        if first and first not in {f for f, _ in listed}:
            return None
        for start, path in listed:
            if start < first:
                continue
            if start != first and start - 1 > (found[-1].seq if found else after):
                return None  # records before this segment were retired unread
            try:
                at = offset if start == first else 0
                records, end = read_from(path, at, newest=start == listed[-1][0],
                                         after=after if at else None)
            except FileNotFoundError:
                return None
            found.extend(r for r in records if r.seq > after
                         and (not found or r.seq > found[-1].seq))
            self._position = (start, end)
        return found

    def describe(self) -> dict[str, Any]:
        """For ``Retriever.stats``: the log position served and the records above the base."""
        return {"applied_seq": self.applied_seq, "base_log_seq": self.base.manifest.log_seq,
                "records": len(self.records), "failure": self.failure}

    # -- the background thread ---------------------------------------------------------------

    def _run(self) -> None:
        pause = self._interval
        while not self._stop.wait(pause) and self._serve_ref() is not None:
            base = self.base
            try:
                # A build published meanwhile (a compaction in another process, a gated
                # publish, a rollback) loads in a thread of its own; once it serves, its own
                # log position is read from its log_seq.
                self._reload(wait=False)
                self._prepare_terms()
                started = time.perf_counter()
                applied = self.apply_now()
                pause = self._pause_after(time.perf_counter() - started if applied else 0.0)
                self.failure = None
            except Exception as exc:
                if isinstance(exc, InvalidWriteError) and (
                        self.base is not base or self._load_pending()):
                    # Logged for a build published since (loading beside, or swapped in
                    # meanwhile): applied once it serves; no failure (``/readyz`` is ready).
                    self.failure = None
                    pause = self._interval
                    continue
                # Any failure, not only ours: a dead thread would leave every later write
                # unserved without a word; alive, it names the failure to min_seq waits.
                if str(exc) != self.failure:  # once per distinct failure, not every poll
                    log.error("applying the write-ahead log of %s failed: %s", self.root, exc)
                self.failure = str(exc)
                # Each retry composes the failed batch again: back off to the lag.
                pause = min(max(pause, self._interval) * 2, self._lag)

    def _pause_after(self, composing: float) -> float:
        """The wait before the next poll: the poll interval, or under a stream of writes
        ``COMPOSE_SHARE`` of a core at most for rebuilding the snapshot (each applied batch
        rebuilds the live BM25 statistics: ~0.1 s at SciFact's size), while the next batch
        still lands within half the lag. Records arriving meanwhile are applied together."""
        paced = composing * (1 - COMPOSE_SHARE) / COMPOSE_SHARE
        return max(self._interval, min(paced, self._lag / 2 - composing))

    def _prepare_terms(self) -> None:
        """Analyze the base's texts ahead of the first write (on a root that has a log), so
        that write waits only for its own batch: at SciFact's size this takes 1-2 s."""
        base = self.base
        if self._terms is not None or not segments(self.root):
            return
        terms = BaseTerms.of(base.docs, base.analyzer, base.bm25.vocab_list)
        with self._lock:
            if self.base is base and self._terms is None:
                self._terms = terms

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def fits(base: LoadedBuild, records: list[Record]) -> bool:
    """Whether ``check_new_fit`` takes ``records``."""
    try:
        check_new_fit(base, records)
    except InvalidWriteError:
        return False
    return True


def check_new_fit(base: LoadedBuild, fresh: list[Record]) -> None:
    """InvalidWriteError when records just read cannot be applied on ``base``: logged for a
    build of another model, kind or field kinds (published since, and loading beside)."""
    changes = Changes.of(fresh)
    check_records_fit(base.manifest, changes)
    check_fields_fit(base.manifest, changes)
