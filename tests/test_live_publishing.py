"""Builds published under a root with live writes, in any order: a staged build published
after a compaction, a rollback past one, a compaction published in another process while a
retriever serves, and a new field's kind as every reader decides it. No acknowledged write is
lost, and what cannot be published without losing one is refused (``LogGapError``)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors

from indexes import Document, build_index
from indexes.manifest import collect_garbage, read_manifest, resolve_build_dir
from indexes.publish import publish_build, rollback
from indexes.sharding import build_parts
from indexes.wal import read_all
from indexes.writer import IndexWriter
from retrieval import LogGapError, Retriever

NEEDLE = "zebrafish telomerase hibernation"


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 40)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    build_small(tmp_path, docs[:30])
    return tmp_path


def load(root: Path, **config) -> Retriever:
    return Retriever.load(root, {"cache": {"backend": "none"}, "live_lag_seconds": None,
                                 **config})


def served(root: Path, ids: list[str]) -> list[bool]:
    with load(root) as retriever:
        return [doc is not None for doc in retriever.get_documents(ids)]


def until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


def upsert(writer: IndexWriter, doc_id: str, seed: int, **metadata) -> int:
    return writer.upsert([Document(doc_id, f"{NEEDLE} {doc_id}", metadata=metadata)],
                         vectors=unit_vectors(1, seed))


def staged_build(root: Path, docs: list[Document]) -> str:
    """A nightly build of ``docs`` placed, not published (as a gated publish stages it)."""
    report = build_index(docs, root, vectors=unit_vectors(len(docs), 1), encoder_info=INFO,
                         progress=False, dense="exact", publish=False)
    return report.build_id


def test_a_staged_build_published_after_a_compaction_serves_the_writes_in_between(root, docs):
    with IndexWriter(root) as writer:
        upsert(writer, "before-seal", 1)
        staged = staged_build(root, docs[:30])  # seals the log at seq 1
        upsert(writer, "after-seal", 2)
        writer.delete([docs[4].id])
        assert writer.compact().log_seq == 3
    publish_build(root, staged, "gate")
    assert read_manifest(resolve_build_dir(root)).log_seq == 1
    assert served(root, ["after-seal", docs[4].id]) == [True, False]
    with IndexWriter(root) as writer:
        seq = upsert(writer, "later", 3)
    with load(root) as retriever:
        assert retriever.applied_seq == seq
        assert retriever.get_documents(["later"])[0] is not None


def test_a_rollback_past_a_compaction_keeps_the_live_writes(root, docs):
    with load(root, live_lag_seconds=0.05) as retriever:
        with IndexWriter(root) as writer:
            upsert(writer, "day-edit", 1)
            writer.delete([docs[3].id])
            report = writer.compact()
            upsert(writer, "after-compaction", 2)
        # Served first: the compacted build, and the write after it.
        until(lambda: (retriever.build_id, retriever.applied_seq) == (report.build_id, 3))
        before = rollback(root)
        assert before.how == "rollback"
        with IndexWriter(root) as writer:
            seq = upsert(writer, "after-rollback", 3)
        retriever.wait_for_seq(seq)
        found = retriever.get_documents(["day-edit", docs[3].id, "after-compaction",
                                         "after-rollback"])
        assert [d is not None for d in found] == [True, False, True, True]
        # The rollback is followed within the lag (min_seq waits for writes, not for a load).
        until(lambda: retriever.build_id == before.build_id)
        found = retriever.get_documents(["day-edit", docs[3].id, "after-compaction",
                                         "after-rollback"])
        assert [d is not None for d in found] == [True, False, True, True]
    # A process starting now reads the day's edits from the log too.
    assert served(root, ["day-edit", docs[3].id, "after-compaction", "after-rollback"]) == \
        [True, False, True, True]


def test_a_publish_that_would_lose_writes_is_refused_and_the_live_build_serves_on(root,
                                                                                   docs):
    first = resolve_build_dir(root).name
    with IndexWriter(root) as writer:
        upsert(writer, "one", 1)
        writer.compact()
        upsert(writer, "two", 2)
        writer.compact()  # seq 1 is in both builds that may serve again: its segment goes
    assert [r.seq for r in read_all(root)] == [2]
    live = resolve_build_dir(root)
    with pytest.raises(LogGapError, match="would lose the writes after seq 0"):
        rollback(root, to=first)
    assert resolve_build_dir(root) == live
    assert served(root, ["one", "two"]) == [True, True]


def test_a_retriever_follows_a_compaction_published_by_another_writer(root, docs):
    """The log thread reloads when CURRENT changes, not only when a segment it read is
    gone; the build it served may then be deleted (gc) and writes still apply."""
    with load(root, live_lag_seconds=0.05) as retriever:
        with IndexWriter(root) as writer:
            upsert(writer, "w1", 1)
            until(lambda: retriever.applied_seq == 1)
            writer.compact()
            upsert(writer, "w2", 2)
            report = writer.compact()
        until(lambda: retriever.build_id == report.build_id)  # no refresh: the thread did
        collect_garbage(root, keep=1)
        with IndexWriter(root) as writer:
            seq = upsert(writer, "w3", 3)
        until(lambda: retriever.applied_seq == seq)
        assert retriever.log_failure is None
        assert [d is not None for d in retriever.get_documents(["w1", "w2", "w3"])] == \
            [True, True, True]


def test_a_new_fields_kind_is_the_one_its_write_made_for_every_reader(tmp_path, docs):
    build_small(tmp_path, docs[:30], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("a", "dated text", metadata={"src": "2020-01-01"}),
                       Document("b", "web text", metadata={"src": "web"})],
                      vectors=unit_vectors(2, 5))
    with IndexWriter(tmp_path) as reopened:  # a new writer reads the kind from the log
        assert reopened.kinds["src"] == "keyword"
        reopened.upsert([Document("c", "news text", metadata={"src": "news"})],
                        vectors=unit_vectors(1, 6))
    with load(tmp_path) as retriever:
        assert retriever.snapshot.metadata.kinds["src"] == "keyword"
        hits = retriever.search("text", filters={"src": {"in": ["web", "news"]}}, k=10,
                                query_vector=unit_vectors(1, 7)[0])
        assert sorted(h.doc_id for h in hits.hits) == ["b", "c"]


def test_a_write_that_fails_to_apply_stays_failed_until_it_applies(root, monkeypatch):
    """The records a failed apply read are read again at the next poll: the failure stays
    reported (``log_failure``, /readyz) instead of clearing while the write goes unserved."""
    import retrieval.live.tracker as tracker

    real = tracker.compose
    broken = {"on": True}

    def compose(*args, **kwargs):
        if broken["on"]:
            raise OSError("disk went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker, "compose", compose)
    with load(root, live_lag_seconds=0.05) as retriever:
        with IndexWriter(root) as writer:
            seq = upsert(writer, "stuck", 1)
        time.sleep(0.5)  # ten polls
        assert retriever.log_failure is not None and "disk went away" in retriever.log_failure
        assert retriever.applied_seq == 0
        broken["on"] = False
        until(lambda: retriever.applied_seq == seq)
        assert retriever.get_documents(["stuck"])[0] is not None
        assert retriever.log_failure is None


def test_a_compaction_does_not_undo_a_build_published_while_it_ran(root, docs, monkeypatch):
    """Another process publishes a nightly build while the compaction writes its own: the
    compaction starts again from the nightly build instead of flipping back over it."""
    import indexes.compaction as compaction

    nightly = staged_build(root, docs[:30] + docs[30:35])  # five documents more
    real = compaction.build_index
    published: list[str] = []

    def build_then_publish_elsewhere(*args, **kwargs):
        report = real(*args, **kwargs)
        if not published:
            published.append(publish_build(root, nightly, "gate").build_id)
        return report

    monkeypatch.setattr(compaction, "build_index", build_then_publish_elsewhere)
    with IndexWriter(root) as writer:
        upsert(writer, "live-edit", 1)
        report = writer.compact()
    assert published == [nightly]
    assert read_manifest(resolve_build_dir(root)).build_id == report.build_id
    assert served(root, [docs[32].id, "live-edit"]) == [True, True]
    assert len(list((root / "builds").iterdir())) == 3  # the discarded attempt is gone


def test_publishing_the_live_build_again_flips_nothing(root, docs):
    with IndexWriter(root) as writer:
        upsert(writer, "one", 1)
        writer.compact()
        upsert(writer, "two", 2)
        writer.compact()
    live = resolve_build_dir(root).name
    from indexes.history import read_history, rollback_target

    before, target = read_history(root), rollback_target(root)
    logged = [r.seq for r in read_all(root)]
    assert publish_build(root, live, "gate").build_id == live
    assert read_history(root) == before and rollback_target(root) == target
    assert [r.seq for r in read_all(root)] == logged  # the rollback target's writes stay


def test_the_swap_to_a_new_build_raises_the_served_seq_only_once_it_serves(root,
                                                                          monkeypatch):
    """``wait_for_seq`` must never pass before the write is served: during the swap to a
    compacted build, ``applied_seq`` and ``build_id`` still name what serves."""
    seen: list[tuple[int, str]] = []
    real = Retriever._serve

    def serve(self, snapshot):
        seen.append((self.applied_seq, self.build_id))
        real(self, snapshot)

    monkeypatch.setattr(Retriever, "_serve", serve)
    with load(root) as retriever:
        first = retriever.build_id
        with IndexWriter(root) as writer:
            upsert(writer, "a", 1)
            retriever.refresh()
            upsert(writer, "b", 2)
            report = writer.compact()  # folds seq 2, which this retriever has not read
        seen.clear()
        assert retriever.refresh()
        assert seen[0] == (1, first)  # at the swap, the old state is what is reported
        assert (retriever.applied_seq, retriever.build_id) == (2, report.build_id)


def test_a_failing_apply_backs_off_instead_of_composing_every_poll(root, monkeypatch):
    import retrieval.live.tracker as tracker

    calls: list[float] = []

    def compose(*args, **kwargs):
        calls.append(time.monotonic())
        raise OSError("disk went away")

    monkeypatch.setattr(tracker, "compose", compose)
    with load(root, live_lag_seconds=1.0) as retriever:
        with IndexWriter(root) as writer:
            upsert(writer, "stuck", 1)
        time.sleep(2.0)  # 40 polls at the 50 ms interval
        assert retriever.log_failure is not None
    assert 1 <= len(calls) <= 10, len(calls)


def test_a_missing_current_is_refused_once_not_at_every_poll(root, caplog):
    with load(root, live_lag_seconds=0.05) as retriever:
        current = root / "CURRENT"
        kept = current.read_bytes()
        current.unlink()
        time.sleep(0.5)  # ten polls
        refused = [e for e in retriever.reload_events if e["event"] == "refused"]
        current.write_bytes(kept)
        assert len(refused) == 1
        with IndexWriter(root) as writer:
            seq = upsert(writer, "after", 1)
        until(lambda: retriever.applied_seq == seq)


def test_a_damaged_shard_file_is_caught_by_verify_and_publish(tmp_path, docs, capsys):
    """The top manifest of a sharded build lists only its shards' manifests: their own files
    were checked at load only, so verify, publish and snapshot passed a damaged shard."""
    from indexes.errors import CorruptArtifactError
    from retrieval.cli.app import main

    build_small(tmp_path, docs[:30], shards=2)
    staged = build_index(docs[:30], tmp_path, vectors=unit_vectors(30, 1), encoder_info=INFO,
                         progress=False, dense="exact", shards=2, publish=False)
    vectors = staged.path / "shards" / "shard-000" / "vectors" / "vectors.npy"
    data = bytearray(vectors.read_bytes())
    data[-1] ^= 0x01
    vectors.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="shard-000/vectors/vectors.npy"):
        publish_build(tmp_path, staged.build_id)
    assert main(["verify", str(tmp_path)]) == 0  # the live build is whole
    assert main(["verify", str(staged.path)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err


def test_a_sharded_root_deleted_below_its_shard_count_still_compacts(tmp_path, docs):
    """Two documents left of four shards fold into two shards (every shard needs a row)."""
    build_small(tmp_path, docs[:8], shards=4)
    with IndexWriter(tmp_path) as writer:
        writer.delete([d.id for d in docs[2:8]])
        report = writer.compact()
    assert report.n_docs == 2
    assert len(build_parts(tmp_path)) == 2
    assert served(tmp_path, [d.id for d in docs[:8]]) == [True] * 2 + [False] * 6


def test_a_field_the_published_build_lacks_takes_the_kind_of_all_its_pending_writes(tmp_path,
                                                                                   docs):
    """The live build's ``when`` is a keyword field; tonight's build lacks it, and writers of
    the live build log a date, then a word. The publish check took the two together (a
    keyword field), but every reader, writer and compaction decided the field from the first
    write alone (a date): once published, every load failed at "not an ISO 8601 date:
    'later'", writers refused keyword values and no compaction could fold the log."""
    tagged = [Document(d.id, d.text, d.title, {"when": "someday"} if i < 5 else {})
              for i, d in enumerate(docs[:30])]
    build_index(tagged, tmp_path, vectors=unit_vectors(30, 0), encoder_info=INFO,
                progress=False, dense="exact")
    staged = staged_build(tmp_path, [Document(d.id, d.text, d.title) for d in docs[:30]])
    with IndexWriter(tmp_path) as writer:
        upsert(writer, "dated", 1, when="2020-01-01")
        upsert(writer, "worded", 2, when="later")
    publish_build(tmp_path, staged)
    with load(tmp_path) as retriever:
        assert retriever.build_id == staged and retriever.log_failure is None
        assert retriever.snapshot.metadata.kinds["when"] == "keyword"
        hits = retriever.search(NEEDLE, filters={"when": "later"}, k=10,
                                query_vector=unit_vectors(1, 3)[0])
        assert [h.doc_id for h in hits.hits] == ["worded"]
    with IndexWriter(tmp_path) as writer:
        assert writer.kinds["when"] == "keyword"
        upsert(writer, "worded-too", 3, when="soon")
        writer.compact()
    assert served(tmp_path, ["dated", "worded", "worded-too"]) == [True, True, True]


