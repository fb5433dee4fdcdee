"""Writes over HTTP: upsert and delete documents, fetch them by id, and take a snapshot.

Every worker opens its own ``IndexWriter`` of the root on its first write; the root's append
lock makes them one writer at a time, and each catches up with the others' records under it
(``indexes.writer``), so any worker can take a write and the log keeps one order. A write is
answered once its record is fsync'd, with its sequence number; a search or fetch passing it
as ``min_seq`` sees the write on whichever worker answers (the worker reads the log at once
if its follower has not applied it yet). Every worker's follower applies new records within
``live_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from indexes.errors import InvalidWriteError, LimitExceededError
from indexes.snapshot import take_snapshot
from indexes.writer import IndexWriter
from retrieval.service.admission import Admission
from retrieval.service.bodies import json_response, parse_body
from retrieval.service.errors import ServiceUnavailableError
from retrieval.service.schemas import (
    DeleteBody,
    FetchBody,
    FetchResult,
    StoredDocument,
    UpsertBody,
    WriteAck,
    WriteDocument,
)
from retrieval.service.settings import ServerSettings
from retrieval.service.state import ServiceState


class Writes:
    """This worker's writer of the index root, opened on its first write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._writer: IndexWriter | None = None
        self._lock = threading.Lock()

    def writer(self) -> IndexWriter:
        with self._lock:
            if self._writer is None:
                self._writer = IndexWriter(self.root)
            return self._writer

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None


def write_routes(state: ServiceState, writes: Writes, settings: ServerSettings,
                 admission: Admission) -> list[Route]:
    limit = settings.max_write_documents

    async def upsert(request: Request) -> Response:
        with admission.admit():  # before the body is parsed, as a search
            body = await parse_body(request, UpsertBody)
            check_count(len(body.documents), limit, "documents")
            documents = [{"id": d.id, "text": d.text, "title": d.title, "metadata": d.metadata}
                         for d in body.documents]
            vectors = given_vectors(body.documents)
            ack = await asyncio.to_thread(_upsert, writes, documents, vectors, body.request_id)
        return json_response(WriteAck(seq=ack.seq, replayed=ack.replayed))

    async def delete(request: Request) -> Response:
        with admission.admit():
            body = await parse_body(request, DeleteBody)
            check_count(len(body.ids), limit, "ids")
            ack = await asyncio.to_thread(
                lambda: writes.writer().delete_acked(body.ids, request_id=body.request_id))
        return json_response(WriteAck(seq=ack.seq, replayed=ack.replayed))

    async def fetch(request: Request) -> Response:
        with admission.admit():
            body = await parse_body(request, FetchBody)
            check_count(len(body.ids), limit, "ids")
            retriever = state.retriever()
            found = await asyncio.to_thread(retriever.get_documents, body.ids,
                                            min_seq=body.min_seq)
        documents = [StoredDocument(id=d.id, text=d.text, title=d.title, metadata=d.metadata)
                     for d in found if d is not None]
        missing = [doc_id for doc_id, d in zip(body.ids, found, strict=True) if d is None]
        return json_response(FetchResult(documents=documents, missing=missing,
                                         applied_seq=retriever.applied_seq))

    async def snapshot(_: Request) -> Response:
        """The root as one snapshot file (admin scope), taken while writes go on; restore
        it with ``retrieval restore FILE ROOT`` where the new root is to be served."""
        with room_for_a_copy():
            directory = tempfile.mkdtemp(prefix="retrieval-snapshot-")
        try:
            with admission.admit(), room_for_a_copy():
                report = await asyncio.to_thread(take_snapshot, writes.root,
                                                 Path(directory) / "snapshot.tar")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return TemporaryFileResponse(Path(directory), report.file,
                                     media_type="application/x-tar",
                                     filename=f"{report.build_id}+{report.last_seq}.tar",
                                     headers={"x-snapshot-build": report.build_id,
                                              "x-snapshot-seq": str(report.last_seq)})

    return [Route("/v1/documents", upsert, methods=["POST"]),
            Route("/v1/documents/delete", delete, methods=["POST"]),
            Route("/v1/documents/get", fetch, methods=["POST"]),
            Route("/v1/snapshot", snapshot, methods=["POST"])]


class TemporaryFileResponse(FileResponse):
    """A file response that removes the file's folder however the sending ends. A
    background task would run only after a complete send, so a client gone mid-download (the
    server's send raising) would leave a whole copy of the index root in TMPDIR."""

    def __init__(self, directory: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.directory = directory

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # shielded: a cancelled request (a server shutting down) still removes it
            with anyio.CancelScope(shield=True):  # in a thread: a large copy takes a while
                await anyio.to_thread.run_sync(shutil.rmtree, self.directory, True)


# A write refused for want of room: the disk full, a quota reached, a file size limit.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextmanager
def room_for_a_copy() -> Iterator[None]:
    """A snapshot is written whole to the server's temporary directory before it is sent:
    no room there is the server's condition (a 503 saying so), not a bug (a bare 500)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        raise ServiceUnavailableError(
            "the server's temporary directory has no room for a copy of the index root "
            f"({exc.strerror}): a snapshot is written there whole before it is sent; free "
            "space there, or start the server with TMPDIR naming a directory on a file "
            "system with room for the whole root") from exc


def _upsert(writes: Writes, documents: list[dict[str, Any]], vectors: np.ndarray | None,
            request_id: str | None) -> Any:
    return writes.writer().upsert_acked(documents, vectors, request_id=request_id)


def check_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise LimitExceededError(f"the request has {count} {what}, more than the limit "
                                 f"{limit}; split it or raise server.max_write_documents")


def given_vectors(documents: list[WriteDocument]) -> np.ndarray | None:
    """The documents' precomputed vectors as one matrix: every document's, or none."""
    given = [d.vector is not None for d in documents]
    if not any(given):
        return None
    if not all(given):
        missing = next(d.id for d in documents if d.vector is None)
        raise InvalidWriteError(f"document {missing!r} has no vector while others have one: "
                                "give every document of a request a vector, or none (the "
                                "server then embeds the texts)")
    strings = [d.vector for d in documents if isinstance(d.vector, str)]
    if (len(strings) == len(documents) and len(strings[0]) % 4 == 0
            and all(len(s) == len(strings[0]) and "=" not in s for s in strings)):
        try:  # unpadded base64 rows join into one: one decode for the whole batch
            raw = base64.b64decode("".join(strings), validate=True)
        except binascii.Error:
            raw = b""
        if raw and len(raw) % (4 * len(documents)) == 0:  # else as_row names the bad row
            return np.frombuffer(raw, "<f4").reshape(len(documents), -1).astype(np.float32)
    rows = [as_row(d.id, d.vector) for d in documents]
    if len({row.shape[0] for row in rows}) != 1:
        raise InvalidWriteError("the documents' vectors differ in length: each must have the "
                                "index's dimension")
    return np.stack(rows)


def as_row(doc_id: str, vector: list[float] | str | None) -> np.ndarray:
    if not isinstance(vector, str):
        return np.asarray(vector, dtype=np.float32)
    try:
        raw = base64.b64decode(vector, validate=True)
    except binascii.Error as exc:
        raise InvalidWriteError(f"document {doc_id!r}: vector is not valid base64 ({exc}); "
                                "send the float32 bytes base64-encoded, or a list of numbers"
                                ) from None
    if len(raw) % 4:
        raise InvalidWriteError(f"document {doc_id!r}: the base64 vector holds {len(raw)} "
                                "bytes, not a whole number of float32 values")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)
