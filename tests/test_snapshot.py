"""Snapshots of an index root (``indexes.snapshot``, ``retrieval snapshot`` / ``restore``): taken
while writes stream in, a snapshot restores to a root that verifies and answers exactly like
the source cut at the snapshot's sequence; a damaged, unsafe or misdirected restore leaves
nothing behind."""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import os
import resource
import shutil
import signal
import stat
import tarfile
import tempfile
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from live_index import build_small, scifact_docs, unit_vectors

from indexes import Document
from indexes.errors import ArtifactError, CorruptArtifactError, MissingArtifactError
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.restore import log_id, restore_snapshot
from indexes.snapshot import (
    SNAPSHOT_JSON,
    RestoreTargetError,
    SnapshotCorruptError,
    UnsafeMemberError,
    take_snapshot,
)
from indexes.wal.log import ACKED, scan, segments, wal_dir
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.cli import main

N_BASE = 100


@pytest.fixture(scope="module")
def docs(dataset) -> list[Document]:
    return scifact_docs(dataset("scifact"), 160)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    """A root whose live build folded two records (log_seq 2), with two more in the log."""
    root = tmp_path / "source"
    build_small(root, docs[:N_BASE])
    with IndexWriter(root) as writer:
        writer.delete([docs[0].id])
        writer.upsert([docs[N_BASE]], vectors=unit_vectors(1, 1))
        writer.compact()
        writer.delete([docs[1].id])
        writer.upsert([docs[N_BASE + 1]], vectors=unit_vectors(1, 2))
    return root


