"""The rebuild contract (``indexes.rebuild``): a build from a corpus export on a root with live
writes supersedes the writes logged before it started (or replays them, when asked), says so
in its report, its manifest and the CLI's output, applies writes logged during it, and deletes
the folded log once no build that may serve again lacks it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from live_index import DIM, INFO, build_small, scifact_docs, unit_vectors

from indexes import Document, build_index
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.publish import publish_build
from indexes.wal import read_all, segments
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.cli.app import main
from retrieval.publishing import check

LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}


class HashEncoder:
    """A real fake of ``indexes.encoders.Encoder``: a text's vector is a function of its
    bytes; ``during`` runs inside the build's encode call (a live write landing mid-build)."""

    encoder_id, model, dim = INFO.encoder_id, INFO.model, DIM

    def __init__(self, during=None) -> None:
        self.during = during

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        if self.during is not None:
            self.during()
            self.during = None
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
                 for t in texts]
        return np.stack([unit_vectors(1, seed)[0] for seed in seeds])


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 40)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    """Built from export v1, then the day's live edits: a delete of a document the next
    export still holds, and an upsert of a test document the next export lacks."""
    build_small(tmp_path, docs[:30])
    with IndexWriter(tmp_path) as writer:
        writer.delete([docs[0].id])
        writer.upsert([Document("live-test", "a live test document")],
                      vectors=unit_vectors(1, 9))
    return tmp_path


def served_ids(root: Path, ids: list[str]) -> list[bool]:
    with Retriever.load(root, LIVE, encoder=HashEncoder()) as retriever:
        return [doc is not None for doc in retriever.get_documents(ids)]


def test_by_default_the_export_supersedes_the_live_writes_and_the_log_is_folded(root, docs):
    export = docs[:30] + [docs[35]]
    report = build_index(export, root, encoder=HashEncoder(), progress=False)
    assert report.live_writes is not None and report.live_writes.policy == "superseded"
    assert (report.live_writes.records, report.live_writes.sealed_seq) == (2, 2)
    assert "superseded by the corpus export" in report.live_writes.describe()
    manifest = read_manifest(report.path)
    assert manifest.log_seq == 2 and manifest.live_writes == report.live_writes
    assert served_ids(root, [docs[0].id, "live-test", docs[35].id]) == [True, False, True]
    # Kept while the build before is the rollback target: a rollback serves them again.
    assert len(read_all(root)) == 2 and report.segments_retired == 0
    with Retriever.load(root, LIVE, encoder=HashEncoder()) as retriever:
        assert retriever.search("cells", k=1).build_id == report.build_id  # no "+N"


def test_replayed_applies_the_live_writes_onto_the_export(root, docs):
    report = build_index(docs[:30], root, encoder=HashEncoder(), progress=False,
                         live_writes="replayed")
    assert report.live_writes is not None and report.live_writes.policy == "replayed"
    assert (report.live_writes.upserted, report.live_writes.deleted) == (1, 1)
    assert served_ids(root, [docs[0].id, "live-test", docs[1].id]) == [False, True, True]
    again = build_index(docs[:30], root, encoder=HashEncoder(), progress=False)
    assert read_all(root) == [] and again.segments_retired == 1  # both builds hold them


def test_replayed_keeps_the_writes_a_compaction_folded(root, docs):
    """The live build is a compaction: the day's first writes are folded into it, and a
    replayed rebuild (replaying only after the live build's log_seq) dropped them."""
    with IndexWriter(root) as writer:
        writer.compact()
        writer.upsert([Document("after-compaction", "written after the compaction")],
                      vectors=unit_vectors(1, 12))
    assert read_manifest(resolve_build_dir(root)).export_seq == 0  # the export behind it
    report = build_index(docs[:30], root, encoder=HashEncoder(), progress=False,
                         live_writes="replayed")
    assert report.live_writes is not None and report.live_writes.records == 3
    assert served_ids(root, [docs[0].id, "live-test", "after-compaction"]) == \
        [False, True, True]
    assert read_manifest(report.path).export_seq == 3


