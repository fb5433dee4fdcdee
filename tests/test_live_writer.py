"""The write-ahead log's writer: bad input refused with nothing written, one writer per root,
torn tails truncated at open, and no acknowledged write lost when the writer is SIGKILLed."""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from live_index import DIM, INFO, build_small, scifact_docs, unit_vectors

from indexes import BuildConfig, Document, PassageConfig, build_index
from indexes.errors import (
    ArtifactError,
    CorpusError,
    InvalidWriteError,
    RequestReplayError,
    SchemaMismatchError,
    WriterClosedError,
    WriterLockedError,
)
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.vectors import VectorStore
from indexes.wal import read_all, segments
from indexes.wal.log import (
    ACKED,
    LogCorruptionError,
    Record,
    check_log,
    encode_record,
    segment_name,
    wal_dir,
)
from indexes.wal.split import split, token_counter
from indexes.writer import IndexWriter
from retrieval import Retriever, RetrieverConfig


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 120)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    build_small(tmp_path, docs[:100])
    return tmp_path


def log_bytes(root: Path) -> int:
    return sum(path.stat().st_size for _, path in segments(root))


BAD_UPSERTS = [
    ("no id", [{"text": "a text"}], None, "no id"),
    ("empty id", [{"id": " ", "text": "a text"}], None, "no id"),
    ("no text", [{"id": "x1"}], None, "has no text"),
    # "" is a text (a build takes it too); one of another type is none
    ("text not a string", [{"id": "x1", "text": 3}], None,
     r"'x1' has no text: give it a text string \(\"\" for none\), not int"),
    ("duplicate", [{"id": "x1", "text": "a"}, {"id": "x1", "text": "b"}], None, "duplicate id"),
    ("wrong dim", [{"id": "x1", "text": "a"}], np.zeros((1, DIM + 1)), r"expected \(1, 8\)"),
    ("vector count", [{"id": "x1", "text": "a"}], np.zeros((2, DIM)), "one 8-dimensional row"),
    ("not finite", [{"id": "x1", "text": "a"}, {"id": "x2", "text": "b"}],
     np.array([np.ones(DIM), [np.inf] * DIM]), "row 1 holds NaN or infinity"),
    ("kind", [{"id": "x1", "text": "a", "metadata": {"year": "recent"}}], None, "number"),
    ("not json", [{"id": "x1", "text": "a", "metadata": {"when": object()}}], None, "not JSON"),
    ("metadata list", [{"id": "x1", "text": "a", "metadata": ["x"]}], None, "an object"),
    # Values a build refuses: logged, each would stop every later compaction.
    ("number past float", [{"id": "x1", "text": "a", "metadata": {"year": 10**400}}], None,
     "'year' holds .* which is no number"),
    ("infinite number", [{"id": "x1", "text": "a", "metadata": {"year": float("-inf")}}],
     None, "-inf is no number a filter can compare"),
    ("id field", [{"id": "x1", "text": "a", "metadata": {"id": "custom-7"}}], None,
     "'id' is reserved"),
    # A field named 1 and one named "1" were two fields to the writer and one once logged:
    # both acknowledged, the log refused by every later compaction and load.
    ("int field name", [{"id": "x1", "text": "a", "metadata": {1: "one"}}], None,
     "field name 1 is a int"),
    ("nested keys of two types", [{"id": "x1", "text": "a", "metadata": {"o": {1: "x", "a": 2}}}],
     None, "not JSON"),
    ("one document alone", Document("x1", "a"), unit_vectors(1, 1), "documents is one Document"),
    ("one dict alone", {"id": "x1", "text": "a"}, unit_vectors(1, 1), "documents is one dict"),
    ("ragged vectors", [{"id": "x1", "text": "a"}, {"id": "x2", "text": "b"}],
     [[1.0] * DIM, [1.0]], "no matrix of numbers"),
    ("string vectors", [{"id": "x1", "text": "a"}], [["a"] * DIM], "no matrix of numbers"),
    ("empty", [], None, "at least one"),
]


@pytest.mark.parametrize(("case", "documents", "vectors", "message"), BAD_UPSERTS,
                         ids=[c[0] for c in BAD_UPSERTS])
