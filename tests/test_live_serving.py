"""Serving live writes: base (masked) plus delta searched as one collection, exact filters over
both, cache keys that move with the log, other processes within the lag, and readers that never
see a deleted document or an error while writes and compactions run."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from live_index import build_small, scifact_docs, unit_vectors

from indexes import Document
from indexes.wal import segments
from indexes.wal.log import LogCorruptionError, Record, encode_record
from indexes.writer import IndexWriter
from retrieval import Retriever

NEEDLE = "zebrafish telomerase hibernation"


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 160)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    build_small(tmp_path, docs[:150])
    return tmp_path


def ids(result) -> list[str]:
    return [hit.doc_id for hit in result.hits]


def load(root: Path, **config) -> Retriever:
    """The vectors are random: rank by BM25 (weight 0 on the cosine) so texts decide."""
    return Retriever.load(root, {"cache": {"backend": "none"}, "live_lag_seconds": None,
                                 "vector_weight": 0.0, **config})


def test_upserts_and_deletes_after_refresh_with_exact_filters(root, docs):
    query_vector = unit_vectors(1, 99)[0]
    with load(root) as retriever, IndexWriter(root) as writer:
        new = Document("new-1", f"{NEEDLE} in a new study", metadata={"year": 2031})
        changed = Document(docs[5].id, f"{NEEDLE} rewritten", metadata={"year": 1999})
        writer.upsert([new, changed], vectors=unit_vectors(2, 7))
        assert "new-1" not in ids(retriever.search(NEEDLE, query_vector=query_vector, k=5))
        assert retriever.refresh()
        result = retriever.search(NEEDLE, query_vector=query_vector, k=5)
        assert set(ids(result)[:2]) == {"new-1", docs[5].id}
        assert len(ids(result)) == len(set(ids(result)))  # the old version is gone
        assert result.allowed == 151 and result.build_id.endswith("+1")
        assert retriever.stats()["log"] == {"applied_seq": 1, "base_log_seq": 0, "records": 1,
                                          "failure": None}
        assert retriever.build_id == result.build_id.split("+")[0]  # metrics label the build
        only = retriever.search(NEEDLE, filters={"year": {"gte": 2030}}, query_vector=query_vector)
        assert ids(only) == ["new-1"] and only.allowed == 1
        old_text = retriever.search(docs[5].text[:200], query_vector=query_vector, k=200)
        assert [h.text for h in old_text.hits if h.doc_id == docs[5].id] in ([], [changed.text])
        writer.delete(["new-1", docs[7].id])
        retriever.refresh()
        after = retriever.search(NEEDLE, query_vector=query_vector, k=200)
        assert not {"new-1", docs[7].id} & set(ids(after)) and after.allowed == 149


def test_result_cache_keys_include_the_log_position(root):
    query_vector = unit_vectors(1, 3)[0]
    with load(root, cache={"backend": "memory"}) as retriever, IndexWriter(root) as writer:
        first = retriever.search(NEEDLE, query_vector=query_vector)
        writer.upsert([Document("new-2", NEEDLE)], vectors=unit_vectors(1, 4))
        retriever.refresh()
        second = retriever.search(NEEDLE, query_vector=query_vector)
        assert "new-2" not in ids(first) and ids(second)[0] == "new-2"


def test_writes_after_a_compaction_started_are_kept_and_none_counted_twice(root, docs):
    query_vector = unit_vectors(1, 5)[0]
    with load(root) as retriever, IndexWriter(root) as writer:
        writer.upsert([Document("a-1", NEEDLE)], vectors=unit_vectors(1, 6))
        retriever.refresh()  # this reader applied a-1 from the log
        report = writer.compact()
        writer.upsert([Document("b-1", f"{NEEDLE} again")], vectors=unit_vectors(1, 8))
        assert retriever.refresh()
        result = retriever.search(NEEDLE, query_vector=query_vector, k=5)
        assert result.build_id == f"{report.build_id}+{report.log_seq + 1}"
        assert set(ids(result)[:2]) == {"a-1", "b-1"} and result.allowed == 152
        with load(root) as fresh:  # a process starting now sees the same collection
            again = fresh.search(NEEDLE, query_vector=query_vector, k=5)
            assert ids(again) == ids(result) and again.allowed == 152
            # The first process reused its analyzed texts for the compacted build; this one
            # analyzed that build: the same BM25 scores.
            assert [h.bm25_score for h in again.hits] == pytest.approx(
                [h.bm25_score for h in result.hits], abs=1e-9)


def _write_in_child(root: Path, n: int, ready_fd: int) -> None:
    try:
        with IndexWriter(root) as writer:
            for i in range(n):
                writer.upsert([Document(f"p-{i}", f"{NEEDLE} {i}")], vectors=unit_vectors(1, i))
                os.write(ready_fd, f"{i}\n".encode())
                time.sleep(0.05)
    finally:
        os._exit(0)


def test_a_write_from_another_process_becomes_visible_without_refresh(root):
    """Correctness only: each write shows up on its own (the lag is measured in
    benchmarks/live.py)."""
    query_vector = unit_vectors(1, 9)[0]
    with load(root, live_lag_seconds=0.2) as retriever:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child exits
            os.close(read_end)
            _write_in_child(root, 5, write_end)
        os.close(write_end)
        os.waitpid(pid, 0)
        os.close(read_end)
        wanted = {f"p-{i}" for i in range(5)}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if wanted <= set(ids(retriever.search(NEEDLE, query_vector=query_vector, k=10))):
                break
            time.sleep(0.05)
        assert wanted <= set(ids(retriever.search(NEEDLE, query_vector=query_vector, k=10)))


def test_four_readers_during_writes_and_compactions(root, docs):
    """0 errors, and no hit for a document whose delete was applied before the search."""
    queries = [d.text[:60] for d in docs[:20]]
    vectors = unit_vectors(20, 11)
    deleted: set[str] = set()
    guard = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    searches = [0]

    with load(root, live_lag_seconds=0.05) as retriever:

        def read(worker: int) -> None:
            i = worker
            while not stop.is_set():
                with guard:
                    gone = set(deleted)
                try:
                    result = retriever.search(queries[i % 20], query_vector=vectors[i % 20],
                                              k=20)
                    assert not gone & set(ids(result)), gone & set(ids(result))
                except BaseException as exc:  # noqa: BLE001 - every failure is reported
                    errors.append(exc)
                searches[0] += 1
                i += 4

        threads = [threading.Thread(target=read, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        with IndexWriter(root) as writer:
            for round_ in range(6):
                batch = [Document(f"r{round_}-{j}", queries[j]) for j in range(10)]
                writer.upsert(batch, vectors=unit_vectors(10, round_))
                victims = [docs[round_ * 3 + j].id for j in range(3)] + [f"r{round_}-0"]
                writer.delete(victims)
                retriever.refresh()
                with guard:
                    deleted.update(victims)
                if round_ % 3 == 2:
                    writer.compact()
                    retriever.refresh()
        time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == [] and searches[0] > 20


def _append_damaged_then_whole(path: Path, first_seq: int, ids: list[str]) -> None:
    """Append, in one write (no reader sees one without the other), a delete record whose
    payload is damaged and a whole delete record after it."""
    damaged = bytearray(encode_record(Record(first_seq, "delete", ids=(ids[0],))))
    damaged[-3] ^= 0x10
    whole = encode_record(Record(first_seq + 1, "delete", ids=(ids[1],)))
    with open(path, "ab") as handle:
        handle.write(bytes(damaged) + whole)


def test_a_damaged_record_stops_the_log_loudly_and_the_last_good_state_serves(root, docs):
    """Damage to a record not yet applied, with a whole record after it: ``refresh`` raises,
    the background follower reports it (``log_failure``, the service's /readyz), the state
    applied before it keeps serving; a fresh load refuses the root instead of dropping it."""
    query_vector = unit_vectors(1, 99)[0]
    with load(root, live_lag_seconds=0.2) as retriever:
        with IndexWriter(root) as writer:
            seq = writer.upsert([Document("first", f"{NEEDLE} first")],
                                vectors=unit_vectors(1, 1))
        assert retriever.refresh()
        (_, path), = segments(root)
        _append_damaged_then_whole(path, seq + 1, [docs[0].id, docs[1].id])
        with pytest.raises(LogCorruptionError, match="whole records follow"):
            retriever.refresh()
        deadline = time.monotonic() + 10
        while retriever.log_failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert retriever.log_failure is not None and "damaged" in retriever.log_failure
        found = ids(retriever.search(NEEDLE, query_vector=query_vector, k=5))
        assert "first" in found
        assert docs[1].id in ids(retriever.search(docs[1].text[:60], k=150,
                                                  query_vector=query_vector))
    with pytest.raises(LogCorruptionError):
        load(root)


def test_negated_filters_count_only_the_documents_that_serve(root, docs):
    """A replaced or deleted base row holds no value, so a negation matched it: the hits were
    right, but ``allowed`` counted the gone rows too."""
    query_vector = unit_vectors(1, 12)[0]
    with load(root) as retriever, IndexWriter(root) as writer:
        writer.delete([d.id for d in docs[10:15]])
        writer.upsert([Document(docs[20].id, f"{NEEDLE} replaced", metadata={"year": 2001})],
                      vectors=unit_vectors(1, 13))
        retriever.refresh()
        everything = retriever.search(NEEDLE, query_vector=query_vector, k=5).allowed
        assert everything == 145
        for spec in ({"department": {"ne": "no such department"}},
                     {"department": {"nin": ["no such department"]}},
                     {"$not": {"year": {"gte": 3000}}},
                     "NOT (department = \"no such department\")"):
            assert retriever.search(NEEDLE, filters=spec, query_vector=query_vector,
                                    k=5).allowed == everything, spec
        serving = [d for d in docs[:150] if d.id not in {x.id for x in docs[10:15]}
                   and d.id != docs[20].id]  # and the new version, which has a year
        yearless = sum(1 for d in serving if d.metadata.get("year") is None)
        absent = retriever.search(NEEDLE, filters={"year": {"exists": False}},
                                  query_vector=query_vector, k=5)
        assert absent.allowed == yearless


def test_two_compactions_during_a_load_are_followed_not_called_lost_writes(root, docs,
                                                                           monkeypatch):
    """Between opening the build and following its log, a compaction, five writes and a
    compaction more: the first apply found its segment retired and reloaded the retriever,
    which served the new build past the follower; its retry said the writes were gone."""
    warm_up = Retriever._warm_up

    def meanwhile(self: Retriever) -> None:
        warm_up(self)
        with IndexWriter(root) as writer:
            writer.delete(["never-there"])
            writer.compact()
            for n in range(5):
                writer.upsert([Document(f"late-{n}", f"{NEEDLE} {n}")],
                              vectors=unit_vectors(1, n))
            writer.compact()

    monkeypatch.setattr(Retriever, "_warm_up", meanwhile)
    with load(root) as retriever:
        found = ids(retriever.search(NEEDLE, k=10, query_vector=unit_vectors(1, 9)[0]))
        assert sorted(found[:5]) == [f"late-{n}" for n in range(5)]
        assert retriever.applied_seq == 6
