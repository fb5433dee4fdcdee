"""The one writer of an index root: validates, embeds, appends, fsyncs, then acknowledges.

``IndexWriter(root).upsert(documents)`` and ``.delete(ids)`` each append one record (all of
the call or none of it) and return its sequence number once the record is on disk. An
exclusive ``fcntl`` lock on ``<root>/wal/.writer.lock`` (held while the writer is open) keeps a
second writer, in this or another process, out with ``WriterLockedError``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.compaction import CompactionReport, compact
from indexes.docstore import Document
from indexes.encoders import DEFAULT_MODEL, Encoder, compatible_query_encoder
from indexes.errors import EncoderMismatchError, InvalidWriteError, WriterLockedError
from indexes.manifest import Manifest, read_manifest, resolve_build_dir
from indexes.passages import TokenCounter
from indexes.sharding.layout import stored_vectors
from indexes.storage import fsync_dir
from indexes.vectors import content_hashes
from indexes.wal.checks import check_documents, check_ids, merged_kinds
from indexes.wal.log import (
    ACKED,
    Record,
    encode_record,
    read_all,
    repair_tail,
    segment_name,
    segments,
    wal_dir,
    write_acked,
)
from indexes.wal.split import Spans, passage_config, record_rows, split, tokenizer_dir

log = logging.getLogger(__name__)
LOCK = ".writer.lock"


class IndexWriter:
    """Upserts and deletes for the index root ``root``; thread-safe, one per root at a time.

    ``encoder``: embeds new texts (default: the build's model, loaded on the first text that
    needs it). Unchanged texts reuse the live build's or the log's vectors by content hash;
    ``upsert(..., vectors=...)`` takes precomputed ones.
    """

    def __init__(self, root: str | Path, encoder: Encoder | None = None) -> None:
        self.root = Path(root)
        wal_dir(self.root).mkdir(parents=True, exist_ok=True)
        self._lock_file = open(wal_dir(self.root) / LOCK, "a")  # noqa: SIM115 - held while open
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            raise WriterLockedError(
                f"another writer holds {wal_dir(self.root) / LOCK}; one writer per index root "
                "at a time: close the other IndexWriter (or wait for its command to end)"
            ) from exc
        self._thread_lock = threading.Lock()
        self._encoder = encoder
        self._counter: TokenCounter | None = None
        self._fd = -1
        self._segment = 0  # first seq of the segment appended to
        # Where acknowledged records end (``indexes.wal.log``: tells damage from a torn tail).
        self._acked_fd = os.open(wal_dir(self.root) / ACKED, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.reopen()
        except BaseException:  # e.g. a damaged log: nothing stays open or locked
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def reopen(self) -> None:
        """(Re)read the live build and the log tail; repairs a torn tail (under the lock)."""
        with self._thread_lock:
            self._reopen()

    def _reopen(self) -> None:
        self.manifest: Manifest = read_manifest(resolve_build_dir(self.root))
        if self._fd >= 0:
            os.close(self._fd)
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
            write_acked(self._acked_fd, first, os.fstat(self._fd).st_size)
        records = read_all(self.root, after=self.manifest.log_seq)
        self.kinds = merged_kinds(self.manifest.metadata_fields, records)
        self._hashes = self._known_vectors(records)

    def _start_segment(self, first_seq: int) -> None:
        path = wal_dir(self.root) / segment_name(first_seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.fsync(self._fd)
        fsync_dir(path.parent)
        self._segment = first_seq
        write_acked(self._acked_fd, first_seq, 0)

    def rotate(self) -> int:
        """Start a new segment for the next record; returns the last seq before it (the
        prefix compaction folds)."""
        with self._thread_lock:
            if self._fd >= 0:
                os.close(self._fd)
            self._start_segment(self.last_seq + 1)
            return self.last_seq

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._acked_fd >= 0:
            os.close(self._acked_fd)
            self._acked_fd = -1
        if not self._lock_file.closed:
            self._lock_file.close()  # releases the flock

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ----------------------------------------------------------------------------

    def upsert(self, documents: Iterable[Document | dict[str, Any]],
               vectors: np.ndarray | None = None) -> int:
        """Add or replace documents (by id); returns the record's sequence number once it is
        durable. Raises InvalidWriteError (nothing written) for a missing id or text, a
        duplicate id, a vector of the wrong shape or a metadata value of the wrong type.

        In a passage build a document is split as the build split its documents and logged
        whole, with its passages' offsets and vectors (one row each, in ``vectors`` too): it
        replaces every passage of the document's earlier version; ``delete`` removes all."""
        docs, kinds = check_documents(documents, self.kinds)
        rows, spans = self._rows_of(docs)
        matrix = self._vectors_for(rows, vectors)
        with self._thread_lock:
            seq = self._append(Record(self.last_seq + 1, "upsert", tuple(docs), matrix,
                                      passages=tuple(spans)))
            for key, row in zip(content_hashes([d.content for d in rows]), matrix,
                                strict=True):
                self._hashes[bytes(key)] = row
            self.kinds = kinds
        return seq

    def delete(self, ids: Iterable[str]) -> int:
        """Delete documents by id (ids absent from the index are no-ops); returns the seq."""
        checked = check_ids(ids)
        with self._thread_lock:
            return self._append(Record(self.last_seq + 1, "delete", ids=tuple(checked)))

    def _rows_of(self, docs: list[Document]) -> tuple[list[Document], list[Spans]]:
        """The index rows of ``docs``: themselves, or in a passage build their passages
        (split as the build split its documents) with each document's offsets."""
        config = passage_config(self.manifest)
        if config is None:
            return docs, []
        return split(docs, self.token_counter(), config)

    def token_counter(self) -> TokenCounter:
        """The tokenizer passages are counted with (the encoder's, else the packaged model's)."""
        if self._counter is None:
            self._counter = TokenCounter.for_model(self.tokenizer_dir())
        return self._counter

    def tokenizer_dir(self) -> Path:
        return tokenizer_dir(self._encoder)

    def _append(self, record: Record) -> int:
        data = encode_record(record)
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, size)  # never leave a partial record behind a later one
            raise
        write_acked(self._acked_fd, self._segment, size + len(data))
        self.last_seq = record.seq
        return record.seq

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
        return matrix

    def vectors_for_texts(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), dim): known vectors by content hash, the rest encoded."""
        matrix = np.zeros((len(texts), self.manifest.encoder.dim), dtype=np.float32)
        keys = [bytes(k) for k in content_hashes(list(texts))]
        todo = [i for i, key in enumerate(keys) if key not in self._hashes]
        for i, key in enumerate(keys):
            if key in self._hashes:
                matrix[i] = self._hashes[key]
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

    def _known_vectors(self, records: list[Record]) -> dict[bytes, np.ndarray]:
        """Content hash -> float32 vector, from the live build and the log (build.py's reuse
        rule: exact float32 vectors only)."""
        known: dict[bytes, np.ndarray] = {}
        build = resolve_build_dir(self.root)
        if self.manifest.encoder.vector_dtype == "float32":  # whole or sharded
            hashes, store = stored_vectors(build)
            known = {bytes(h): store.data[row] for row, h in enumerate(hashes)}
        for record in records:
            rows, vectors = record_rows(record)
            keys = content_hashes([d.content for d in rows])
            for key, row in zip(keys, vectors, strict=True):
                known[bytes(key)] = row
        return known