def test_bad_upserts_are_refused_with_nothing_written(root, case, documents, vectors, message):
    with IndexWriter(root) as writer:
        before = log_bytes(root)
        given = vectors if vectors is not None or case in ("no id", "empty") else \
            unit_vectors(len(documents), 1)
        with pytest.raises(InvalidWriteError, match=message):
            writer.upsert(documents, vectors=given)
        assert log_bytes(root) == before and writer.last_seq == 0


def test_upsert_without_vectors_needs_an_encoder_for_new_texts(root, docs):
    with IndexWriter(root) as writer:
        with pytest.raises(InvalidWriteError, match="pass vectors"):
            writer.upsert([{"id": "fresh", "text": "a text no build holds"}])
        # An unchanged text reuses the build's vector by content hash: no encoder needed.
        seq = writer.upsert([docs[3]])
    (record,) = read_all(root)
    assert record.seq == seq and record.documents[0].id == docs[3].id


@pytest.mark.parametrize("ids", [[], ["a", "a"], ["a", ""], [None], "doc-1", b"doc-1"])
def test_bad_deletes_are_refused_with_nothing_written(root, ids):
    with IndexWriter(root) as writer:
        with pytest.raises(InvalidWriteError):
            writer.delete(ids)
    assert read_all(root) == []


def test_two_writers_on_one_root_take_turns_in_one_sequence(root):
    """Each serving worker has a writer: appends take the root's lock in turn and catch up
    first, so seqs stay contiguous, and a field one writer added is known to the other."""
    first, second = IndexWriter(root), IndexWriter(root)
    seqs = []
    for n in range(6):
        writer = first if n % 2 == 0 else second
        seqs.append(writer.upsert([Document(f"w{n}", f"turn {n}", metadata={"year": n})],
                                  vectors=unit_vectors(1, n)))
    seqs.append(second.delete(["w0"]))
    first.close()
    second.close()
    assert seqs == list(range(1, 8))
    assert [r.seq for r in read_all(root)] == seqs


def test_a_lock_held_past_the_timeout_is_writer_locked_with_nothing_written(root):
    import fcntl

    writer = IndexWriter(root, lock_timeout_seconds=0.2)
    with open(wal_dir(root) / ".writer.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process's append that never ends
        with pytest.raises(WriterLockedError, match="one writer per index root"):
            writer.delete(["d1"])
    assert writer.delete(["d1"]) == 1  # the lock came back: the write goes through
    writer.close()


def test_a_retried_request_id_is_answered_with_the_first_seq_and_logged_once(root):
    with IndexWriter(root) as writer, IndexWriter(root) as other:
        doc = Document("r1", "retried text", metadata={"year": 1})
        first = writer.upsert_acked([doc], vectors=unit_vectors(1, 1), request_id="req-1")
        again = other.upsert_acked([doc], vectors=unit_vectors(1, 1), request_id="req-1")
        gone = other.delete_acked(["r1"], request_id="req-2")
        assert (first.seq, first.replayed) == (1, False)
        assert (again.seq, again.replayed) == (1, True)
        assert writer.delete_acked(["r1"], request_id="req-2") == gone.__class__(2, True)
        with pytest.raises(RequestReplayError, match="different write"):
            writer.upsert([Document("r1", "other text")], vectors=unit_vectors(1, 2),
                          request_id="req-1")
    assert [r.seq for r in read_all(root)] == [1, 2]
    with IndexWriter(root) as reopened:  # remembered from the log after a restart too
        assert reopened.delete_acked(["r1"], request_id="req-2").replayed


def test_a_retry_after_a_compaction_is_still_answered_not_logged_again(root):
    """The compaction folded the first write (its record stays in the log while a rollback
    may need it); the retry after it was logged again, over a newer write of the same
    document, which it then undid."""
    with IndexWriter(root) as writer:
        writer.upsert([Document("x", "version one")], vectors=unit_vectors(1, 1),
                      request_id="r1")
        writer.compact()
        writer.upsert([Document("x", "version two")], vectors=unit_vectors(1, 2),
                      request_id="r2")
        retry = writer.upsert_acked([Document("x", "version one")],
                                    vectors=unit_vectors(1, 1), request_id="r1")
        assert (retry.seq, retry.replayed) == (1, True)
    with IndexWriter(root) as reopened:
        assert reopened.upsert_acked([Document("x", "version one")],
                                     vectors=unit_vectors(1, 1), request_id="r1").replayed
    with Retriever.load(root, {"cache": {"backend": "none"}}) as retriever:
        assert retriever.get_documents(["x"])[0].text == "version two"


def test_an_upsert_adding_or_retyping_a_field_is_a_schema_error_naming_it(root):
    with IndexWriter(root) as writer:
        with pytest.raises(SchemaMismatchError, match="'yaer' is not in the index's schema"
                           ) as error:
            writer.upsert([Document("s1", "text", metadata={"yaer": 2020})],
                          vectors=unit_vectors(1, 1))
        assert error.value.field == "yaer" and "year (number)" in str(error.value)
        with pytest.raises(SchemaMismatchError, match="holds a keyword value"):
            writer.upsert([Document("s1", "text", metadata={"year": "recent"})],
                          vectors=unit_vectors(1, 1))
        writer.upsert([Document("s1", "text", metadata={"notes": {"free": "form"}})],
                      vectors=unit_vectors(1, 1))  # a nested object is stored, not a field
    assert [r.seq for r in read_all(root)] == [1]


def test_a_build_allowing_new_fields_takes_them(tmp_path, docs):
    build_small(tmp_path, docs[:20], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("n1", "text", metadata={"team": "search"})],
                      vectors=unit_vectors(1, 1))
        assert writer.kinds["team"] == "keyword"