def test_replayed_refuses_when_the_log_lost_what_compactions_folded(root, docs):
    from indexes.errors import LogGapError

    with IndexWriter(root) as writer:
        writer.compact()
        writer.upsert([Document("later", "written between compactions")],
                      vectors=unit_vectors(1, 13))
        writer.compact()  # the first compaction's build is now the rollback target
    live = resolve_build_dir(root)
    with pytest.raises(LogGapError, match="folded live writes after seq 0"):
        build_index(docs[:30], root, encoder=HashEncoder(), progress=False,
                    live_writes="replayed")
    assert resolve_build_dir(root) == live
    report = build_index(docs[:30], root, encoder=HashEncoder(), progress=False)
    assert report.live_writes is not None and report.live_writes.policy == "superseded"


def test_writes_logged_during_the_build_survive_it(root, docs):
    def live_write() -> None:
        with IndexWriter(root) as writer:
            writer.upsert([Document("during", "written while the build ran")],
                          vectors=unit_vectors(1, 11))
            writer.delete([docs[2].id])

    encoder = HashEncoder(during=live_write)  # runs when the new text docs[35] is encoded
    report = build_index(docs[:30] + [docs[35]], root, encoder=encoder, progress=False)
    assert encoder.during is None
    assert read_manifest(report.path).log_seq == 2
    assert [r.seq for r in read_all(root, after=2)] == [3, 4]  # the writes after the seal
    assert served_ids(root, ["during", docs[2].id, "live-test"]) == [True, False, False]


def test_a_staged_build_folds_the_log_when_it_is_published(root, docs):
    report = build_index(docs[:30], root, encoder=HashEncoder(), progress=False,
                         publish=False)
    assert report.segments_retired == 0 and len(read_all(root)) == 2  # still served live
    assert served_ids(root, ["live-test"]) == [True]
    publish_build(root, report.build_id)  # what a gated publish does once the gate passes
    assert resolve_build_dir(root) == report.path
    assert len(segments(root)) == 2  # the folded one (the rollback target lacks it) and
    # the fresh one the build sealed the log into


def test_the_cli_build_says_what_it_did_with_the_live_writes(root, docs, capsys):
    corpus = root.parent / "export_v2.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "text": d.text}) + "\n"
                              for d in docs[:30]))
    assert main(["build", "--corpus", str(corpus), "--out", str(root)]) == 0
    out = capsys.readouterr().out
    assert "live writes: 2 logged writes before the build started (through seq 2: 1 " \
           "documents upserted, 1 deleted) are superseded by the corpus export" in out
    assert "folded log segments" not in out and len(read_all(root)) == 2
    assert main(["build", "--corpus", str(corpus), "--out", str(root)]) == 0
    assert "deleted 1 folded log segments" in capsys.readouterr().out and read_all(root) == []
    with pytest.raises(SystemExit):
        main(["build", "--live-writes", "kept", "--corpus", str(corpus), "--out", str(root)])
    assert "invalid choice" in capsys.readouterr().err


def test_the_gate_reports_a_field_live_upserts_added_that_the_rebuild_drops(tmp_path, docs):
    """The live schema is the build's fields plus those live upserts added (a build that
    allows new fields): a rebuild without one is refused by the gate's metadata check."""
    build_small(tmp_path, docs[:30], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("team-doc", "owned by a team", metadata={"team": "search"})],
                      vectors=unit_vectors(1, 3))
    staged = build_index(docs[:30], tmp_path, encoder=HashEncoder(), progress=False,
                         publish=False)
    report = check(tmp_path, staged.build_id)
    (metadata,) = [c for c in report.checks if c.name == "metadata fields"]
    assert metadata.outcome == "refused" and metadata.figures["lost"] == ["team"]
    assert not report.passed


@pytest.mark.parametrize("dim, refusal", [(16, "carries 8-dimensional vectors"),
                                           (8, "carries vectors of 'test/random-8'")],
                         ids=["wider", "same width"])
