"""Making a placed build live without losing a logged write, and deleting the log segments
no build that may serve again still needs.

A build folds the write-ahead log up to its ``log_seq``; a serving process applies the log's
records after that number on top of it. So a build may go live only while the log still holds
every record after its ``log_seq`` that the live build holds: a staged build published after a
compaction, a compaction that finished after another one, and a rollback all go live with an
older ``log_seq`` than the live build's, and the records in between are served from the log.
For a rollback to find them, the log keeps the records the rollback target lacks (the build
live before the live one) as well as those the live build lacks: at most one compaction's
worth more.

The check, the flip and the deletion run under the root's flip lock, so no flip comes between
what the check read and what the deletion removes. The check that the pending writes fit the
build and the flip also hold the log's append lock: a writer that caught up with the old build
cannot append a record the new one refuses between them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from indexes.errors import (
    ArtifactError,
    CorruptArtifactError,
    InvalidWriteError,
    LiveBuildChangedError,
    LogGapError,
    PublishError,
)
from indexes.history import (
    FlipRecord,
    How,
    check_history,
    flip,
    flipping,
    latest_flip_to,
    live_build_id,
    rollback_target,
)
from indexes.manifest import Manifest, read_manifest
from indexes.wal.checks import check_fields_fit, check_records_fit
from indexes.wal.log import Record, holds_after, read_all, segments
from indexes.wal.seal import appends_paused, pinned, retire
from indexes.wal.state import Changes

log = logging.getLogger(__name__)


def go_live(root: Path, build_id: str, how: How, note: str = "",
            replaces: str | None = None) -> tuple[FlipRecord, int]:
    """Flip ``CURRENT`` to a placed build; returns the flip and how many folded segments were
    deleted. Refused with ``LogGapError`` when the log no longer holds writes it lacks, and
    with ``LiveBuildChangedError`` when ``replaces`` (the build it was made from) is no longer
    live. The live build itself (a retried publish, or a rollback another one did first)
    flips nothing: its flip record stays the one that made it live."""
    root = Path(root)
    with flipping(root):
        live = live_build_id(root)
        if live is not None and live == build_id:
            return _already_live(root, build_id, how), 0
        if replaces is not None and live != replaces:
            raise LiveBuildChangedError(
                f"build {build_id!r} was made from {replaces!r}, but {live!r} went live under "
                f"{root} meanwhile; publishing it would undo that. It stays placed, not live")
        # A build never live yet, made from an older export than the live one's: refused
        # (through the gate, its "corpus export" check, which --force overrides); one that
        # served before is published back on purpose.
        if how == "plain" and latest_flip_to(root, build_id) is None:
            check_export_not_older(root, build_id, live)
        check_log_holds(root, build_id, live)
        with appends_paused(root):  # no write lands between the check and the flip
            check_writes_fit(root, build_id, how)
            record = flip(root, build_id, how, note)
        return record, _retire_unneeded(root)


def _already_live(root: Path, build_id: str, how: How) -> FlipRecord:
    made_live = latest_flip_to(root, build_id)
    if made_live is not None:
        return made_live
    return FlipRecord(build_id=build_id, at=datetime.now(UTC).isoformat(), how=how,
                      note="already live")


def retire_folded(root: Path) -> int:
    """Delete the segments whose records every build that may serve again holds."""
    with flipping(root):
        return _retire_unneeded(root)


def check_export_not_older(root: Path, build_id: str, live: str | None) -> None:
    """Refuse a build made from an older corpus export than the live build's: two nightly
    builds that overlapped, the slower one (which read its export first) finishing last,
    would otherwise bring back the older export with no word (its build id is the newer)."""
    if live is None:
        return
    candidate = read_manifest(root / "builds" / build_id)
    try:
        serving = read_manifest(root / "builds" / live)
    except ArtifactError:  # deleted since: nothing to compare with
        return
    if older_export(candidate, serving):
        raise LiveBuildChangedError(
            f"build {build_id!r} read its corpus export ({describe_export(candidate)}) before "
            f"the live build {live!r} read its own ({describe_export(serving)}): publishing "
            "it would bring back the older export. It stays placed, not live; to serve it "
            "all the same, `retrieval publish --force` it")


def older_export(candidate: Manifest, live: Manifest) -> bool:
    """Whether ``candidate`` was made from a corpus export read before ``live``'s."""
    if candidate.replay_from != live.replay_from:
        return candidate.replay_from < live.replay_from
    return (candidate.exported_at is not None and live.exported_at is not None
            and candidate.exported_at < live.exported_at)


def describe_export(manifest: Manifest) -> str:
    when = f" at {manifest.exported_at}" if manifest.exported_at else ""
    return f"log seq {manifest.replay_from}{when}"


def check_log_holds(root: Path, build_id: str, live: str | None) -> None:
    if live is None:
        return
    needed = read_manifest(root / "builds" / build_id).log_seq
    holds = _log_seq(root, live)
    if holds is None or holds <= needed or holds_after(root, needed):
        return
    listed = segments(root)
    oldest = f"seq {listed[0][0]}" if listed else "nothing (no log)"
    raise LogGapError(
        f"build {build_id!r} holds the log's writes up to seq {needed}, the live build "
        f"{live!r} up to seq {holds}, and the log under {root} now starts at {oldest}: "
        f"publishing {build_id!r} would lose the writes after seq {needed}. It stays placed, "
        f"not live; build again from your corpus (its build seals the log where it starts) "
        f"or keep the live build")