def test_a_logged_value_its_field_cannot_hold_is_a_typed_error(root):
    """A logged value the served field's kind cannot hold (a word in a date field) failed
    the serving delta with a bare ValueError from the date parser: no caller could tell a
    log that cannot be applied from a bug."""
    from indexes.errors import InvalidWriteError
    from retrieval.live.parts import live_metadata

    with load(root) as retriever:
        base = retriever.snapshot.metadata
    alive = np.ones(base.n_docs, dtype=bool)
    with pytest.raises(InvalidWriteError, match="'when' holds 'later', which is no date"):
        live_metadata(base, alive, [{"when": "later"}], {**base.kinds, "when": "date"})


def test_a_segment_retired_while_a_rollback_reads_the_log_refuses_the_rollback(
        root, docs, monkeypatch):
    """The log held the writes after the rolled-back-to build when the follower checked, and
    lost their segment before it read them: the records were marked applied without being
    served. The build is now refused, and the one serving keeps the writes."""
    import indexes.wal.log as wal_log
    import retrieval.live.tracker as tracker

    with load(root) as retriever:
        with IndexWriter(root) as writer:
            upsert(writer, "day-edit", 1)
            writer.rotate()
            report = writer.compact()
        assert retriever.reload() and retriever.build_id == report.build_id
        rollback(root)
        listed = tracker.segments(root)
        listed[0][1].unlink()  # retired after the check listed it
        monkeypatch.setattr(wal_log, "segments", lambda _root: listed)
        monkeypatch.setattr(tracker, "segments", lambda _root: listed)
        assert not retriever.reload()
        assert retriever.reload_events[-1]["event"] == "refused"
        assert "write-ahead log" in retriever.reload_events[-1]["error"]
        assert retriever.build_id == report.build_id
        assert retriever.get_documents(["day-edit"])[0] is not None