def test_a_build_of_another_model_is_not_published_over_pending_writes(tmp_path, docs, dim,
                                                                     refusal):
    """A write pending (logged after the staged build sealed the log) carries the live
    model's vectors: published, the other model's build failed every reader's load
    (numpy's reshape error) and every compaction; of the same width, it served them beside
    its own model's, where their cosines mean nothing."""
    from indexes.errors import EncoderMismatchError, PublishError
    from indexes.manifest import EncoderInfo

    build_small(tmp_path, docs[:20])
    wide = EncoderInfo(encoder_id=f"test/other-{dim}", model=f"other-{dim}", dim=dim,
                       vector_dtype="float32")
    vectors = np.tile(unit_vectors(20, 3), dim // 8) / (dim // 8) ** 0.5
    with IndexWriter(tmp_path) as writer:
        staged = build_index(docs[:20], tmp_path, encoder_info=wide, progress=False,
                             vectors=vectors, dense="exact", publish=False)
        writer.upsert([Document("pending", "written for the live model")],
                      vectors=unit_vectors(1, 4))
        with pytest.raises(PublishError, match=refusal):
            publish_build(tmp_path, staged.build_id)
        assert served_ids(tmp_path, ["pending"]) == [True]
        # Built again, the build seals the log: the pending write is superseded.
        build_index(docs[:20], tmp_path, vectors=vectors, encoder_info=wide, progress=False,
                    dense="exact")
        # A writer opened on the old model refuses to log vectors the live build cannot use.
        with pytest.raises(EncoderMismatchError, match="open a new writer"):
            writer.upsert([Document("late", "too late")], vectors=unit_vectors(1, 5))


def test_a_build_with_another_analyzer_analyzes_the_live_writes_again(tmp_path, docs):
    """A serving process kept the live writes' terms as the old analyzer made them (stemmed)
    after a build without stemming went live: it ranked otherwise than a fresh load."""
    from indexes import AnalyzerConfig, BuildConfig

    build_small(tmp_path, docs[:20])
    query = "cells proteins"  # words of the corpus, in forms a stemmer changes
    staged = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 0), dense="exact",
                         encoder_info=INFO, progress=False, publish=False,
                         config=BuildConfig(analyzer=AnalyzerConfig(stemmer=None)))
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        with IndexWriter(tmp_path) as writer:
            writer.upsert([Document("live-x", "cells proteins cells")],
                          vectors=unit_vectors(1, 6))
        serving.refresh()
        publish_build(tmp_path, staged.build_id)  # the write is after its log_seq: on top
        serving.refresh()
        with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as fresh:
            expected = [(h.doc_id, round(h.bm25_score, 4)) for h in fresh.search(query, k=5).hits]
        got = [(h.doc_id, round(h.bm25_score, 4)) for h in serving.search(query, k=5).hits]
        assert got == expected
        assert dict(expected).get("live-x", 0) > 0


def retyped(docs: list[Document], value) -> list[Document]:
    """``docs`` with their ``year`` field replaced by ``value(year)``."""
    return [Document(d.id, d.text, d.title, {**d.metadata, "year": value(d.metadata["year"])})
            for d in docs]


def test_a_build_that_retypes_a_field_is_not_published_over_writes_of_the_old_kind(
        tmp_path, docs):
    """The live build's ``year`` is a keyword; a rebuild makes it a number while a writer of
    the live build logs a keyword value. Published, every reader's load failed (a raw
    ValueError from float()), and so did every compaction."""
    from indexes.errors import PublishError

    words = retyped(docs[:20], lambda year: f"y{year}")
    build_index(words, tmp_path, vectors=unit_vectors(20, 0), encoder_info=INFO,
                progress=False, dense="exact")
    staged = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 0), encoder_info=INFO,
                         progress=False, dense="exact", publish=False)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("pending", "a keyword year", "", {"year": "medium"})],
                      vectors=unit_vectors(1, 4))
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        with pytest.raises(PublishError, match="'year'.*Pause the writes of the old kind"):
            publish_build(tmp_path, staged.build_id)
        assert not serving.refresh()
        assert serving.get_documents(["pending"])[0] is not None
    assert served_ids(tmp_path, ["pending"]) == [True]


