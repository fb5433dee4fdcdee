"""The writer of an index root: validates, embeds, appends, fsyncs, then acknowledges.

``IndexWriter(root).upsert(documents)`` and ``.delete(ids)`` each append one record (all of
the call or none of it) and return its sequence number once the record is on disk.

Several writers may be open on one root (each serving worker has one): an exclusive ``fcntl``
lock on ``<root>/wal/.writer.lock`` is taken for each append and rotation only, so the log
has one writer at a time and one order. Under the lock a writer first catches up with what
the others appended since (their records, a rotation, a newly published build), so
sequence numbers stay contiguous and schema checks see every earlier write. A lock not
obtained within ``lock_timeout_seconds`` is ``WriterLockedError``.

Retries: a write may carry a client's request id. The id and a digest of the write are
logged with the record; a later write with the same id and the same content is answered with
the first one's sequence number and logs nothing, and one with other content is
``RequestReplayError``. Ids are remembered while their record is in the log (a build that
folds it keeps it there while a rollback may need it). Without an id a resent upsert or
delete is still harmless to the index's content: the same documents replace themselves, the
same ids stay deleted; it only costs a record.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.compaction import CompactionReport, compact
from indexes.docstore import Document
from indexes.encoders import DEFAULT_MODEL, Encoder, compatible_query_encoder
from indexes.errors import (
    ArtifactError,
    EncoderMismatchError,
    InvalidWriteError,
    MissingArtifactError,
    RequestReplayError,
    WriterClosedError,
)
from indexes.manifest import CURRENT, Manifest, read_manifest, resolve_build_dir
from indexes.passages import TokenCounter
from indexes.sharding.layout import stored_vectors
from indexes.storage import fsync_path
from indexes.vectors import FLOAT16_MAX, content_hashes, non_finite_row, out_of_range_row
from indexes.wal.checks import (
    check_documents,
    check_ids,
    document_list,
    given_vectors,
    merged_kinds,
    merged_schema,
)
from indexes.wal.log import (
    ACKED,
    Record,
    encode_record,
    read_all,
    read_from,
    repair_tail,
    segment_name,
    segments,
    wal_dir,
    write_acked,
)
from indexes.wal.seal import LOCK, take_lock
from indexes.wal.split import Spans, passage_config, record_rows, split, tokenizer_dir

log = logging.getLogger(__name__)
LOCK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Ack:
    """An acknowledged write: its sequence number, and whether it was a retry of an earlier
    write with the same request id (then nothing new was logged)."""

    seq: int
    replayed: bool = False


class IndexWriter:
    """Upserts and deletes for the index root ``root``; thread-safe.

    ``encoder``: embeds new texts (default: the build's model, loaded on the first text that
    needs it). Unchanged texts reuse the live build's or the log's vectors by content hash;
    ``upsert(..., vectors=...)`` takes precomputed ones.
    """

    def __init__(self, root: str | Path, encoder: Encoder | None = None, *,
                 lock_timeout_seconds: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.root = Path(root)
        self.lock_timeout_seconds = lock_timeout_seconds
        resolve_build_dir(self.root)  # a mistyped root is an error, not a new wal/ in it
        if not (self.root / CURRENT).is_file():  # a build's own directory: no reader looks
            raise MissingArtifactError(  # for a log there, so its writes would never serve
                f"{self.root} is a build, not an index root: give the root that holds "
                "CURRENT and builds/", self.root / CURRENT)
        wal_dir(self.root).mkdir(parents=True, exist_ok=True)
        self._lock_file = open(wal_dir(self.root) / LOCK, "a")  # noqa: SIM115 - held while open
        self._thread_lock = threading.Lock()
        self._encoder = encoder
        self._counter: tuple[Path, TokenCounter] | None = None  # (its directory, it)
        self._fd = -1
        self._segment = 0  # first seq of the segment appended to
        self._end = 0  # where this writer has read (and written) that segment up to
        self._build: Path | None = None  # the live build the state below belongs to
        self._requests: dict[str, tuple[int, str]] = {}  # request id -> (seq, digest)
        # Content hash -> vector of the live build and the log, made on the first text that
        # needs embedding (a writer given vectors never loads the build's: 1M rows is seconds);
        # ``_unhashed``: records whose vectors are not in it yet.
        self._hashes: dict[bytes, np.ndarray] | None = None
        self._unhashed: list[Record] = []
        # Where acknowledged records end (``indexes.wal.log``: tells damage from a torn tail).
        self._acked_fd = -1
        try:
            self._acked_fd = os.open(wal_dir(self.root) / ACKED, os.O_RDWR | os.O_CREAT, 0o644)
            with self._locked():
                pass
        except BaseException:  # e.g. a damaged log: nothing stays open or locked
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """This thread and process alone on the root's log, caught up with it."""
        with self._thread_lock:
            self._raise_if_closed()
            self._take_lock()
            try:
                self._catch_up()
                yield
            finally:
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def _take_lock(self) -> None:
        take_lock(self._lock_file, self.lock_timeout_seconds, self.root)

    def _catch_up(self) -> None:
        """Read what other writers appended since this one last held the lock; reopen on a
        new live build or a new segment (rare: compaction and builds), or when an earlier
        reopen failed and left no segment open."""
        build = resolve_build_dir(self.root)
        existing = segments(self.root)
        if (build != self._build or not existing or existing[-1][0] != self._segment
                or self._fd < 0):
            self._reopen(build)
            return
        path = existing[-1][1]
        if path.stat().st_size == self._end:
            return
        records, end = read_from(path, self._end, after=self.last_seq)
        self._absorb(records)
        self._end = end
        if path.stat().st_size != end:  # a writer died mid-append: truncate its torn tail
            repair_tail(path)

    def reopen(self) -> None:
        """(Re)read the live build and the log tail; repairs a torn tail (under the lock)."""
        with self._thread_lock:
            self._raise_if_closed()
            self._take_lock()
            try:
                self._reopen(resolve_build_dir(self.root))
            finally:
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def _reopen(self, build: Path) -> None:
        self.manifest: Manifest = read_manifest(build)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        existing = segments(self.root)
        if not existing:
            self._start_segment(self.manifest.log_seq + 1)
            self.last_seq = self.manifest.log_seq
        else:
            first, path = existing[-1]
            last, _ = repair_tail(path)
            self.last_seq = max(last, first - 1, self.manifest.log_seq)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._segment = first
            self._end = os.fstat(self._fd).st_size
            write_acked(self._acked_fd, first, self._end)
        held = read_all(self.root)
        records = [r for r in held if r.seq > self.manifest.log_seq]
        self.kinds = merged_kinds(self.manifest.metadata_fields, records,
                                  self.manifest.allow_new_fields)
        self._hashes = None
        self._requests = {}
        self._unhashed = list(records)
        self._remember(held)  # folded ones too: a retry after a compaction is still one
        self._build = build

    def _absorb(self, records: list[Record]) -> None:
        """Another writer's records: its seqs, fields, vectors and request ids are ours too."""
        if not records:
            return
        self.last_seq = max(self.last_seq, records[-1].seq)
        kinds = merged_kinds(self.kinds, records, self.manifest.allow_new_fields)
        if kinds != self.kinds:  # kept as is otherwise: upserts check "is" to skip a recheck
            self.kinds = kinds
        self._unhashed.extend(records)  # their vectors join the reuse map when texts need it
        self._remember(records)

    def _remember(self, records: list[Record]) -> None:
        for record in records:
            if record.request is not None:
                self._requests[record.request[0]] = (record.seq, record.request[1])

    def _start_segment(self, first_seq: int) -> None:
        """Create segment ``first_seq`` and append to it from now on. The segment appended to
        until now is closed only once the new one is open: had creating it failed (no inodes
        or descriptors left) after the close, the writer kept a closed descriptor's number,
        and its next acknowledged write went to whatever file was opened under it next."""
        path = wal_dir(self.root) / segment_name(first_seq)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
            fsync_path(path.parent)
        except BaseException:  # the old segment stays ours; the next catch-up finds this
            os.close(fd)  # one if it was created, and reopens on it
            raise
        previous, self._fd = self._fd, fd
        self._segment = first_seq
        self._end = 0
        if previous >= 0:
            os.close(previous)
        write_acked(self._acked_fd, first_seq, 0)

    def caught_up(self) -> int:
        """The root's last acknowledged seq, by any writer (``last_seq``, caught up)."""
        with self._locked():
            return self.last_seq

    def rotate(self) -> int:
        """Start a new segment for the next record; returns the last seq before it (the
        prefix compaction folds)."""
        with self._locked():
            self._start_segment(self.last_seq + 1)
            return self.last_seq

    def close(self) -> None:
        """Close the log's files; later calls raise ``WriterClosedError``. Waits for a write in
        flight in another thread (its descriptors must not be closed, or reused by a file
        opened meanwhile, under its append)."""
        with self._thread_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._acked_fd >= 0:
                os.close(self._acked_fd)
                self._acked_fd = -1
            if not self._lock_file.closed:
                self._lock_file.close()

    def _raise_if_closed(self) -> None:
        """A write after ``close()`` is a typed error, not Python's "I/O operation on closed
        file"."""
        if self._lock_file.closed:
            raise WriterClosedError(f"this writer of {self.root} is closed: open a new "
                                 "IndexWriter to write")

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ----------------------------------------------------------------------------

    def upsert(self, documents: Iterable[Document | dict[str, Any]],
               vectors: np.ndarray | None = None, *, request_id: str | None = None) -> int:
        """Add or replace documents (by id); returns the record's sequence number once it is
        durable. Raises InvalidWriteError (nothing written) for a missing id or text, a
        duplicate id or a vector of the wrong shape, and SchemaMismatchError for a metadata
        field the index lacks (unless built with ``allow_new_fields``) or of another type.

        In a passage build a document is split as the build split its documents and logged
        whole, with its passages' offsets and vectors (one row each, in ``vectors`` too): it
        replaces every passage of the document's earlier version; ``delete`` removes all.
        ``request_id``: see the module docstring (``upsert_acked`` also says if it was a
        retry)."""
        return self.upsert_acked(documents, vectors, request_id=request_id).seq

    def upsert_acked(self, documents: Iterable[Document | dict[str, Any]],
                     vectors: np.ndarray | None = None, *, request_id: str | None = None
                     ) -> Ack:
        """``upsert``, returning the ``Ack``."""
        self._raise_if_closed()  # before any embedding
        documents = document_list(documents)
        vectors = given_vectors(vectors)
        while True:  # again only when a build that splits otherwise went live meanwhile
            prepared = self._prepare_for_live(documents, vectors, request_id)
            if isinstance(prepared, Ack):
                return prepared
            ack = self._log_upsert(prepared)
            if ack is not None:
                return ack

    def _prepare_for_live(self, documents: list[Document | dict[str, Any]],
                          vectors: np.ndarray | None, request_id: str | None
                          ) -> Ack | tuple[Any, ...]:
        """``_prepare``, once more against the live build when the one this writer last saw
        refused the upsert and is no longer live."""
        try:
            return self._prepare(documents, vectors, request_id)
        except InvalidWriteError:
            if resolve_build_dir(self.root) == self._build:
                raise
            with self._locked():  # checked against a build no longer live: catch up, and
                pass  # check against the live one
            return self._prepare(documents, vectors, request_id)

    def _log_upsert(self, prepared: tuple[Any, ...]) -> Ack | None:
        """Append a prepared upsert under the root's lock; None when the catch-up found a
        build that splits otherwise (whole documents or passages, other lengths) live: its
        rows must be split and embedded again, outside the lock. Embedding under it held every
        other writer, compaction and publish for the encoder's time, and deadlocked: the
        vectors' lookup takes this writer's thread lock, already held."""
        schema, docs, kinds, request, split_as, encoder, _, spans, matrix = prepared
        with self._locked():
            known = self._replayed(request)
            if known is not None:
                return known
            if (self.manifest.encoder.encoder_id, self.manifest.encoder.dim) != (
                    encoder.encoder_id, encoder.dim):  # the catch-up found another model live
                raise EncoderMismatchError(
                    f"the live build {self.manifest.build_id!r} holds vectors of "
                    f"{self.manifest.encoder.encoder_id!r}, not of {encoder.encoder_id!r} "
                    "these were made for; open a new writer with its encoder")
            if passage_config(self.manifest) != split_as:
                return None
            if self.kinds is not schema:  # another writer added a field since: check again
                kinds = merged_schema(docs, self.kinds, self.manifest.allow_new_fields)
            record = Record(self.last_seq + 1, "upsert", tuple(docs), matrix,
                            passages=tuple(spans), request=request,
                            encoder=self.manifest.encoder.encoder_id)
            seq = self._append(record)
            self._unhashed.append(record)
            self.kinds = kinds
        return Ack(seq)

    def _prepare(self, documents: list[Document | dict[str, Any]], vectors: np.ndarray | None,
                 request_id: str | None) -> Ack | tuple[Any, ...]:
        """An upsert checked and embedded against the build this writer last saw, before its
        lock is taken; the ``Ack`` of the earlier write when it repeats one."""
        schema = self.kinds
        docs, kinds = check_documents(documents, schema, self.manifest.allow_new_fields)
        request = _request(request_id, _digest_documents(docs, vectors))
        with self._thread_lock:  # a retry answered from memory costs no embedding
            known = self._replayed(request)
        if known is not None:
            return known
        split_as = passage_config(self.manifest)
        encoder = self.manifest.encoder
        rows, spans = self._rows_of(docs)
        matrix = self._vectors_for(rows, vectors)
        return schema, docs, kinds, request, split_as, encoder, rows, spans, matrix

    def delete(self, ids: Iterable[str], *, request_id: str | None = None) -> int:
        """Delete documents by id (ids absent from the index are no-ops); returns the seq."""
        return self.delete_acked(ids, request_id=request_id).seq

    def delete_acked(self, ids: Iterable[str], *, request_id: str | None = None) -> Ack:
        """``delete``, returning the ``Ack``."""
        self._raise_if_closed()
        checked = check_ids(ids)
        request = _request(request_id, _digest({"delete": checked}))
        with self._locked():
            known = self._replayed(request)
            if known is not None:
                return known
            return Ack(self._append(Record(self.last_seq + 1, "delete", ids=tuple(checked),
                                           request=request)))

    def _replayed(self, request: tuple[str, str] | None) -> Ack | None:
        """The earlier write's ack when ``request`` repeats one; a different write under the
        same request id is ``RequestReplayError``."""
        if request is None or request[0] not in self._requests:
            return None
        seq, digest = self._requests[request[0]]
        if digest != request[1]:
            raise RequestReplayError(
                f"request id {request[0]!r} was used for a different write (seq {seq}); "
                "a retry must resend the same body, a new write needs a new request id")
        return Ack(seq, replayed=True)

    def _rows_of(self, docs: list[Document]) -> tuple[list[Document], list[Spans]]:
        """The index rows of ``docs``: themselves, or in a passage build their passages
        (split as the build split its documents) with each document's offsets."""
        config = passage_config(self.manifest)
        if config is None:
            return docs, []
        return split(docs, self.token_counter(), config)

    def token_counter(self) -> TokenCounter:
        """The tokenizer passages are counted with (``tokenizer_dir``)."""
        directory = self.tokenizer_dir()
        if self._counter is None or self._counter[0] != directory:  # a new build may differ
            self._counter = (directory, TokenCounter.for_model(directory))
        return self._counter[1]

    def tokenizer_dir(self) -> Path:
        """The live build's recorded tokenizer, else the encoder's, else the packaged
        model's (``indexes.wal.split.tokenizer_dir``)."""
        return tokenizer_dir(self._encoder, passage_config(self.manifest))

    def _append(self, record: Record) -> int:
        """Append ``record``, fsync it and return its seq (acknowledged).

        A write that fails before the whole record is in the file is truncated: readers stop
        at a partial record, so none served it and its seq is free again. Once it is whole, a
        reader may already serve it: a failed fsync (or ACKED update) then keeps the record
        and its seq, which no later write reuses, and raises ``ArtifactError`` saying whether
        it survives a crash is unknown. Truncating it instead had the next write take its
        seq: a follower that read it in between served a write never acknowledged, then
        skipped the acknowledged one under the same seq.
        """
        data = encode_record(record)
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
        except OSError:
            os.ftruncate(self._fd, size)  # never leave a partial record behind a later one
            raise
        self._end = size + len(data)
        try:
            os.fsync(self._fd)
            write_acked(self._acked_fd, self._segment, self._end)
        except OSError as error:
            self._absorb([record])  # logged: its seq, fields and request id as any record's
            raise ArtifactError(
                f"seq {record.seq} was appended to {self._segment_path()} but could not be "
                f"made durable ({error}): readers may serve it, whether it survives a crash "
                "is unknown, and no later write reuses its seq (a retry under its request id "
                "is answered with it); check the disk", self._segment_path()) from error
        self.last_seq = record.seq
        self._remember([record])
        return record.seq

    def _segment_path(self) -> Path:
        return wal_dir(self.root) / segment_name(self._segment)

    # -- vectors ---------------------------------------------------------------------------

    def _vectors_for(self, docs: Sequence[Document], given: np.ndarray | None) -> np.ndarray:
        dim = self.manifest.encoder.dim
        if given is None:
            return self.vectors_for_texts([d.content for d in docs])
        matrix = np.asarray(given, dtype=np.float32)
        if matrix.shape != (len(docs), dim):
            unit = ("passage (a passage build: indexes.wal.split.split gives the passages)"
                    if self.manifest.passages is not None else "document")
            raise InvalidWriteError(
                f"vectors have shape {matrix.shape}; expected ({len(docs)}, {dim}): one "
                f"{dim}-dimensional row per {unit}, from the index's encoder "
                f"{self.manifest.encoder.encoder_id!r}")
        if (row := non_finite_row(matrix)) is not None:  # logged, it would fail every rebuild
            raise InvalidWriteError(f"vector row {row} holds NaN or infinity: give finite "
                                    "vectors")
        if (row := out_of_range_row(matrix, self.manifest.encoder.vector_dtype)) is not None:
            raise InvalidWriteError(f"vector row {row} holds a value past {FLOAT16_MAX:,.0f}, "
                                    "which this index's float16 vectors cannot hold: give "
                                    "normalized vectors")
        return matrix

    def vectors_for_texts(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), dim): known vectors by content hash, the rest encoded."""
        matrix = np.zeros((len(texts), self.manifest.encoder.dim), dtype=np.float32)
        with self._thread_lock:
            known = self._hashes if self._hashes is not None else self._build_vectors()
            pending, self._unhashed = self._unhashed, []
            known.update(self._known_vectors_of(pending))
            self._hashes = known
        keys = [bytes(k) for k in content_hashes(list(texts))]
        todo = [i for i, key in enumerate(keys) if key not in known]
        for i, key in enumerate(keys):
            if key in known:
                matrix[i] = known[key]
        if todo:
            matrix[todo] = self._encode([texts[i] for i in todo])
        return matrix

    def compact(self, progress: bool = False) -> CompactionReport:
        """Fold the log into a new published build (``indexes.compaction``)."""
        return compact(self, progress)

    def _encode(self, texts: list[str]) -> np.ndarray:
        info = self.manifest.encoder
        if self._encoder is None:
            if info.model != DEFAULT_MODEL:
                raise InvalidWriteError(
                    f"this index's vectors come from {info.encoder_id!r}, which this writer "
                    "cannot load: pass vectors=... with each upsert, or IndexWriter(root, "
                    "encoder=...)")
            from indexes.encoders import SentenceTransformerEncoder

            self._encoder = SentenceTransformerEncoder()
        if (not compatible_query_encoder(self._encoder.encoder_id, info.encoder_id)
                or self._encoder.dim != info.dim):
            raise EncoderMismatchError(
                f"encoder {self._encoder.encoder_id!r} does not match the index's "
                f"{info.encoder_id!r}; write with the encoder the index was built with")
        return np.asarray(self._encoder.encode(texts), dtype=np.float32)

    def _build_vectors(self) -> dict[bytes, np.ndarray]:
        """Content hash -> float32 vector of the live build (build.py's reuse rule: exact
        float32 vectors only)."""
        if self.manifest.encoder.vector_dtype != "float32":
            return {}
        hashes, store = stored_vectors(resolve_build_dir(self.root))  # whole or sharded
        return {bytes(h): store.data[row] for row, h in enumerate(hashes)}

    @staticmethod
    def _known_vectors_of(records: list[Record]) -> dict[bytes, np.ndarray]:
        known: dict[bytes, np.ndarray] = {}
        for record in records:
            rows, vectors = record_rows(record)
            keys = content_hashes([d.content for d in rows])
            for key, row in zip(keys, vectors, strict=True):
                known[bytes(key)] = row
        return known


def _request(request_id: str | None, digest: str) -> tuple[str, str] | None:
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not request_id.strip() or len(request_id) > 200:
        raise InvalidWriteError(f"request id {request_id!r} must be a non-empty string of at "
                                "most 200 characters")
    return request_id, digest


def _digest_documents(docs: Sequence[Document], vectors: np.ndarray | None) -> str:
    given = None if vectors is None else hashlib.sha256(
        np.ascontiguousarray(vectors, dtype="<f4").tobytes()).hexdigest()
    return _digest({"docs": [[d.id, d.title, d.text, d.metadata] for d in docs],
                    "vectors": given})


def _digest(what: Any) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, ensure_ascii=False)
                          .encode("utf-8")).hexdigest()[:32]