def test_a_new_fields_kind_is_its_values_together_in_any_order(tmp_path, docs):
    build_small(tmp_path, docs[:20], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        for n, values in enumerate((["2020-01-01", "misc"], ["misc", "2020-01-01"])):
            writer.upsert([Document(f"t{n}{i}", "text", metadata={f"tag{n}": value})
                           for i, value in enumerate(values)], vectors=unit_vectors(2, n))
            assert writer.kinds[f"tag{n}"] == "keyword"  # as a build infers it
        with pytest.raises(SchemaMismatchError, match=r"'size' mixes \['keyword', 'number'\]"):
            writer.upsert([Document("s1", "text", metadata={"size": 1}),
                           Document("s2", "text", metadata={"size": "big"})],
                          vectors=unit_vectors(2, 3))


def test_values_of_no_filterable_kind_are_stored_in_fields_of_any_kind_and_fold(tmp_path, docs):
    """A nested object or a list of numbers is stored with its document, not indexed, in a
    number or date field too, as a build takes it. An object logged before a new field's
    first number was accepted, and the number after it made a field every later compaction
    refused; an object refused in a number field kept a document as built from being
    written back as it was."""
    build_small(tmp_path, docs[:20], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("o1", "text", metadata={"rank": {"by": "hand"}})],
                      vectors=unit_vectors(1, 1))
        writer.upsert([Document("o2", "text", metadata={"rank": 3, "year": 2020})],
                      vectors=unit_vectors(1, 2))
        writer.upsert([Document("o3", "text", metadata={"rank": [1, 2], "year": [2020, 2021],
                                                        "when": {"at": "2020-01-01"}})],
                      vectors=unit_vectors(1, 3))
        assert (writer.kinds["rank"], writer.kinds["year"]) == ("number", "number")
        writer.compact()
    config = RetrieverConfig(cache={"backend": "none"})
    with Retriever.load(tmp_path, config) as retriever:
        assert retriever.snapshot.manifest.log_seq == 3  # all three folded
        found = retriever.search("text", {"rank": {"gte": 0}}, k=5,
                                 query_vector=unit_vectors(1, 1)[0])
        assert [hit.doc_id for hit in found.hits] == ["o2"]
        found = retriever.search("text", {"year": 2020}, k=5, query_vector=unit_vectors(1, 1)[0])
        assert [hit.doc_id for hit in found.hits] == ["o2"]
        stored = {hit.doc_id: hit.metadata for hit in retriever.search(
            "text", None, k=40, query_vector=unit_vectors(1, 1)[0]).hits}
    assert stored["o1"]["rank"] == {"by": "hand"} and stored["o3"]["year"] == [2020, 2021]