def test_a_publish_waits_for_an_append_in_progress(tmp_path, docs):
    """A writer appends under the log's lock. The publish's check that the pending writes
    fit the new build, and its flip, waited for no writer: a record made for the old build
    could land between them (and then every reader refused the new build)."""
    import fcntl
    import threading

    from indexes.wal.log import wal_dir

    build_small(tmp_path, docs[:20])
    staged = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1), encoder_info=INFO,
                         progress=False, dense="exact", publish=False)
    IndexWriter(tmp_path).close()  # the root has a log
    with open(wal_dir(tmp_path) / ".writer.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a writer mid-append
        publishing = threading.Thread(target=publish_build, args=(tmp_path, staged.build_id))
        publishing.start()
        publishing.join(1.0)
        assert publishing.is_alive(), "the publish flipped during an append"
        assert resolve_build_dir(tmp_path).name != staged.build_id
    publishing.join(30)
    assert resolve_build_dir(tmp_path).name == staged.build_id


def test_a_writer_checks_against_the_build_live_now(tmp_path, docs):
    """A writer that last saw the old build refused, again and again, upserts that fit the
    build live now (a retyped field), until something else made it catch up."""
    words = retyped(docs[:20], lambda year: f"y{year}")
    build_index(words, tmp_path, vectors=unit_vectors(20, 0), encoder_info=INFO,
                progress=False, dense="exact")
    with IndexWriter(tmp_path) as writer:
        build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 0), encoder_info=INFO,
                    progress=False, dense="exact")  # year is a number now
        seq = writer.upsert([Document("new", "a number year", "", {"year": 2001})],
                            vectors=unit_vectors(1, 4))
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        serving.wait_for_seq(seq)
        assert serving.get_documents(["new"])[0] is not None


def test_a_build_refused_mid_swap_leaves_the_writes_on_the_old_build(tmp_path, docs):
    """A filter registered while a reload ran (after its check, before its swap) refused the
    new build, but the log follower had already moved to it: later writes were applied to
    the refused build, or never (``/readyz`` failed for good)."""
    build_small(tmp_path, docs[:20])
    no_department = [Document(d.id, d.text, d.title, {"year": d.metadata["year"]})
                     for d in docs[:20]]
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        old = serving.snapshot.build_id
        checked = serving._log.check_fits

        def register_meanwhile(base):
            checked(base)
            serving.register_filter("cardio", {"department": "cardiology"})

        serving._log.check_fits = register_meanwhile  # the interleaving, made certain
        build_index(no_department, tmp_path, vectors=unit_vectors(20, 0), encoder_info=INFO,
                    progress=False, dense="exact")
        assert not serving.reload()
        assert serving.reload_events[-1]["event"] == "refused"
        with IndexWriter(tmp_path) as writer:
            seq = writer.upsert([Document("later", "a later write", "", {"year": 2001})],
                                vectors=unit_vectors(1, 4))
        result = serving.search("later write", k=3, min_seq=seq)
        assert result.build_id.startswith(old + "+")
        assert "later" in [hit.doc_id for hit in result.hits]
        assert serving.search("later write", k=3, filters={"$named": "cardio"}).hits
        assert serving._log.failure is None


def test_a_build_put_off_by_a_shard_down_is_loaded_once_the_shard_is_back(tmp_path, docs):
    """A Ray-served root's new build could not be prepared while one shard had no replica
    for a moment; that was recorded as a refusal of the build, and it was never tried again
    until the next publish."""
    from retrieval import ShardUnavailableError

    build_small(tmp_path, docs[:20])
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        opened = serving._open
        down = [True]

        def open_while_a_shard_is_down(path):  # as RayShardedBuild's preparation fails
            if down[0]:
                raise ShardUnavailableError("shard shard-001 has no live replica", "shard-001")
            return opened(path)

        new = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1), encoder_info=INFO,
                          progress=False, dense="exact")
        tries = []
        serving._open = lambda path: (tries.append(path), open_while_a_shard_is_down(path))[1]
        assert not serving.reload() and not serving.reload()
        assert len(tries) == 1  # the next try after a pause: each may wait out a timeout
        assert [e["event"] for e in serving.reload_events] == ["loaded", "deferred"]
        down[0] = False
        give_up = time.monotonic() + 30
        while not serving.reload():
            assert time.monotonic() < give_up, "the deferred build was not tried again"
            time.sleep(0.1)
        assert serving.snapshot.build_id == new.build_id


