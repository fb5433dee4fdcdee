"""The rebuild contract: what a build from a corpus export does with the writes logged live
on the root it replaces.

The export is taken before the build starts, so by default it *supersedes* every write
logged before the build started: a document deleted live but still in the export comes back,
one upserted live but absent from the export is gone. ``replayed`` keeps them instead: the
logged upserts and deletes are applied to the export before it is indexed. Either way the
build seals the log where it started (``indexes.wal.seal``), records that sequence number as
its ``log_seq``, and writes acknowledged during the build are applied on top of it by every
serving process, so none is lost; once the build is live the folded segments are deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from indexes.docstore import Document
from indexes.errors import CorpusError, LogGapError
from indexes.manifest import LiveWrites, LiveWritesInfo, current_build_dir, read_manifest
from indexes.wal.log import Record, read_all
from indexes.wal.seal import pin, seal
from indexes.wal.state import Changes

POLICIES: tuple[LiveWrites, ...] = ("superseded", "replayed")


class Sealed(NamedTuple):
    """Where a build from a corpus export starts on the root's log."""

    log_seq: int  # the new build's: the last write acknowledged before the export was read
    contract: LiveWritesInfo | None  # what it does with the live writes (None: no log)
    changes: Changes  # those writes
    exported_at: str  # when (UTC, ISO 8601)
    pin: Path | None = None  # keeps the log from log_seq on until the build is placed (unpin)


def start(root: Path, policy: LiveWrites) -> Sealed:
    """(log_seq of the new build, what it does with the live writes, their changes) for a
    build of ``root`` starting now; no log: the live build's log_seq and None.

    The writes are those after the last corpus export (``Manifest.replay_from``): a
    compaction since the last build from a corpus folded some into the live build, and the
    new export holds none of them either."""
    if policy not in POLICIES:
        raise CorpusError(f"live_writes must be one of {list(POLICIES)}, not {policy!r}")
    previous = current_build_dir(root)
    manifest = read_manifest(previous) if previous is not None else None
    live_seq = manifest.log_seq if manifest is not None else 0
    after = manifest.replay_from if manifest is not None else 0
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    sealed = seal(root)
    if sealed is None:  # no log yet: one a writer of the live build starts meanwhile is
        # pinned from its start (a first build has no live build to write to)
        pinned = pin(root, live_seq) if previous is not None else None
        return Sealed(live_seq, None, Changes(last_seq=live_seq), now, pinned)
    sealed = max(sealed, live_seq)
    records = [r for r in read_all(root, after=after) if r.seq <= sealed]
    missing = first_missing(records, after, sealed)
    if missing is not None:
        if policy == "superseded":  # nothing to replay: the writes the log holds are reported
            after = max(after, live_seq)
            records = [r for r in records if r.seq > after]
        else:
            raise _folded_gone(after, missing)
    changes = Changes.of(records, after=after)
    info = LiveWritesInfo(policy=policy, sealed_seq=sealed, records=len(records),
                          upserted=len(changes.upserts), deleted=len(changes.deleted))
    return Sealed(sealed, info, changes, now, pin(root, sealed))


def first_missing(records: list[Record], after: int, sealed: int) -> int | None:
    """The first seq in ``after + 1 .. sealed`` that ``records`` lack; None when they hold
    every one. Checked through to the end, not only the first: a compaction published while
    the log was read retires segments, and a replay missing one brought back what it deleted."""
    expected = after + 1
    for record in records:
        if record.seq != expected:
            return expected
        expected += 1
    return expected if expected <= sealed else None


def _folded_gone(after: int, missing: int) -> LogGapError:
    return LogGapError(
        f"the live build folded live writes after seq {after} (compactions since the last "
        f"build from a corpus, or one published while this build read the log), and the log "
        f"no longer holds them all (seq {missing} is gone): replayed onto a corpus export "
        "they would be lost. Export the live documents (Retriever.get_documents or a "
        "snapshot) into the corpus, then build")


def replay(documents: list[Document], changes: Changes) -> list[Document]:
    """The export with the logged writes applied: replaced and deleted ids dropped, the
    upserted documents' last versions appended (in first-upsert order, as compaction does)."""
    replaced = changes.replaced()
    return [d for d in documents if d.id not in replaced] + \
        [doc for doc, _ in changes.upserts.values()]
