"""The write-ahead log's on-disk format: segments of checksummed, sequence-numbered records.

``<root>/wal/<first seq, 20 digits>.wal`` are the segments, oldest first; the writer appends to
the newest one and compaction starts a new one, so retiring folded records is deleting whole
files (never rewriting a file a reader may be tailing).

One record, little-endian::

    u32 payload length | u64 sequence number | u32 crc32(seq bytes + payload) | payload

and the payload is ``u32 JSON length | JSON | float32 vector bytes``: the JSON names the
operation (``upsert`` with its documents and vector shape, or ``delete`` with ids); vectors are
raw float32 rows, one per upserted document (per passage of a passage build, whose records
also hold each document's passage offsets). Nothing is pickled.

A record is whole or absent: a crash mid-append leaves a short or mis-checksummed tail, which
the writer finds at open and truncates (with a warning). The writer fsyncs before it
acknowledges, so an acknowledged record is never part of a torn tail. A damaged record is
corruption, not a tail, when a whole record follows it (in its segment or a later one), or when
it starts before the end of the last acknowledged record that ``wal/ACKED`` names: every
reader and the writer then raise ``LogCorruptionError`` instead of stopping there
(Elasticsearch's translog fails the shard the same way; its checkpoint file plays ACKED's part).

``wal/ACKED`` (``u64 first seq of the newest segment | u64 end offset | u32 crc32``) is
rewritten in place after each acknowledged append, without an fsync of its own (a write is
still one fsync): after a process crash it is exact; after a power loss it may lag the last
acknowledged records, and damage inside those then reads as a torn tail. Readers read it before
the segment, so a record it covers was whole when they read it.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexes.docstore import Document
from indexes.errors import CorruptArtifactError

log = logging.getLogger(__name__)


class LogCorruptionError(CorruptArtifactError):
    """A record inside the write-ahead log is damaged and whole records follow it: writes
    acknowledged after it would be lost by stopping there. Nothing is truncated or applied
    past it; restore the log (or the root) from a backup."""

WAL_DIR = "wal"
SUFFIX = ".wal"
ACKED = "ACKED"
HEADER = struct.Struct("<IQI")  # payload length, seq, crc32
JSON_LEN = struct.Struct("<I")
MIN_RECORD = HEADER.size + JSON_LEN.size  # a record's header and its payload's JSON length
ACK = struct.Struct("<QQI")  # newest segment's first seq, end of its last acknowledged record


@dataclass(frozen=True)
class Record:
    """One acknowledged write: an upsert of documents (with their vectors) or a delete."""

    seq: int
    op: str  # "upsert" | "delete"
    documents: tuple[Document, ...] = ()
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    ids: tuple[str, ...] = ()
    # Passage builds: each document's passages as (start, end) offsets into its text; then
    # ``vectors`` holds one row per passage, documents in order (else one per document).
    passages: tuple[tuple[tuple[int, int], ...], ...] = ()
    # A client's request id and a digest of what it asked, so a retried request is
    # recognised (``IndexWriter``: answered with this seq, not logged twice).
    request: tuple[str, str] | None = None
    # The encoder id of the build an upsert's vectors were made for (the live build's when it
    # was logged); "" in records logged before ids were kept. A build of another model of the
    # same width cannot take them (``check_records_fit``).
    encoder: str = ""

    def per_document(self) -> list[tuple[Document, np.ndarray, tuple[tuple[int, int], ...]]]:
        """(document, its vector (dim,) or passage vectors (n, dim), its passage spans)."""
        if not self.passages:
            return [(doc, vector, ()) for doc, vector in
                    zip(self.documents, self.vectors, strict=True)]
        out, at = [], 0
        for doc, spans in zip(self.documents, self.passages, strict=True):
            out.append((doc, self.vectors[at:at + len(spans)], spans))
            at += len(spans)
        return out


def wal_dir(root: Path) -> Path:
    return Path(root) / WAL_DIR


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SUFFIX}"


def segments(root: Path) -> list[tuple[int, Path]]:
    """(first seq, path) of every segment, oldest first (empty when there is no log)."""
    directory = wal_dir(root)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.glob(f"*{SUFFIX}"):
        if path.stem.isdigit():
            found.append((int(path.stem), path))
    return sorted(found)


def holds_after(root: Path, seq: int) -> bool:
    """Whether the log still holds every record after ``seq`` (segments are contiguous, so
    its oldest segment must start by ``seq + 1``)."""
    listed = segments(root)
    return bool(listed) and listed[0][0] <= seq + 1


def write_acked(fd: int, first_seq: int, end: int) -> None:
    """Record (in place, no fsync) that segment ``first_seq`` is acknowledged up to ``end``."""
    head = struct.pack("<QQ", first_seq, end)
    os.pwrite(fd, head + struct.pack("<I", zlib.crc32(head)), 0)


def acked_end(path: Path) -> int:
    """Where the last acknowledged record of segment ``path`` ends, per ``wal/ACKED``; 0 when
    ACKED is missing, unreadable or names another segment."""
    try:
        data = (path.parent / ACKED).read_bytes()
    except OSError:
        return 0
    if len(data) < ACK.size:
        return 0
    first, end, crc = ACK.unpack_from(data)
    if zlib.crc32(data[:16]) != crc or segment_name(first) != path.name:
        return 0
    return int(end)


def encode_record(record: Record) -> bytes:
    if record.op == "upsert":
        vectors = np.ascontiguousarray(record.vectors, dtype="<f4")
        body: dict[str, Any] = {
            "op": "upsert", "shape": list(vectors.shape),
            "docs": [{"id": d.id, "title": d.title, "text": d.text, "metadata": d.metadata}
                     for d in record.documents]}
        if record.passages:
            body["passages"] = [[list(span) for span in spans] for spans in record.passages]
        if record.encoder:
            body["encoder"] = record.encoder
        blob = vectors.tobytes()
    else:
        body, blob = {"op": "delete", "ids": list(record.ids)}, b""
    if record.request is not None:
        body["request"] = list(record.request)
    text = json.dumps(body, ensure_ascii=False, sort_keys=True).encode("utf-8")
    payload = JSON_LEN.pack(len(text)) + text + blob
    seq_bytes = struct.pack("<Q", record.seq)
    return HEADER.pack(len(payload), record.seq, zlib.crc32(seq_bytes + payload)) + payload


def decode_payload(seq: int, payload: bytes) -> Record:
    (size,) = JSON_LEN.unpack_from(payload)
    body = json.loads(payload[JSON_LEN.size:JSON_LEN.size + size].decode("utf-8"))
    request = tuple(body["request"]) if "request" in body else None
    if body["op"] == "delete":
        return Record(seq, "delete", ids=tuple(body["ids"]), request=request)  # type: ignore[arg-type]
    docs = tuple(Document(id=d["id"], text=d["text"], title=d["title"], metadata=d["metadata"])
                 for d in body["docs"])
    vectors = np.frombuffer(payload[JSON_LEN.size + size:], dtype="<f4").astype(np.float32)
    passages = tuple(tuple((int(a), int(b)) for a, b in spans)
                     for spans in body.get("passages", ()))
    return Record(seq, "upsert", documents=docs, vectors=vectors.reshape(body["shape"]),
                  passages=passages, request=request,  # type: ignore[arg-type]
                  encoder=str(body.get("encoder", "")))


def scan(data: bytes, start: int = 0, path: Path | None = None, after: int | None = None,
         origin: int = 0, acked: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """(seq, end offset, payload) of each whole, checksum-valid record from ``start``; stops
    at a short or corrupt record with nothing whole after it (a torn tail, or bytes still being
    written). Raises ``LogCorruptionError`` (naming ``path``) when a whole record follows it,
    when it starts before ``acked`` (the file offset acknowledged records reach,
    ``acked_end``) or the data ends before that, and, read from a segment's first byte, when a
    seq does not follow the one before it (the first follows the segment's name). ``after``:
    the seq of the record before ``start`` when known (for the errors' words); ``origin``: the
    file offset of ``data`` (for the error's byte positions)."""
    at, last = start, after
    # Read from its first byte, a segment's records run on from the seq in its name.
    whole = origin + start == 0 and path is not None and path.stem.isdigit()
    if whole and path is not None:
        last = int(path.stem) - 1
    while at + HEADER.size <= len(data):
        length, seq, crc = HEADER.unpack_from(data, at)
        end = at + HEADER.size + length
        payload = data[at + HEADER.size:end]
        if end > len(data) or zlib.crc32(struct.pack("<Q", seq) + payload) != crc:
            _raise_if_acked(at, last, path, origin, acked, "is damaged")
            _raise_if_followed(data, at, last, path, origin)
            return
        if whole and last is not None and seq != last + 1:
            raise LogCorruptionError(
                f"{path}: the record at byte {origin + at} is seq {seq}, not {last + 1}: "
                "the log has lost (or repeated) writes; restore it from a backup",
                path or Path("."))
        yield seq, end, payload
        at, last = end, seq
    _raise_if_acked(at, last, path, origin, acked, "is cut off")  # the file ends before it


def _raise_if_acked(at: int, last: int | None, path: Path | None, origin: int, acked: int,
                    what: str) -> None:
    """A record that starts before ``acked`` was acknowledged: damaged or cut off, it is
    lost, never a torn tail to drop."""
    if origin + at < acked:
        raise LogCorruptionError(
            f"{path}: the record at byte {origin + at} (after seq {last}) {what} and was "
            f"acknowledged ({ACKED}: records up to byte {acked}); restore the log from a "
            "backup", path or Path("."))


def _raise_if_followed(data: bytes, at: int, last: int | None, path: Path | None,
                       origin: int) -> None:
    """Raise when a whole record with a later seq starts after the damaged one at ``at``:
    acknowledged writes follow the damage, however many records it spans."""
    if last is None:  # a segment's first record: its own header gives the expected seq
        last = HEADER.unpack_from(data, at)[1] - 1 if at + HEADER.size <= len(data) else 0
    found = _whole_record_after(data, at, last)
    if found is not None:
        seq, begin = found
        raise LogCorruptionError(
            f"{path}: the record at byte {origin + at} (after seq {last}) is damaged and "
            f"whole records follow it (seq {seq} at byte {origin + begin}): acknowledged "
            "writes would be lost; restore the log from a backup", path or Path("."))


def _whole_record_after(data: bytes, at: int, last: int) -> tuple[int, int] | None:
    """(seq, offset) of the first whole, checksum-valid record starting past ``at`` whose
    seq follows ``last``; None when there is none (a torn tail).

    Every offset is tried: the damage may span several records or change a length, so where
    the records after it start is unknown. Only seqs a record could have there are checksummed
    (each record takes at least ``MIN_RECORD`` bytes, so seqs run at most one per that many
    bytes past ``last``), which leaves next to no candidates in random bytes."""
    lowest = max(last, 0)
    highest = min(lowest + 1 + (len(data) - at) // MIN_RECORD, 2**64 - 1)
    starts: list[int] = []
    for shift in range(8):  # a u64 read at every offset, in eight aligned passes
        first = at + 1 + shift + 4  # the seq field of a header at ``at + 1 + shift``
        count = (len(data) - first - 8 - 4) // 8 + 1  # whole headers only
        if count <= 0:
            continue
        seqs = np.frombuffer(data, dtype="<u8", count=count, offset=first)
        hits = np.flatnonzero((seqs > lowest) & (seqs <= highest))
        starts.extend(int(first + 8 * i - 4) for i in hits)
    for begin in sorted(starts):
        length, seq, crc = HEADER.unpack_from(data, begin)
        end = begin + HEADER.size + length
        if end <= len(data) and zlib.crc32(
                data[begin + 4:begin + 12] + data[begin + HEADER.size:end]) == crc:
            return seq, begin
    return None


def read_from(path: Path, offset: int, newest: bool = True, after: int | None = None
              ) -> tuple[list[Record], int]:
    """Whole records of one segment from ``offset``; returns them and the offset after the
    last whole one. Raises FileNotFoundError when the segment was retired, and
    ``LogCorruptionError`` when a damaged record is not a tail: whole records follow it, or
    it is in a segment older than the ``newest`` (writes go on in a later segment); ``after``
    as in ``scan``."""
    acked = acked_end(path)  # before the data: what it covers was whole when read
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    records, consumed = [], 0
    for seq, end, payload in scan(data, path=path, after=after, origin=offset, acked=acked):
        records.append(decode_payload(seq, payload))
        consumed = end
    if not newest and consumed < len(data):
        raise LogCorruptionError(
            f"{path}: the record at byte {offset + consumed} is damaged and a newer segment "
            "follows this one: acknowledged writes would be lost; restore the log from a "
            "backup", path)
    return records, offset + consumed


def read_all(root: Path, after: int = 0) -> list[Record]:
    """Every whole record with seq > ``after``, oldest first. A segment retired while the
    log is read (a compaction went live meanwhile) is skipped, with the records read before
    it kept: the list then has a gap, so a caller that needs every record checks the seqs
    run on (``indexes.rebuild.first_missing``)."""
    out: list[Record] = []
    listed = segments(root)
    follows: int | None = None  # the seq the next segment must start at
    for i, (first, path) in enumerate(listed):
        try:
            records, _ = read_from(path, 0, newest=i == len(listed) - 1)
        except FileNotFoundError:  # retired meanwhile (the oldest first): folded, and the
            follows = None  # next may be retired too by the time it is read: no gap known
            continue
        follows = _check_follows(path, first, follows, records)
        out.extend(r for r in records if r.seq > after)
    return out


def check_starts_by(path: Path, first: int, live_seq: int) -> None:
    """Raise when the log's oldest segment (``path``, first seq ``first``) starts past
    ``live_seq + 1``: the writes between were retired unfolded, or lost."""
    if first > live_seq + 1:
        raise LogCorruptionError(
            f"{path}: the log starts at seq {first}, but the live build holds writes up to seq "
            f"{live_seq} only: seqs {live_seq + 1}-{first - 1} are lost; restore the log from a "
            "backup, or publish a build of the whole corpus", path)


def _check_follows(path: Path, first: int, follows: int | None, records: list[Record]
                   ) -> int | None:
    """Raise when segment ``path`` (its first seq ``first``) does not start where the one
    before it ended; returns where the next must start (None: not known)."""
    if follows is not None and first != follows:
        raise LogCorruptionError(
            f"{path}: the segment starts at seq {first}, but the one before it ends at seq "
            f"{follows - 1}: the writes in between are lost; restore the log from a backup",
            path)
    return records[-1].seq + 1 if records else None


def check_log(root: Path, live_seq: int | None = None) -> tuple[int, int]:
    """(whole records, bytes of a torn tail) of the root's log; raises ``LogCorruptionError``
    where a damaged record is not a tail, where seqs leave a gap, where the log starts past
    ``live_seq + 1`` (the live build's ``log_seq``: writes it lacks are gone) or where
    ``wal/ACKED`` is damaged (``retrieval verify``)."""
    listed = segments(root)
    if listed and live_seq is not None:
        check_starts_by(listed[0][1], listed[0][0], live_seq)
    count, torn, follows = 0, 0, None
    for i, (first, path) in enumerate(listed):
        records, end = read_from(path, 0, newest=i == len(listed) - 1)
        follows = _check_follows(path, first, follows, records)
        count += len(records)
        torn = path.stat().st_size - end
    _check_acked(wal_dir(root) / ACKED)
    return count, torn


def _check_acked(path: Path) -> None:
    """A damaged ``ACKED`` reads as "nothing acknowledged" (``acked_end``): a damaged record
    the log acknowledged would then be cut as a torn tail at the next writer's open, not
    refused. Empty is not damaged: a writer creates it before its first acknowledgement."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and (len(data) < ACK.size or zlib.crc32(data[:16]) != ACK.unpack_from(data)[2]):
        raise LogCorruptionError(
            f"{path} is damaged (its checksum does not match), so where the acknowledged "
            "records end is unknown. Delete it, and the next writer to open the root writes "
            "it again; that writer cuts a damaged record at the newest segment's end as a "
            "torn tail, so first compare that segment with a backup if you have one", path)


def repair_tail(path: Path) -> tuple[int, int]:
    """Truncate a torn or corrupt tail of ``path``; returns (last seq or 0, bytes dropped).

    Called by the writer at open, under its lock, before any append.
    """
    acked = acked_end(path)
    data = path.read_bytes()
    last, whole = 0, 0
    for seq, end, _ in scan(data, path=path, acked=acked):
        if seq <= last:
            raise CorruptArtifactError(f"{path}: sequence number {seq} after {last}; the log "
                                       "is damaged, restore it from a backup", path)
        last, whole = seq, end
    dropped = len(data) - whole
    if dropped:
        log.warning("%s: torn or corrupt tail of %d bytes after seq %d truncated (a write "
                    "interrupted before it was acknowledged)", path, dropped, last)
        with open(path, "r+b") as handle:
            handle.truncate(whole)
            handle.flush()
            os.fsync(handle.fileno())
    return last, dropped