def test_an_older_export_finishing_last_does_not_replace_a_newer_one(root, docs):
    """Two nightly builds overlapped: the slow one read its export first, the other read a
    later export and went live first. The slow one then went live over it with no word,
    bringing back the older export (and its build id is the newer one)."""
    from indexes.errors import LiveBuildChangedError
    from retrieval.publishing import publish

    older = HashEncoder()
    newer_ids = [d.id for d in docs[5:35]]

    def newer_build_meanwhile():  # while the slow build encodes its (older) export
        build_index(docs[5:35], root, encoder=HashEncoder(), progress=False, dense="exact")

    older.during = newer_build_meanwhile
    with pytest.raises(LiveBuildChangedError, match="would bring back the older export"):
        # docs[35:] are new: encoded (the live build's vectors serve the others)
        build_index(docs[:30] + docs[35:], root, encoder=older, progress=False, dense="exact")
    with Retriever.load(root, LIVE, encoder=HashEncoder()) as retriever:
        assert sorted(retriever.snapshot.docs.all_ids()) == sorted(newer_ids)
    stale = sorted(p.name for p in (root / "builds").iterdir())[-1]
    assert resolve_build_dir(root).name != stale  # placed, not live
    refused = publish(root, stale)
    assert not refused.published
    assert refused.report.check("corpus export").outcome == "refused"
    assert publish(root, stale, force=True).published  # asked for: served


def test_a_build_that_served_before_may_be_published_back(tmp_path, docs):
    """On a root without a log every build's export is at seq 0, and the time it was read
    decided: publishing back the first build, live before, was refused as an older export."""
    build_small(tmp_path, docs[:20])
    first = resolve_build_dir(tmp_path).name
    build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1), encoder_info=INFO,
                progress=False, dense="exact")
    publish_build(tmp_path, first)
    assert resolve_build_dir(tmp_path).name == first


def test_compactions_during_a_long_build_leave_it_the_writes_it_needs(tmp_path, docs):
    """A build that reads its corpus hours before it is placed (build_on_ray encodes it
    first) seals the log then. Two compactions meanwhile retired the records after that seal
    (the rollback target was the first compaction), and the build was refused at publish
    (LogGapError): hours of encoding for nothing. The build pins the log while it runs."""
    from indexes import rebuild
    from indexes.wal.seal import unpin

    build_small(tmp_path, docs[:20])
    sealed = rebuild.start(tmp_path, "superseded")  # the corpus is read, then encoded
    with IndexWriter(tmp_path) as writer:
        for i in range(2):
            writer.upsert([Document(f"during-{i}", "a write while the corpus encodes")],
                          vectors=unit_vectors(1, 10 + i))
            writer.compact()
    report = build_index(docs[:30], tmp_path, vectors=unit_vectors(30, 3), encoder_info=INFO,
                         progress=False, dense="exact", sealed=sealed)
    assert report.published
    assert served_ids(tmp_path, ["during-0", "during-1"]) == [True, True]
    unpin(sealed.pin)  # what build_on_ray does when the build ends
    assert not list((tmp_path / "wal" / "pins").iterdir())


class SlowLoads:
    """Makes ``serving`` load builds only when the test says (verifying a large build takes
    seconds): ``started`` is set once a load begins, ``release`` lets it go on."""

    def __init__(self, serving: Retriever) -> None:
        import threading

        self.started, self.release = threading.Event(), threading.Event()
        opened = serving._open

        def slow_open(path: Path):
            self.started.set()
            self.release.wait(60)
            return opened(path)

        serving._open = slow_open


def test_writes_apply_on_the_build_served_while_a_new_one_loads(tmp_path, docs):
    """The log thread loaded a newly published build itself: for as long as the load took,
    no acknowledged write was served, and min_seq searches waited for it."""
    build_small(tmp_path, docs[:20])
    with Retriever.load(tmp_path, {**LIVE, "live_lag_seconds": 0.05},
                        encoder=HashEncoder()) as serving:
        slow = SlowLoads(serving)
        new = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1),
                          encoder_info=INFO, progress=False, dense="exact")
        assert slow.started.wait(30)  # the log thread saw it and started loading it
        try:
            with IndexWriter(tmp_path) as writer:
                seq = writer.upsert([Document("during", "written while a build loads")],
                                    vectors=unit_vectors(1, 4))
            until = time.monotonic() + 30
            while serving.applied_seq < seq:  # by the log thread, within its lag
                assert time.monotonic() < until, "the write waited for the load"
                time.sleep(0.02)
            result = serving.search("written while a build loads", k=3, min_seq=seq)
            assert result.hits[0].doc_id == "during"
            assert serving.loading() and serving.log_failure is None
        finally:
            slow.release.set()
        serving.refresh()  # waits for the load under way
        assert serving.build_id.startswith(new.build_id)
        assert serving.get_documents(["during"])[0] is not None