def test_compaction_keeps_the_field_kinds_it_served(tmp_path, docs):
    """A compaction builds from the surviving documents, and used to infer their kinds
    again: a field whose values were all deleted vanished (filters on it and writes to it
    refused), a keyword field whose last non-date string went became a date field, and a
    number field whose last number became a list was dropped."""
    base = [Document(f"k{i}", "text", metadata=m) for i, m in enumerate([
        {"due": "TBD", "promo": "spring", "year": 2020},
        {"due": "2020-01-31", "year": [2019]}, {"due": "2021-02-01"}])]
    build_small(tmp_path, base)
    with IndexWriter(tmp_path) as writer:
        writer.delete(["k0"])
        writer.compact()
        assert writer.kinds == {"due": "keyword", "promo": "keyword", "year": "number"}
        writer.upsert([Document("k3", "text", metadata={"due": "TBD", "promo": "autumn",
                                                        "year": 2022})],
                      vectors=unit_vectors(1, 3))
        writer.compact()
    assert read_manifest(resolve_build_dir(tmp_path)).metadata_fields == \
        {"due": "keyword", "promo": "keyword", "year": "number"}
    with Retriever.load(tmp_path, RetrieverConfig(cache={"backend": "none"})) as retriever:
        def found(filters: dict) -> list[str]:
            return sorted(hit.doc_id for hit in retriever.search(
                "text", filters, k=10, query_vector=unit_vectors(1, 1)[0]).hits)
        assert found({"due": "2020-01-31"}) == ["k1"] and found({"due": "TBD"}) == ["k3"]
        assert found({"promo": {"exists": True}}) == ["k3"]
        assert found({"year": {"gte": 2000}}) == ["k3"]


def test_compacting_an_int8_build_keeps_the_codes_of_the_rows_it_keeps(tmp_path, docs):
    """A compaction re-quantized the dequantized rows on bounds of their own: replacing the
    row holding a dimension's extreme moved every row's codes, a little more at each
    compaction. The grid is kept, and widened only in a dimension a new vector leaves."""
    vectors = unit_vectors(30, 0)
    build_index(docs[:30], tmp_path, vectors=vectors, progress=False, dense="exact",
                encoder_info=INFO.model_copy(update={"vector_dtype": "int8"}),
                config=BuildConfig(vector_dtype="int8"))

    def codes() -> np.ndarray:
        return np.array(VectorStore.load(resolve_build_dir(tmp_path) / "vectors").data)

    built = codes()
    extreme = int(np.argmax(vectors[:, 0]))  # the row holding dimension 0's maximum
    kept = [row for row in range(30) if row != extreme]
    with IndexWriter(tmp_path) as writer:
        for round_ in range(3):
            writer.upsert([Document(docs[extreme].id, f"churn {round_}")],
                          vectors=0.5 * vectors[extreme:extreme + 1])
            writer.compact()
            np.testing.assert_array_equal(codes()[:29], built[kept])
        outside = np.zeros((1, DIM), np.float32)
        outside[0, 1] = vectors[:, 1].max() + 0.5  # only dimension 1 leaves the grid
        writer.upsert([Document(docs[extreme].id, "churn wide")], vectors=outside)
        writer.compact()
    others = [d for d in range(DIM) if d != 1]
    np.testing.assert_array_equal(codes()[:29][:, others], built[kept][:, others])