def check_writes_fit(root: Path, build_id: str, how: How = "plain") -> None:
    """Refuse a build the log's writes after its ``log_seq`` cannot be applied to: upserts
    logged whole for a passage build or the reverse, of another vector width, with metadata
    its field kinds refuse, or split into passages otherwise than it splits them
    (acknowledged while a build with the other setting ran, by a writer of the live build).
    Served, every reader (or every compaction) would refuse it; refused here, the live build
    serves on. A rollback, the emergency exit, is not refused for the passage split: it is
    warned about (those writes wait for a rebuild to be folded)."""
    manifest = read_manifest(root / "builds" / build_id)
    records = read_all(root, after=manifest.log_seq)
    try:
        changes = Changes.of(records, after=manifest.log_seq)
        check_records_fit(manifest, changes)
        check_fields_fit(manifest, changes)
    except InvalidWriteError as exc:
        raise PublishError(f"{exc}. Build {build_id!r} stays placed, not live") from exc
    try:
        check_passages_fit(root, manifest, records)
    except PublishError as exc:
        if how != "rollback":
            raise
        log.warning("rolled back over pending passage writes split otherwise: %s", exc)


def check_passages_fit(root: Path, manifest: Manifest, records: list[Record]) -> None:
    """Refuse a passage build whose passage settings differ from the live build's while
    upserts split for the live build are pending on it: served, they read fine, but no
    compaction could ever fold them (it splits the live corpus again with the new build's
    settings and finds no vector for the old cuts).

    A writer splits with the build live when it appends, and every flip checks the writes
    pending on the build going live, so each write after the live build's corpus export
    (``replay_from``) was split with the live build's settings. Older pending writes (a
    rollback past a rebuild) were split for a build gone since: not judged here."""
    live = live_build_id(root)
    if live is None or manifest.passages is None:
        return
    try:
        serving = read_manifest(root / "builds" / live)
    except ArtifactError:  # deleted since: nothing to compare with
        return
    if serving.passages is None or same_split(manifest, serving):
        return  # whole documents for a passage build: ``check_fit`` refused them already
    split_live = _split_after(records, max(manifest.log_seq, serving.replay_from))
    if split_live:
        raise PublishError(
            f"the log holds pending upserts of {len(split_live)} documents (first "
            f"{split_live[0]!r}) split into {_cuts(serving)}, as the live build {live!r} "
            f"splits them, and build {manifest.build_id!r} cuts {_cuts(manifest)}: served "
            f"on it, no compaction could fold them. Build {manifest.build_id!r} stays "
            "placed, not live. Pause the writes, build again with the new passage settings "
            "from an export that holds them (or with live_writes=\"replayed\", `retrieval "
            "build --live-writes replayed`), and publish it before the writes resume")


def same_split(one: Manifest, other: Manifest) -> bool:
    """Whether two passage builds cut passages alike. A tokenizer recorded by one only may
    be the one the other cut with (compaction records the writer's): taken as alike."""
    a, b = one.passages, other.passages
    assert a is not None and b is not None
    if (a.max_tokens, a.overlap_tokens) != (b.max_tokens, b.overlap_tokens):
        return False
    return a.tokenizer is None or b.tokenizer is None or \
        Path(a.tokenizer).resolve() == Path(b.tokenizer).resolve()


def _split_after(records: list[Record], after: int) -> list[str]:
    """Ids whose latest pending version is a passage upsert logged after seq ``after``."""
    logged: dict[str, int] = {}
    for record in records:
        for doc_id in record.ids:  # deleted: nothing left to fold
            logged.pop(doc_id, None)
        for doc in record.documents:
            logged[doc.id] = record.seq if record.passages else 0
    return [doc_id for doc_id, seq in logged.items() if seq > after]


def _cuts(manifest: Manifest) -> str:
    info = manifest.passages
    assert info is not None
    tokenizer = f", tokenizer {info.tokenizer}" if info.tokenizer else ""
    return (f"passages of at most {info.max_tokens} tokens (overlap {info.overlap_tokens}"
            f"{tokenizer})")


def _retire_unneeded(root: Path) -> int:
    try:
        check_history(root)
    except CorruptArtifactError:  # the rollback target is unknown: keep every segment
        return 0
    kept = [seq for seq in (_log_seq(root, live_build_id(root)),
                            _log_seq(root, rollback_target(root))) if seq is not None]
    kept += pinned(root)  # builds still running from where they sealed the log
    return retire(root, min(kept)) if kept else 0


def _log_seq(root: Path, build_id: str | None) -> int | None:
    """The ``log_seq`` of a placed build; None for no build, or one deleted since."""
    if build_id is None:
        return None
    try:
        return read_manifest(root / "builds" / build_id).log_seq
    except ArtifactError:
        return None