def test_a_write_for_a_new_model_waits_for_its_build_to_load(tmp_path, docs):
    """Published while the served build has a model of the same width, a new build's
    writes carry its model's vectors: applied on the old build while the new one loaded,
    they were ranked by cosines across two models. They wait for it instead, and /readyz
    (the log's failure) does not say the log is broken meanwhile."""
    import threading

    from indexes.manifest import EncoderInfo

    build_small(tmp_path, docs[:20])
    other = EncoderInfo(encoder_id="test/other-8", model="other-8", dim=DIM,
                        vector_dtype="float32")
    with Retriever.load(tmp_path, {**LIVE, "live_lag_seconds": 0.05}) as serving:
        slow = SlowLoads(serving)
        new = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1),
                          encoder_info=other, progress=False, dense="exact")
        assert slow.started.wait(30)
        searched: list = []
        try:
            with IndexWriter(tmp_path) as writer:
                seq = writer.upsert([Document("new-model", "written for the new model")],
                                    vectors=unit_vectors(1, 4))
            time.sleep(0.5)  # ten of the log thread's polls
            assert serving.applied_seq < seq and serving.log_failure is None
            assert serving.get_documents(["new-model"]) == [None]
            waiting = threading.Thread(target=lambda: searched.append(serving.search(
                "written for the new model", k=3, min_seq=seq,
                query_vector=unit_vectors(1, 4)[0])))
            waiting.start()
            time.sleep(0.3)
            assert not searched  # it waits for the build its write was made for
        finally:
            slow.release.set()
        waiting.join(30)
        assert searched and searched[0].build_id.startswith(new.build_id)
        assert searched[0].hits[0].doc_id == "new-model"
        assert serving.log_failure is None


def test_writes_read_before_one_for_the_loading_build_are_served_at_once(tmp_path, docs):
    """One poll read a write the served build can take and, after it, one logged for the
    build loading beside (a field it retyped): the whole poll waited for the load, and a
    min_seq for the first write with it."""
    base = [Document(d.id, d.text, metadata={"x": "low"}) for d in docs[:20]]
    retyped = [Document(d.id, d.text, metadata={"x": 1}) for d in docs[:20]]
    build_small(tmp_path, base)
    with Retriever.load(tmp_path, {**LIVE, "live_lag_seconds": 0.05}) as serving:
        slow = SlowLoads(serving)
        build_index(retyped, tmp_path, vectors=unit_vectors(20, 1), encoder_info=INFO,
                    progress=False, dense="exact")
        assert slow.started.wait(30)
        try:
            with serving._log._lock, IndexWriter(tmp_path) as writer:  # read in one poll
                first = writer.upsert([Document("fits", "no retyped field")],
                                      vectors=unit_vectors(1, 4))
                writer.upsert([Document("retyped", "a number", metadata={"x": 2})],
                              vectors=unit_vectors(1, 5))
            until = time.monotonic() + 30
            while serving.applied_seq < first:
                assert time.monotonic() < until, "the first write waited for the load"
                time.sleep(0.02)
            assert serving.get_documents(["fits", "retyped"])[1] is None
            assert serving.loading() and serving.log_failure is None
        finally:
            slow.release.set()
        serving.refresh()
        assert [d is not None for d in serving.get_documents(["fits", "retyped"])] == \
            [True, True]