class Stream:
    """A background writer: alternately upserts a new document and deletes a base one, each
    acknowledged, while fewer than ``budget`` records are (so a fast disk cannot run it out of
    documents before the test is done), compacting every ``compact_every`` pairs."""

    def __init__(self, root: Path, docs: list[Document], deletes: list[str],
                 compact_every: int = 0) -> None:
        self.writer = IndexWriter(root)
        self.docs, self.deletes, self.compact_every = docs, deletes, compact_every
        self.acked: list[int] = []
        self.budget = 0
        self.changed = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for i, doc in enumerate(self.docs):
                with self.changed:
                    self.changed.wait_for(lambda: self.stopped or len(self.acked) < self.budget)
                    if self.stopped:
                        return
                self.acked.append(self.writer.upsert([doc], vectors=unit_vectors(1, 100 + i)))
                self.acked.append(self.writer.delete([self.deletes[i % len(self.deletes)]]))
                if self.compact_every and (i + 1) % self.compact_every == 0:
                    self.writer.compact()  # publishes a build and retires segments
        finally:
            self.writer.close()

    def allow(self, records: int) -> None:
        with self.changed:
            self.budget = records
            self.changed.notify_all()

    def wait_for(self, count: int) -> None:
        self.allow(max(self.budget, count))
        while len(self.acked) < count and self.thread.is_alive():
            time.sleep(0.001)
        assert len(self.acked) >= count, "the stream ended early"

    def end(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()
        self.thread.join(timeout=30)


def cut_copy(source: Path, target: Path, seq: int) -> Path:
    """A copy of ``source`` whose log ends after record ``seq`` (the source at that seq)."""
    shutil.copytree(source, target)
    (wal_dir(target) / ACKED).unlink(missing_ok=True)
    for first, path in segments(target):
        if first > seq:
            path.unlink()
            continue
        ends = [end for s, end, _ in scan(path.read_bytes(), path=path) if s <= seq]
        with open(path, "r+b") as handle:
            handle.truncate(ends[-1] if ends else 0)
    return target


def expected_docs(stream: Stream, seq: int) -> tuple[int, str, str]:
    """After the fixture's 4 records the stream alternates upsert (a new doc) and delete (a
    base doc): (live documents, id of the last doc upserted by ``seq``, id of the next)."""
    upserts = (seq - 4 + 1) // 2
    return 100 + (seq - 4) % 2, stream.docs[upserts - 1].id, stream.docs[upserts].id


def found(retriever: Retriever, doc: Document) -> bool:
    hits = retriever.search(doc.text[:200], k=5, query_vector=unit_vectors(1, 3)[0]).hits
    return doc.id in {h.doc_id for h in hits}


def load(root: Path) -> Retriever:
    return Retriever.load(root, {"cache": {"backend": "none"}, "live_lag_seconds": None})


def answers(retriever: Retriever, docs: list[Document]) -> list[list[tuple[str, float]]]:
    queries = [d.text[:120] for d in docs[::9]] + ["telomerase", "cell biology"]
    vectors = unit_vectors(len(queries), 7)
    out = []
    for query, vector in zip(queries, vectors, strict=True):
        for filters in (None, "year >= 2005"):
            result = retriever.search(query, filters, k=200, query_vector=vector)
            out.append([(h.doc_id, round(h.score, 5)) for h in result.hits])
    return out


def test_a_snapshot_during_a_write_stream_restores_to_the_source_at_its_seq(
        root, docs, tmp_path):
    stream = Stream(root, docs[N_BASE + 2:], [d.id for d in docs[2:60]])
    stream.wait_for(6)
    stream.allow(40)  # writes go on while the snapshot reads the root
    report = take_snapshot(root, tmp_path / "snap.tar")
    stream.wait_for(report.last_seq - 4 + 6)  # and after it read the log
    stream.end()
    assert report.log_seq == 2 and 4 + 6 <= report.last_seq < stream.acked[-1]

    restored = restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    assert (restored.build_id, restored.last_seq) == (report.build_id, report.last_seq)
    assert (restored.files, restored.bytes) == (report.files, report.bytes)
    assert main(["verify", str(tmp_path / "restored")]) == 0
    reference = cut_copy(root, tmp_path / "reference", report.last_seq)
    with load(tmp_path / "restored") as mine, load(reference) as theirs:
        expected = f"{report.build_id}+{report.last_seq}"
        assert theirs.snapshot.build_id == expected  # the restored root's log has its own id
        assert mine.snapshot.build_id == (f"{report.build_id}+"
                                          f"{log_id(tmp_path / 'restored')}+{report.last_seq}")
        n_docs, last, following = expected_docs(stream, report.last_seq)
        assert mine.snapshot.manifest.n_docs == theirs.snapshot.manifest.n_docs == n_docs
        by_id = {d.id: d for d in docs}
        assert found(mine, by_id[last]) and not found(mine, by_id[following])
        assert answers(mine, docs) == answers(theirs, docs)
    # The restored root takes writes: its writer continues after the snapshot's seq.
    with IndexWriter(tmp_path / "restored") as writer:
        assert writer.delete([docs[5].id]) == report.last_seq + 1


def test_snapshots_taken_while_compactions_run_hold_every_record_up_to_their_seq(
        root, docs, tmp_path):
    stream = Stream(root, docs[N_BASE + 2:], [d.id for d in docs[2:60]], compact_every=3)
    reports = []
    for i in range(4):
        stream.wait_for(6 * (i + 1))
        stream.allow(6 * (i + 2))
        reports.append(take_snapshot(root, tmp_path / f"snap-{i}.tar"))
    stream.end()
    by_id = {d.id: d for d in docs}
    for i, report in enumerate(reports):
        restored = tmp_path / f"restored-{i}"
        restore_snapshot(tmp_path / f"snap-{i}.tar", restored)
        assert read_manifest(resolve_build_dir(restored)).log_seq == report.log_seq
        n_docs, last, following = expected_docs(stream, report.last_seq)
        with load(restored) as mine:
            assert mine.snapshot.manifest.n_docs == n_docs
            assert found(mine, by_id[last]) and not found(mine, by_id[following])
    assert report.log_seq > 2  # the stream's compactions published builds meanwhile


def test_segments_the_live_build_folded_are_left_out(root, tmp_path):
    """Segments the live build folded stay while its rollback target lacks their records
    (``indexes.going_live``): a snapshot, which holds the live build only, leaves them out."""
    with IndexWriter(root) as writer:
        assert writer.compact().log_seq == 4
    assert len(segments(root)) == 2  # the folded one, kept for a rollback, and the new one
    report = take_snapshot(root, tmp_path / "snap.tar")
    assert (report.log_seq, report.last_seq) == (4, 4)
    with tarfile.open(tmp_path / "snap.tar") as tar:
        wal = [n for n in tar.getnames() if n.startswith("wal/")]
    assert wal == [f"wal/{segments(root)[-1][1].name}"]
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    assert main(["verify", str(tmp_path / "restored")]) == 0


def test_a_sharded_root_round_trips(docs, tmp_path):
    source = tmp_path / "source"
    build_small(source, docs[:N_BASE], shards=2)
    with IndexWriter(source) as writer:
        writer.delete([docs[3].id])
        writer.upsert([docs[N_BASE]], vectors=unit_vectors(1, 4))
    report = take_snapshot(source, tmp_path / "snap.tar")
    assert report.last_seq == 2
    with tarfile.open(tmp_path / "snap.tar") as tar:
        assert any("/shards/shard-001/" in name for name in tar.getnames())
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    with load(tmp_path / "restored") as mine, load(source) as theirs:
        assert answers(mine, docs) == answers(theirs, docs)


@pytest.mark.parametrize("damage", ["flipped", "removed"])
def test_a_damaged_shard_file_is_not_snapshotted(docs, tmp_path, damage):
    """Only the top manifest was checked, which names shards.json and the shard manifests:
    a flipped byte in a shard's file or a shard's file removed was snapshotted without a
    word, and the snapshot was refused only at restore."""
    source = tmp_path / "source"
    build_small(source, docs[:40], shards=2)
    path = resolve_build_dir(source) / "shards" / "shard-001" / "bm25" / "impacts.npy"
    if damage == "flipped":
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    error = CorruptArtifactError if damage == "flipped" else MissingArtifactError
    with pytest.raises(error, match="shard-001/bm25/impacts.npy"):
        take_snapshot(source, tmp_path / "snap.tar")
    assert not (tmp_path / "snap.tar").exists()


def member_offsets(file: Path) -> dict[str, tuple[int, int]]:
    with tarfile.open(file) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


@pytest.mark.parametrize("kind", ["vectors", "wal"])
def test_a_flipped_byte_names_the_member_and_leaves_no_root(root, tmp_path, kind):
    file = tmp_path / "snap.tar"
    take_snapshot(root, file)
    name = next(n for n in member_offsets(file) if f"/{kind}/" in f"/{n}")
    offset, size = member_offsets(file)[name]
    data = bytearray(file.read_bytes())
    data[offset + size // 2] ^= 0x01
    file.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptError, match="does not match") as caught:
        restore_snapshot(file, tmp_path / "restored")
    assert caught.value.member == name and name in str(caught.value)
    assert not (tmp_path / "restored").exists()
    assert not list(tmp_path.glob(".restored.restore-*"))


def test_a_file_cut_inside_its_snapshot_json_is_a_corrupt_snapshot(root, tmp_path):
    """tarfile's ReadError came through as a traceback."""
    file = tmp_path / "snap.tar"
    take_snapshot(root, file)
    offset, size = member_offsets(file)["SNAPSHOT.json"]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(file.read_bytes()[:offset + size // 2])
    with pytest.raises(SnapshotCorruptError, match="damaged"):
        restore_snapshot(cut, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_restore_refuses_a_root_that_is_not_empty(root, tmp_path):
    take_snapshot(root, tmp_path / "snap.tar")
    target = tmp_path / "busy"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(RestoreTargetError, match="not empty") as caught:
        restore_snapshot(tmp_path / "snap.tar", target)
    assert caught.value.path == target and str(target) in str(caught.value)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()  # an empty directory is a fine target
    assert restore_snapshot(tmp_path / "snap.tar", tmp_path / "empty").last_seq == 4


def test_a_snapshot_is_not_written_inside_the_root_or_over_another_file(root, tmp_path):
    """Written over CURRENT it left the root unloadable (every command a UnicodeDecodeError
    traceback); elsewhere in the root each snapshot held the ones before; and any file was
    replaced (run as root, /etc/passwd was)."""
    for inside in (root / "CURRENT", root / "snap.tar"):
        with pytest.raises(ArtifactError, match="inside the index root"):
            take_snapshot(root, inside)
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    with pytest.raises(ArtifactError, match="exists and is not a snapshot"):
        take_snapshot(root, other)
    assert other.read_text() == "keep me"
    take_snapshot(root, tmp_path / "snap.tar")
    assert take_snapshot(root, tmp_path / "snap.tar").last_seq == 4  # a snapshot is replaced
    (tmp_path / "made-by-mktemp").touch()  # an empty file, as a wrapper makes one: taken
    assert take_snapshot(root, tmp_path / "made-by-mktemp").last_seq == 4
    (root / "CURRENT").write_bytes(b"\xff\xfe not a build id")
    with pytest.raises(CorruptArtifactError, match="not the name of a build"):
        resolve_build_dir(root)


def evil_tar(source: Path, target: Path, member: tarfile.TarInfo, data: bytes) -> Path:
    """A copy of the snapshot ``source`` with one more member after SNAPSHOT.json."""
    with tarfile.open(source) as tar, tarfile.open(target, "w") as out:
        head = tar.getmember(SNAPSHOT_JSON)
        out.addfile(head, tar.extractfile(head))
        out.addfile(member, io.BytesIO(data))
        for info in tar.getmembers()[1:]:
            out.addfile(info, tar.extractfile(info))
    return target


@pytest.mark.parametrize("name", ["../evil", "/tmp/evil-absolute", "wal/../../evil",
                                  "link-to-etc"])
def test_a_member_outside_the_root_or_not_a_file_is_refused(root, tmp_path, name):
    take_snapshot(root, tmp_path / "snap.tar")
    member = tarfile.TarInfo(name)
    if name == "link-to-etc":
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    data = b"" if member.issym() else b"owned\n"
    member.size = len(data)
    bad = evil_tar(tmp_path / "snap.tar", tmp_path / "evil.tar", member, data)
    target = tmp_path / "deep" / "restored"
    with pytest.raises(UnsafeMemberError) as caught:
        restore_snapshot(bad, target)
    assert caught.value.member == name
    assert not target.exists() and not (tmp_path / "evil").exists()
    assert not (tmp_path / "deep" / "evil").exists()


def test_cli_round_trip(root, docs, tmp_path, capsys):
    file, restored = tmp_path / "snap.tar", tmp_path / "restored"
    build_id = read_manifest(resolve_build_dir(root)).build_id
    assert main(["snapshot", str(root), str(file)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"snapshot of build {build_id} up to seq 4: ")
    counts = line.split(": ", 1)[1].split(" written")[0]  # "N files, B bytes"
    assert main(["restore", str(file), str(restored)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"restored build {build_id} up to seq 4: {counts} verified into {restored}"
    assert main(["verify", str(restored)]) == 0
    assert "write-ahead log, " in capsys.readouterr().out
    assert main(["restore", str(file), str(restored)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["restore", str(tmp_path / "missing.tar"), str(tmp_path / "r2")]) == 2
    assert "no snapshot file" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a tar")
    assert main(["restore", str(tmp_path / "notes.txt"), str(tmp_path / "r3")]) == 2
    assert "is not a snapshot" in capsys.readouterr().err and not (tmp_path / "r3").exists()


def test_the_roots_own_files_travel_with_it(root, tmp_path):
    """A root's calibration (relevance.json) and distilled encoder sit beside its builds: a
    restore without them ranked with the shipped calibration instead, silently."""
    (root / "relevance.json").write_text('{"calibration": "this root"}')
    (root / "distilled").mkdir()
    (root / "distilled" / "weights.bin").write_bytes(bytes(range(256)))
    (root / ".stale.lock").write_text("")
    take_snapshot(root, tmp_path / "snap.tar")
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    restored = tmp_path / "restored"
    assert (restored / "relevance.json").read_text() == '{"calibration": "this root"}'
    assert (restored / "distilled" / "weights.bin").read_bytes() == bytes(range(256))
    assert not (restored / ".stale.lock").exists()


SIGTERM_MIDWAY = r"""
import os, signal, sys
import indexes.restore, indexes.snapshot
from retrieval.cli import main
module, name = (indexes.snapshot, "_add") if sys.argv[1] == "snapshot" else \
    (indexes.restore, "_write_member")
real = getattr(module, name)
def then_terminated(*args):  # the first member copied, then a stop (systemd, a timeout)
    real(*args)
    os.kill(os.getpid(), signal.SIGTERM)
setattr(module, name, then_terminated)
sys.exit(main(sys.argv[1:]))
"""


def test_a_snapshot_or_restore_stopped_by_sigterm_leaves_no_temporary_copy(root, tmp_path):
    """SIGTERM ended the process at once: the snapshot's temporary file and the restore's
    staged copy stayed beside their targets, and no later run removed them."""
    import subprocess
    import sys

    def stopped(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SIGTERM_MIDWAY, *argv],
                              capture_output=True, text=True, timeout=300)

    (tmp_path / "snaps").mkdir()
    ran = stopped("snapshot", str(root), str(tmp_path / "snaps" / "snap.tar"))
    assert ran.returncode == 143 and "terminated" in ran.stderr, ran.stderr
    assert list((tmp_path / "snaps").iterdir()) == []
    take_snapshot(root, tmp_path / "snap.tar")
    (tmp_path / "restores").mkdir()
    ran = stopped("restore", str(tmp_path / "snap.tar"), str(tmp_path / "restores" / "r"))
    assert ran.returncode == 143, ran.stderr
    assert list((tmp_path / "restores").iterdir()) == []


def test_a_killed_runs_copy_is_removed_by_the_next_run_to_its_target(root, tmp_path):
    """SIGKILL (an OOM kill, a node lost) left the temporary copy of a snapshot or a restore
    beside its target for good. The next run to that target removes this host's copies whose
    process is gone; a running process's and another host's are its writers' to remove."""
    import os
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()

    def copies(target: Path, kind: str) -> dict[str, Path]:
        made = {"killed": target.parent / f".{target.name}.{kind}-{host}-{gone.pid}-0a1b",
                "running": target.parent / f".{target.name}.{kind}-{host}-{os.getpid()}-2c3d",
                "elsewhere": target.parent / f".{target.name}.{kind}-other-host-{gone.pid}-4e"}
        for path in made.values():
            path.mkdir(parents=True)
            (path / "member").write_bytes(b"x" * 1000)
        return made

    snapshot_copies = copies(tmp_path / "snaps" / "snap.tar", "tmp")
    take_snapshot(root, tmp_path / "snaps" / "snap.tar")
    restore_copies = copies(tmp_path / "restores" / "r", "restore")
    restore_snapshot(tmp_path / "snaps" / "snap.tar", tmp_path / "restores" / "r")
    for made in (snapshot_copies, restore_copies):
        assert {name for name, path in made.items() if path.exists()} == {"running", "elsewhere"}


def test_restore_into_the_current_directory_says_why_not(root, tmp_path, monkeypatch):
    take_snapshot(root, tmp_path / "snap.tar")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(RestoreTargetError, match="is the current directory"):
        restore_snapshot(tmp_path / "snap.tar", Path("."))
    assert list(Path(".").iterdir()) == []


def gzipped_with_a_bad_block_in(file: Path, name: str) -> bytes:
    """``file`` gzipped, with the deflate block that starts midway through member ``name``'s
    data damaged (its type bits set to the reserved 11): reading it raises zlib.error."""
    offset, size = member_offsets(file)[name]
    data, at = file.read_bytes(), offset + size // 2
    deflate = zlib.compressobj(wbits=31)  # gzip framing
    head = deflate.compress(data[:at]) + deflate.flush(zlib.Z_FULL_FLUSH)  # a block ends here
    tail = bytearray(deflate.compress(data[at:]) + deflate.flush())
    tail[0] |= 0b110
    return head + bytes(tail)


def bzipped_with_a_flipped_byte_in(file: Path, name: str) -> bytes:
    """``file`` bzip2-compressed in blocks of 100 kB, with a byte flipped about where member
    ``name``'s data is halfway (random data barely compresses): the block holding it fails
    its check, and reading it raises OSError("Invalid data stream") without an errno."""
    offset, size = member_offsets(file)[name]
    data = file.read_bytes()
    compressed = bytearray(bz2.compress(data, compresslevel=1))
    compressed[(offset + size // 2) * len(compressed) // len(data)] ^= 0x01
    return bytes(compressed)


COMPRESSIONS = {"gz": (gzip.compress, gzipped_with_a_bad_block_in),
                "bz2": (bz2.compress, bzipped_with_a_flipped_byte_in)}


@pytest.mark.parametrize("damage", ["cut", "flipped"])
@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_a_damaged_compressed_snapshot_names_the_member_and_leaves_no_root(
        root, tmp_path, compression, damage):
    """The module says to compress a snapshot to ship it and restore reads gzip: cut short
    in transfer (EOFError) or with a damaged byte (zlib.error), the decompressor's error came
    through as a traceback. A .tar.bz2 with a damaged byte still did: the bz2 decompressor
    raises a bare OSError ("Invalid data stream")."""
    name = "calibration.bin"  # a member long enough that the damage is read inside it
    (root / name).write_bytes(np.random.default_rng(0).bytes(1 << 20))
    file = tmp_path / "snap.tar"
    take_snapshot(root, file)
    compress, damaged_copy = COMPRESSIONS[compression]
    compressed = tmp_path / f"snap.tar.{compression}"
    if damage == "cut":
        whole = compress(file.read_bytes())
        compressed.write_bytes(whole[:int(len(whole) * 0.6)])
    else:
        compressed.write_bytes(damaged_copy(file, name))
    with pytest.raises(SnapshotCorruptError, match="take the snapshot again") as caught:
        restore_snapshot(compressed, tmp_path / "restored")
    assert caught.value.member is not None and caught.value.member in str(caught.value)
    if damage == "flipped":
        assert caught.value.member == name
    assert not (tmp_path / "restored").exists()
    assert not list(tmp_path.glob(".restored.restore-*"))


def test_a_full_disk_restoring_a_bzipped_snapshot_is_not_a_damaged_snapshot(root, tmp_path):
    """The bz2 decompressor's damaged data is an OSError: one with an errno (the disk filling
    while the restore writes, EFBIG here from the file size limit, as ENOSPC would be) is
    the disk's, and stays an OSError."""
    (root / "calibration.bin").write_bytes(np.random.default_rng(0).bytes(1 << 20))
    file = tmp_path / "snap.tar"
    take_snapshot(root, file)
    bzipped = tmp_path / "snap.tar.bz2"
    bzipped.write_bytes(bz2.compress(file.read_bytes(), compresslevel=1))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else it ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, limit[1]))
    try:
        with pytest.raises(OSError) as caught:
            restore_snapshot(bzipped, tmp_path / "restored")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.errno == errno.EFBIG
    assert not isinstance(caught.value, SnapshotCorruptError)
    assert not (tmp_path / "restored").exists()
    assert not list(tmp_path.glob(".restored.restore-*"))
    assert restore_snapshot(bzipped, tmp_path / "restored").files  # whole, once there is room


def test_a_fifo_or_device_is_not_replaced_by_a_snapshot(root, tmp_path):
    """Size 0 read as mktemp's empty file: a FIFO, or /dev/null when run as root, was
    replaced by a regular file holding the snapshot."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError, match="is not a regular file") as caught:
        take_snapshot(root, fifo)
    assert caught.value.path == fifo
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_sharded_build_with_more_files_than_open_descriptors_allowed_snapshots(
        docs, tmp_path):
    """Every file of the build stayed open until the tar was written: a build of 40 shards
    (1,203 files) failed with EMFILE under the usual soft limit of 1024."""
    source = tmp_path / "source"
    build_small(source, docs[:N_BASE], shards=8)
    files = sum(1 for p in resolve_build_dir(source).rglob("*") if p.is_file())
    margin = 48  # the snapshot's own few, and whatever the process opens meanwhile
    assert files > 3 * margin
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + margin, hard))
    try:
        report = take_snapshot(source, tmp_path / "snap.tar")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert report.files == files + 1  # the history too
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")


def test_a_long_log_is_not_held_in_memory(root, docs, tmp_path):
    """Every segment since the live build was read whole and held until the tar was written:
    a service answering /v1/snapshot held the whole uncompacted log."""
    text = "lorem ipsum dolor sit amet " * 8000  # 216 KB a record
    with IndexWriter(root) as writer:
        for i in range(40):
            writer.upsert([Document(f"long-{i}", text + str(i), "t", {})],
                          vectors=unit_vectors(1, 50 + i))
    log_bytes = sum(path.stat().st_size for _, path in segments(root))
    assert log_bytes > 8 << 20
    tracemalloc.start()
    try:
        report = take_snapshot(root, tmp_path / "snap.tar")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < log_bytes // 2, (peak, log_bytes)
    assert report.last_seq == 44
    restored = restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    assert restored.last_seq == 44


ADMIN_KEY = "admin-key-0123456789"


def test_no_room_for_the_services_copy_is_a_503_naming_the_setting(root, tmp_path,
                                                                    monkeypatch):
    """A full disk while /v1/snapshot wrote its copy was a bare 500 "internal error". The
    disk filling is the file size limit here (EFBIG, as ENOSPC would be): only files written
    past it fail, and only while the request runs."""
    from starlette.testclient import TestClient

    from retrieval.service.app import create_app
    from retrieval.service.auth import ApiKeys
    from retrieval.service.settings import ServeConfig

    (root / "extra.bin").write_bytes(bytes(1 << 20))  # travels with the root: over the limit
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # as TMPDIR would
    (tmp_path / "tmp").mkdir()
    app = create_app(root, ServeConfig(), keys=ApiKeys([(ADMIN_KEY, "admin")]),
                     loader=lambda: load(root))
    with TestClient(app, raise_server_exceptions=False,
                    headers={"authorization": f"Bearer {ADMIN_KEY}"}) as client:
        assert client.post("/v1/snapshot").status_code == 200
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else it ends the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, limit[1]))
        try:
            response = client.post("/v1/snapshot")
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    error = response.json()["error"]
    assert error["type"] == "ServiceUnavailableError"
    assert "no room for a copy of the index root" in error["message"]
    assert "TMPDIR" in error["message"]
    assert list((tmp_path / "tmp").iterdir()) == []  # its copy removed


def test_a_client_gone_mid_download_leaves_no_copy_behind(root, tmp_path, monkeypatch):
    """/v1/snapshot removed its copy in a background task, which runs only after a complete
    send: a client gone mid-download (the server's send raising, as ASGI 2.4 servers do) left
    a whole copy of the index root in TMPDIR, one per abandoned download."""
    from starlette.testclient import TestClient

    from retrieval.service.app import create_app
    from retrieval.service.auth import ApiKeys
    from retrieval.service.settings import ServeConfig

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # as TMPDIR would
    (tmp_path / "tmp").mkdir()
    app = create_app(root, ServeConfig(), keys=ApiKeys([(ADMIN_KEY, "admin")]),
                     loader=lambda: load(root))
    sent: list[str] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.body":
            raise OSError("the client went away")

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/snapshot", "raw_path": b"/v1/snapshot", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"),
                         (b"authorization", f"Bearer {ADMIN_KEY}".encode())]}
    with TestClient(app) as client:
        scope["state"] = dict(client.app_state)
        with pytest.raises(OSError, match="went away"):
            client.portal.call(app, scope, receive, send)
        assert client.get("/healthz").status_code == 200  # still serving
    assert sent[:2] == ["http.response.start", "http.response.body"]
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_damage_in_a_compressed_snapshots_first_block_says_damaged(root, tmp_path, compression):
    """tarfile decompresses a first block (900 kB of a .tar.bz2) before it reads any member:
    damage there was called "not a snapshot (not a tar file); take one", although the file
    was one, damaged."""
    file = tmp_path / "snap.tar"
    take_snapshot(root, file)
    compress, _ = COMPRESSIONS[compression]
    compressed = bytearray(compress(file.read_bytes()))
    compressed[20] ^= 0xFF  # inside the first block, past the header
    damaged_file = tmp_path / f"snap.tar.{compression}"
    damaged_file.write_bytes(bytes(compressed))
    with pytest.raises(SnapshotCorruptError, match="does not read as a snapshot: damaged "
                                                   r"\(take the snapshot again\)"):
        restore_snapshot(damaged_file, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    plain_text = tmp_path / "notes.txt"
    plain_text.write_text("not a snapshot at all")
    with pytest.raises(SnapshotCorruptError, match=r"not a snapshot \(not a tar file\)"):
        restore_snapshot(plain_text, tmp_path / "restored")