def test_a_date_that_does_not_exist_is_refused_and_compaction_still_folds(tmp_path, docs):
    build_small(tmp_path, docs[:20], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        for day in ("2020-02-30", "2020-01-01T24:00"):  # date-shaped, no such time
            with pytest.raises(InvalidWriteError, match="'when' holds .* which is no date"):
                writer.upsert([Document("d1", "text", metadata={"when": day})],
                              vectors=unit_vectors(1, 1))
        writer.upsert([Document("d1", "text", metadata={"when": "2020-02-29"})],
                      vectors=unit_vectors(1, 1))
        with pytest.raises(InvalidWriteError, match="which is no date"):
            writer.upsert([Document("d2", "text", metadata={"when": "2021-02-29"})],
                          vectors=unit_vectors(1, 1))
        writer.compact()  # the log holds nothing a build refuses
    with Retriever.load(tmp_path, RetrieverConfig(cache={"backend": "none"})) as retriever:
        found = retriever.search("text", {"when": {"gte": "2020-02-01"}}, k=5,
                                 query_vector=unit_vectors(1, 1)[0])
    assert [hit.doc_id for hit in found.hits] == ["d1"]


def test_compacting_a_root_whose_documents_are_all_deleted_says_why_and_folds_later(
        tmp_path, docs):
    build_small(tmp_path, docs[:3])
    with IndexWriter(tmp_path) as writer:
        writer.delete([doc.id for doc in docs[:3]])
        with pytest.raises(CorpusError, match="every document is deleted"):
            writer.compact()
        with Retriever.load(tmp_path, RetrieverConfig(cache={"backend": "none"})) as retriever:
            assert retriever.search("cell", k=5, query_vector=unit_vectors(1, 1)[0]).hits == []
        writer.upsert([Document("back", "a cell again")], vectors=unit_vectors(1, 2))
        assert writer.compact().n_docs == 1


def test_torn_tail_is_truncated_with_a_warning_and_acknowledged_records_stay(root, caplog):
    with IndexWriter(root) as writer:
        acked = [writer.delete([f"d{i}"]) for i in range(3)]
    (_, path), = segments(root)
    whole = path.stat().st_size
    torn = encode_record(Record(4, "delete", ids=("d4",)))
    for tail in (torn[: len(torn) // 2], torn[:-1] + bytes([torn[-1] ^ 1])):
        with open(path, "ab") as handle:
            handle.write(tail)
        with caplog.at_level(logging.WARNING), IndexWriter(root) as writer:
            assert writer.last_seq == 3
        assert "torn or corrupt tail" in caplog.text and path.stat().st_size == whole
        assert [r.seq for r in read_all(root)] == acked


def _write_until_killed(root: Path, ack_fd: int) -> None:
    """Child: upsert batches forever, reporting each acknowledged seq on ``ack_fd``."""
    try:
        writer = IndexWriter(root)
        n = 0
        while True:
            n += 1
            batch = [Document(f"k{n}-{i}", f"text {n} {i} " * 2000, metadata={"year": n})
                     for i in range(20)]
            seq = writer.upsert(batch, vectors=unit_vectors(20, n))
            os.write(ack_fd, f"{seq}\n".encode())
    finally:
        os._exit(1)


def test_sigkilled_writer_loses_no_acknowledged_write(root):
    """20 trials: SIGKILL at a random moment of a stream of upserts; after reopening, every
    acknowledged seq is there, whole, and nothing after it is half-applied."""
    rng = random.Random(15)
    acked_total = 0
    for _ in range(20):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            os.close(read_end)
            _write_until_killed(root, write_end)
        os.close(write_end)
        time.sleep(rng.uniform(0.02, 0.15))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(read_end) as acks:
            acked = [int(line) for line in acks.read().split()]
        with IndexWriter(root) as writer:  # repairs a torn tail
            records = read_all(root)
            assert writer.last_seq == (records[-1].seq if records else 0)
        seqs = [r.seq for r in records]
        assert seqs == list(range(1, len(seqs) + 1)), "sequence numbers have a gap"
        assert set(acked) <= set(seqs)
        for record in records:  # whole: every document of the batch, with its vector
            assert len(record.documents) == 20 and record.vectors.shape == (20, DIM)
            n = int(record.documents[0].id[1:].split("-")[0])
            assert record.documents[0].metadata == {"year": n}
        acked_total += len(acked)
    assert acked_total > 0


def _acknowledged(root: Path, batches: int) -> list[int]:
    with IndexWriter(root) as writer:
        return [writer.upsert([Document(f"c{n}-{i}", f"corruption probe {n} {i}")
                               for i in range(5)], vectors=unit_vectors(5, n))
                for n in range(batches)]


def test_a_damaged_record_inside_the_log_fails_loudly_in_20_trials(root):
    """A bit flipped at a random offset of the log, the last record included: every trial
    either reads every acknowledged write back or raises ``LogCorruptionError``; none silently
    loses one, and the writer never truncates acknowledged records to "repair" it."""
    acked = _acknowledged(root, 30)
    (_, path), = segments(root)
    pristine = path.read_bytes()
    last_record = len(encode_record(read_all(root)[-1]))
    rng = random.Random(31)
    offsets = [rng.randrange(len(pristine)) for _ in range(19)]
    offsets.append(len(pristine) - rng.randrange(1, last_record))  # inside the last record
    loud = 0
    for at in offsets:
        damaged = bytearray(pristine)
        damaged[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        try:
            seqs = [r.seq for r in read_all(root)]
        except LogCorruptionError as exc:
            loud += 1
            assert str(path) in str(exc) and "backup" in str(exc)
            with pytest.raises(LogCorruptionError):
                IndexWriter(root)
            assert path.read_bytes() == bytes(damaged)  # nothing truncated
            with pytest.raises(LogCorruptionError):
                check_log(root)
            continue
        assert seqs == acked, f"byte {at}: acknowledged writes lost silently"
    assert loud >= 19  # a flip in an ignored byte (none here but by chance) reads back whole
    path.write_bytes(pristine)


def test_a_log_cut_at_or_just_past_a_record_boundary_is_loud_not_a_torn_tail(root):
    """Cut anywhere from the end of an acknowledged record to 15 bytes past it (less than a
    header): the records read whole, but ACKED says more were acknowledged. It read as a log
    of fewer writes, and the writer "repaired" it and gave their seqs out again."""
    acked = _acknowledged(root, 6)
    (_, path), = segments(root)
    pristine = path.read_bytes()
    ends, at = [], 0
    for record in read_all(root):
        at += len(encode_record(record))
        ends.append(at)
    assert ends[-1] == len(pristine) and len(ends) == len(acked)
    for cut in (ends[2], ends[2] + 1, ends[2] + 15, ends[-2]):
        path.write_bytes(pristine[:cut])
        with pytest.raises(LogCorruptionError, match="cut off and was acknowledged"):
            read_all(root)
        with pytest.raises(LogCorruptionError):
            check_log(root)
        with pytest.raises(LogCorruptionError):
            IndexWriter(root)
        assert path.read_bytes() == pristine[:cut]  # nothing truncated, ACKED not lowered
    path.write_bytes(pristine)
    assert [r.seq for r in read_all(root)] == acked


@pytest.mark.parametrize("damage", ["older segment cut", "older segment gone",
                                    "segment renamed"])
def test_a_gap_in_the_log_fails_verify_and_compaction(root, damage):
    """Writes 1-3 in one segment, 4-6 in the next: losing a whole record of the older one, or
    all of it, left a log that read back without a word, and compaction folded it."""
    with IndexWriter(root) as writer:
        for n in range(3):
            writer.delete([f"d{n}"])
        writer.rotate()
        for n in range(3, 6):
            writer.delete([f"d{n}"])
    (_, older), (_, newer) = segments(root)
    if damage == "older segment cut":
        whole = older.read_bytes()
        older.write_bytes(whole[:len(whole) - len(encode_record(read_all(root)[2]))])
    elif damage == "older segment gone":  # reads as retired: the live build says otherwise
        older.unlink()
    else:
        older.rename(wal_dir(root) / segment_name(2))
    if damage != "older segment gone":
        with pytest.raises(LogCorruptionError, match="lost"):
            read_all(root)
    with pytest.raises(LogCorruptionError, match="lost"):
        check_log(root, live_seq=0)  # as verify calls it: the live build's log_seq
    with pytest.raises(LogCorruptionError, match="lost"), IndexWriter(root) as writer:
        writer.compact()
    assert newer.is_file()  # nothing folded, nothing retired


def test_a_damaged_last_record_is_loud_and_only_an_unacknowledged_tail_is_torn(root, caplog):
    """The last acknowledged record damaged: ``LogCorruptionError`` (``wal/ACKED`` says it was
    acknowledged), nothing truncated. Bytes after it (an append cut before its fsync) are a
    torn tail, truncated. Without a readable ACKED (it lags after a power loss) damage in the
    last record can only read as a torn tail; damage in a segment a newer one follows is loud
    whatever ACKED says."""
    acked = _acknowledged(root, 3)
    (_, path), = segments(root)
    pristine = path.read_bytes()
    data = bytearray(pristine)
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptionError, match="was acknowledged"):
        read_all(root)
    with pytest.raises(LogCorruptionError):
        IndexWriter(root)
    assert path.read_bytes() == bytes(data)
    torn = encode_record(Record(acked[-1] + 1, "delete", ids=("c0-0",)))
    path.write_bytes(pristine + torn[:-3])
    with caplog.at_level(logging.WARNING), IndexWriter(root) as writer:
        assert writer.last_seq == acked[-1]
    assert "torn or corrupt tail" in caplog.text and path.read_bytes() == pristine
    (wal_dir(root) / ACKED).write_bytes(b"")  # no checkpoint: the last record reads as torn
    path.write_bytes(bytes(data))
    assert [r.seq for r in read_all(root)] == acked[:-1]
    assert check_log(root)[1] > 0
    later = wal_dir(root) / segment_name(acked[-1] + 1)
    later.write_bytes(encode_record(Record(acked[-1] + 1, "delete", ids=("c0-0",))))
    with pytest.raises(LogCorruptionError, match="newer segment"):
        read_all(root)


def test_a_writer_given_a_build_directory_is_refused(root):
    """It acknowledged writes into builds/<id>/wal/, which no reader of the root reads."""
    from indexes.errors import MissingArtifactError
    from indexes.manifest import resolve_build_dir

    build = resolve_build_dir(root)
    with pytest.raises(MissingArtifactError, match="is a build, not an index root"):
        IndexWriter(build)
    assert not (build / "wal").exists()


def test_segments_retired_while_the_log_is_read_are_no_gap(root, monkeypatch):
    """Listed, then the two oldest retired while the first was read: the third starts past
    where the first ended, and that read as lost writes on a healthy log."""
    import indexes.wal.log as wal_log

    with IndexWriter(root) as writer:
        for n in range(9):
            writer.delete([f"d{n}"])
            if n in (2, 5):
                writer.rotate()
    listed = segments(root)
    assert [first for first, _ in listed] == [1, 4, 7]
    listed[1][1].unlink()  # retired after the listing; the first was already read
    monkeypatch.setattr(wal_log, "segments", lambda _root: listed)
    assert [r.seq for r in read_all(root)] == [1, 2, 3, 7, 8, 9]


class HashEncoder:
    """The index's test model (``INFO``) as an encoder: a text's vector from its checksum, so
    a writer embeds new texts itself without a real model."""

    encoder_id, model, dim = INFO.encoder_id, INFO.model, DIM

    def encode(self, texts, *, batch_size=64, progress=False):
        return np.stack([unit_vectors(1, zlib.crc32(t.encode()))[0] for t in texts])


def test_an_upsert_embedded_by_the_writer_after_a_passage_build_went_live_is_split_as_it(
        root, docs):
    """The writer's last write was on the build of whole documents; a passage build went live
    since. Its next upsert found that out under the root's lock and embedded the passages
    there, through a lookup that takes the writer's thread lock, already held: it hung
    forever, holding the root's lock, so every other writer and compaction was
    WriterLockedError. Now it is split and embedded again outside the lock."""
    writer = IndexWriter(root, encoder=HashEncoder())
    writer.upsert([Document("n1", "a first text no build holds")])
    config = PassageConfig(max_tokens=48, overlap_tokens=8)
    build_index(docs[:100], root, encoder=HashEncoder(), progress=False, dense="exact",
                config=BuildConfig(passages=config))
    new = Document("n2", docs[110].text, docs[110].title)  # a text no build holds
    upserted: dict[str, int] = {}
    worker = threading.Thread(target=lambda: upserted.update(seq=writer.upsert([new])),
                              daemon=True)  # a hung upsert must not hang the test run
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the upsert deadlocked"
    writer.close()
    rows, spans = split([new], token_counter(None), config)
    assert len(rows) > 1
    record = read_all(root)[-1]
    assert record.seq == upserted["seq"] == 2 and record.passages == tuple(spans)
    assert np.allclose(record.vectors, HashEncoder().encode([r.content for r in rows]))
    with Retriever.load(root, {"cache": {"backend": "none"}, "live_lag_seconds": None}
                        ) as retriever:
        assert retriever.get_documents(["n2"])[0].text == new.text


def test_a_failed_fsync_of_a_whole_record_keeps_it_and_its_seq(root, monkeypatch):
    """The whole record was in the file when its fsync failed, and a follower read it then;
    the writer truncated it and gave its seq to the next write: the follower served a write
    never acknowledged and never applied the acknowledged one. Now the record stays, its seq
    is not reused, and the error says its durability is unknown."""
    live = {"cache": {"backend": "none"}, "live_lag_seconds": None}
    with Retriever.load(root, live) as follower, IndexWriter(root) as writer:
        writer.upsert([Document("ok1", "first acknowledged")], vectors=unit_vectors(1, 1))
        real_fsync, failures = os.fsync, []

        def fsync_failing_once(fd: int) -> None:
            if not failures:
                failures.append(fd)
                follower.refresh()  # another process's follower polls right now
                raise OSError(5, "Input/output error")
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync_failing_once)
        with pytest.raises(ArtifactError, match="seq 2 was appended .* survives a crash is "
                                                "unknown"):
            writer.upsert([Document("unsure", "fsync failed")], vectors=unit_vectors(1, 2))
        assert follower.get_documents(["unsure"])[0] is not None and writer.last_seq == 2
        assert writer.upsert([Document("ok2", "second acknowledged")],
                             vectors=unit_vectors(1, 3)) == 3
        assert follower.refresh()
        assert all(d is not None for d in follower.get_documents(["ok1", "unsure", "ok2"]))
    assert [r.seq for r in read_all(root)] == [1, 2, 3]


def test_a_write_after_close_is_a_typed_error(root):
    """It was Python's ValueError "I/O operation on closed file"."""
    writer = IndexWriter(root)
    writer.close()
    writer.close()  # twice is harmless
    for write in (lambda: writer.upsert([Document("c1", "text")], vectors=unit_vectors(1, 1)),
                  lambda: writer.delete(["c1"]), writer.caught_up, writer.rotate,
                  writer.reopen):
        with pytest.raises(WriterClosedError, match="writer of .* is closed"):
            write()
    assert read_all(root) == []


def test_damage_spanning_records_past_the_acknowledged_end_is_loud_not_a_torn_tail(root):
    """Records 11 and 12 of 30 zeroed, ``wal/ACKED`` lagging at record 5 (a power loss may
    leave it so): only seq 12 or 13 right after the damage was looked for, so the 18 whole
    acknowledged records after it read as a torn tail, and the writer truncated them."""
    with IndexWriter(root) as writer:
        for n in range(5):
            writer.delete([f"d{n}"])
        lagging = (wal_dir(root) / ACKED).read_bytes()
        for n in range(5, 30):
            writer.delete([f"d{n}"])
    (_, path), = segments(root)
    ends, at = [], 0
    for record in read_all(root):
        at += len(encode_record(record))
        ends.append(at)
    damaged = bytearray(path.read_bytes())
    damaged[ends[9]:ends[11]] = bytes(ends[11] - ends[9])  # seqs 11 and 12
    path.write_bytes(bytes(damaged))
    (wal_dir(root) / ACKED).write_bytes(lagging)
    with pytest.raises(LogCorruptionError, match=rf"byte {ends[9]} \(after seq 10\) is damaged "
                                                 rf"and whole records follow it \(seq 13 at "
                                                 rf"byte {ends[11]}\)"):
        read_all(root)
    with pytest.raises(LogCorruptionError, match="whole records follow"):
        check_log(root, live_seq=0)  # as ``retrieval verify`` calls it
    with pytest.raises(LogCorruptionError):
        IndexWriter(root)
    assert path.read_bytes() == bytes(damaged)  # nothing truncated
    garbage = bytes(damaged[:ends[9]]) + bytes(range(256)) * 8  # no whole record after it
    path.write_bytes(garbage)
    assert [r.seq for r in read_all(root)] == list(range(1, 11))
    assert check_log(root, live_seq=0) == (10, len(garbage) - ends[9])


def test_a_segment_that_cannot_be_created_leaves_the_writer_on_its_old_segment(
        root, tmp_path, monkeypatch):
    """``rotate`` closed the segment's descriptor before creating the next segment; when the
    creation failed (no inode or descriptor left) the writer kept the closed number, and its
    next acknowledged write went to the file opened under that number next, not to the log.
    Now the rotation raises, and the writer goes on appending to the segment it had."""
    real_open = os.open
    writer = IndexWriter(root)
    first = writer.delete(["d1"])
    refused = str(wal_dir(root) / segment_name(first + 1))

    def open_out_of_descriptors(path, flags, mode=0o777, **kwargs):
        if str(path) == refused:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), refused)
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", open_out_of_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        writer.rotate()  # compaction's first step
    monkeypatch.undo()
    unrelated = tmp_path / "unrelated.bin"
    with open(unrelated, "wb"):  # the next file the process opens
        second = writer.delete(["d2"])
        assert second == first + 1
    assert unrelated.stat().st_size == 0
    assert writer.rotate() == second  # creating a segment works again
    third = writer.delete(["d3"])
    writer.close()
    assert [start for start, _ in segments(root)] == [1, third]
    assert [r.seq for r in read_all(root)] == [first, second, third]
    with IndexWriter(root) as fresh:
        assert fresh.last_seq == third