def test_a_load_that_fails_for_no_fault_of_the_build_is_tried_again_later(tmp_path, docs):
    """The log thread's load runs in a thread of its own: an error there (out of file
    handles, say) ended that thread with nothing logged or counted, and the next poll
    started the same load again, 20 times a second."""
    build_small(tmp_path, docs[:20])
    with Retriever.load(tmp_path, {**LIVE, "live_lag_seconds": 0.05},
                        encoder=HashEncoder()) as serving:
        opened, tries = serving._open, []

        def failing_once(path: Path):
            tries.append(path)
            if len(tries) == 1:
                raise OSError(24, "Too many open files")
            return opened(path)

        serving._open = failing_once
        new = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 1), encoder_info=INFO,
                          progress=False, dense="exact")
        until = time.monotonic() + 30
        while not serving.build_id.startswith(new.build_id):
            assert time.monotonic() < until, f"never served; events {serving.reload_events}"
            time.sleep(0.02)
        assert len(tries) == 2  # once, then after the pause (1 s), not at every poll
        deferred = [e for e in serving.reload_events if e["event"] == "deferred"]
        assert len(deferred) == 1 and "Too many open files" in deferred[0]["error"]


def test_writes_that_stored_a_new_field_two_ways_are_served(tmp_path, docs):
    """A new field stored as an object by one write and as a number by the next: the writer
    takes both (the object is stored, not indexed), and so must a serving process reading
    them in one poll."""
    build_small(tmp_path, docs[:20], allow_new_fields=True)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("a", "first", metadata={"x": {"k": 1}})],
                      vectors=unit_vectors(1, 4))
        seq = writer.upsert([Document("b", "second", metadata={"x": 5})],
                            vectors=unit_vectors(1, 5))
    with Retriever.load(tmp_path, LIVE, encoder=HashEncoder()) as serving:
        assert serving.applied_seq == seq and serving.log_failure is None
        assert [d is not None for d in serving.get_documents(["a", "b"])] == [True, True]


def test_a_rebuild_of_an_index_named_before_weight_digests_takes_its_pending_writes(tmp_path,
                                                                                    docs):
    """The same model, its id spelled with the weights' digest now: the writes logged for
    the old spelling are the same model's vectors."""
    from indexes.manifest import EncoderInfo

    legacy = EncoderInfo(encoder_id="mymodel:torch:fp32:8", model="mymodel", dim=DIM,
                         vector_dtype="float32")
    digested = EncoderInfo(encoder_id="mymodel@0123abcd0123:torch:fp32:8",
                           model="mymodel@0123abcd0123", dim=DIM, vector_dtype="float32")
    build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 0), encoder_info=legacy,
                progress=False, dense="exact")
    with IndexWriter(tmp_path) as writer:
        staged = build_index(docs[:20], tmp_path, vectors=unit_vectors(20, 0),
                             encoder_info=digested, progress=False, dense="exact",
                             publish=False)
        writer.upsert([Document("during", "logged while the rebuild ran")],
                      vectors=unit_vectors(1, 4))
    publish_build(tmp_path, staged.build_id)
    assert resolve_build_dir(tmp_path).name == staged.build_id


def test_a_replay_refuses_when_a_compaction_retires_segments_while_it_reads_the_log(
        root, docs, monkeypatch):
    """A compaction in another process goes live while a replayed rebuild reads the log and
    retires the segment it was about to open. ``read_all`` skipped the vanished segment and
    kept the older records before it, so the replay (whose first seq was right) silently
    dropped that segment's edits: a document deleted live came back."""
    import indexes.wal.log as wal_log
    from indexes.errors import LogGapError

    with IndexWriter(root) as writer:  # seqs 1-2 (the fixture's) in the first segment
        writer.rotate()
        writer.delete([docs[3].id])  # seq 3, in the segment the compaction retires
        writer.upsert([Document("mid", "in the retired segment")], vectors=unit_vectors(1, 3))
        writer.compact()  # live: seq 4; the rollback target (the first build) keeps all
        writer.upsert([Document("late", "after the compaction")], vectors=unit_vectors(1, 4))
    assert [first for first, _ in segments(root)] == [1, 3, 5]
    opened = open

    def compacting_meanwhile(path, *args, **kwargs):
        if Path(path).name == "00000000000000000003.wal" and not fired:
            fired.append(path)
            with IndexWriter(root) as other:  # live: seq 5, rollback target seq 4
                other.compact()
        return opened(path, *args, **kwargs)

    fired: list[Path] = []
    monkeypatch.setattr(wal_log, "open", compacting_meanwhile, raising=False)
    with pytest.raises(LogGapError, match="seq 3 is gone"):
        build_index(docs[:30], root, encoder=HashEncoder(), progress=False,
                    live_writes="replayed")
    monkeypatch.undo()
    assert fired and [first for first, _ in segments(root)][0] > 3
    assert served_ids(root, [docs[0].id, docs[3].id, "live-test", "mid", "late"]) == \
        [False, False, True, True, True]


def test_a_build_that_splits_passages_otherwise_is_not_published_over_pending_writes(
        tmp_path, docs):
    """A rebuild with longer passages published while upserts split for the live build
    were pending: served, they read fine, but every compaction failed (no vector for the
    new cuts) with a message blaming the tokenizer."""
    from indexes import BuildConfig, PassageConfig
    from indexes.errors import PublishError

    short, long = PassageConfig(max_tokens=48, overlap_tokens=8), \
        PassageConfig(max_tokens=128, overlap_tokens=16)
    build_index(docs[:20], tmp_path, encoder=HashEncoder(), progress=False, dense="exact",
                config=BuildConfig(passages=short))
    live = resolve_build_dir(tmp_path)
    staged = build_index(docs[:20], tmp_path, encoder=HashEncoder(), progress=False,
                         dense="exact", config=BuildConfig(passages=long), publish=False)
    longest = max(docs[:20], key=lambda d: len(d.text))
    with IndexWriter(tmp_path, encoder=HashEncoder()) as writer:
        writer.upsert([Document("pending", longest.text + " appendix", longest.title)])
    with pytest.raises(PublishError, match="'pending'.*at most 48 tokens.*at most 128 "
                                           "tokens.*stays placed"):
        publish_build(tmp_path, staged.build_id)
    assert resolve_build_dir(tmp_path) == live
    # As the message says: a build with the new settings that replays the writes
    report = build_index(docs[:20], tmp_path, encoder=HashEncoder(), progress=False,
                         dense="exact", config=BuildConfig(passages=long),
                         live_writes="replayed")
    assert resolve_build_dir(tmp_path).name == report.build_id
    with IndexWriter(tmp_path, encoder=HashEncoder()) as writer:
        writer.upsert([Document("later", longest.text + " coda", longest.title)])
        writer.compact()
    assert served_ids(tmp_path, ["pending", "later"]) == [True, True]


def test_a_rollback_over_passage_writes_split_otherwise_is_warned_not_refused(
        tmp_path, docs, caplog):
    """The check that keeps such a build from being published also refused the rollback, the
    emergency exit, advising a rebuild in the middle of an incident."""
    import logging

    from indexes import BuildConfig, PassageConfig
    from indexes.publish import rollback

    short, long = PassageConfig(max_tokens=48, overlap_tokens=8), \
        PassageConfig(max_tokens=128, overlap_tokens=16)
    build_index(docs[:20], tmp_path, encoder=HashEncoder(), progress=False, dense="exact",
                config=BuildConfig(passages=short))
    before = resolve_build_dir(tmp_path)
    build_index(docs[:20], tmp_path, encoder=HashEncoder(), progress=False, dense="exact",
                config=BuildConfig(passages=long))
    longest = max(docs[:20], key=lambda d: len(d.text))
    with IndexWriter(tmp_path, encoder=HashEncoder()) as writer:
        writer.upsert([Document("later", longest.text + " coda", longest.title)])
    with caplog.at_level(logging.WARNING, logger="indexes.going_live"):
        rollback(tmp_path)
    assert resolve_build_dir(tmp_path) == before
    assert "rolled back over pending passage writes split otherwise" in caplog.text


@pytest.mark.parametrize("call", ["upsert", "delete"])
@pytest.mark.parametrize("given", [None, 42])
def test_a_write_of_no_list_says_what_to_pass(tmp_path, docs, call, given):
    """``upsert(None)``, ``delete(7)``: a bare TypeError from ``list()``, not the
    ``InvalidWriteError`` every other malformed write is."""
    from indexes.errors import InvalidWriteError

    build_small(tmp_path, docs[:10])
    with IndexWriter(tmp_path) as writer:
        with pytest.raises(InvalidWriteError, match="not a list: give a list of"):
            getattr(writer, call)(given)
    assert read_all(tmp_path) == []
