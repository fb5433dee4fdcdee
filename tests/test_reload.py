"""Hot reload of nightly builds under load; corrupt builds refused; old builds collected."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref

import pytest

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.errors import CorruptArtifactError
from indexes.manifest import CURRENT, read_manifest
from retrieval import Retriever
from retrieval.cli import main as cli

QUERIES = ["cell differentiation", "cancer risk", "immune response", "gene expression",
           "protein structure", "blood pressure"]


@pytest.fixture(scope="module")
def docs(dataset):
    return list(itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 200))


def _variant(docs: list[Document], n: int) -> list[Document]:
    """A new nightly build: one document's text changes, so every build has a new id."""
    first = docs[0]
    return [Document(first.id, f"{first.text} revision {n}", first.title, first.metadata),
            *docs[1:]]


def test_publishing_while_eight_threads_search(docs, encoder, tmp_path, build_subset):
    build_subset(docs, tmp_path)
    retriever = Retriever.load(tmp_path, {"reload_interval_seconds": 0.05,
                                          "cache": {"backend": "none"}}, encoder=encoder)
    snapshots = [weakref.ref(retriever.snapshot)]
    failures: list[BaseException] = []
    observed: list[tuple[float, float, str]] = []
    stop = threading.Event()

    def searcher(offset: int) -> None:
        for n in itertools.count(offset):
            if stop.is_set():
                return
            try:
                started = time.monotonic()
                result = retriever.search(QUERIES[n % len(QUERIES)], k=5)
                observed.append((started, time.monotonic(), result.build_id))
            except BaseException as exc:  # noqa: BLE001 - the test counts every failure
                failures.append(exc)

    threads = [threading.Thread(target=searcher, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        for n in range(8):
            build_subset(_variant(docs, n), tmp_path)
            time.sleep(0.3)
            snapshots.append(weakref.ref(retriever.snapshot))
    finally:
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join()
        retriever.close()
    assert not failures, failures[:3]
    live = retriever.live_windows()
    assert len(live) >= 5  # the reloader really swapped builds while searches ran
    for started, ended, build in observed:
        window_start, window_end = live[build]
        assert window_start <= ended and started <= window_end, (build, started, ended)
    gc.collect()
    alive = [ref for ref in snapshots if ref() is not None]
    assert len(alive) <= 2, "old builds are released once no request uses them"


def test_corrupt_new_build_is_refused_and_old_one_keeps_serving(docs, encoder, tmp_path,
                                                                build_subset):
    build_subset(docs, tmp_path)
    # No log follower: its own poll may load (or refuse) a new build before reload() does.
    retriever = Retriever.load(tmp_path, {"cache": {"backend": "none"}, "live_lag_seconds": None},
                               encoder=encoder)
    old = retriever.build_id
    report = build_subset(_variant(docs, 1), tmp_path)
    victim = report.path / "vectors" / "vectors.npy"
    data = bytearray(victim.read_bytes())
    data[-7] ^= 0x01
    victim.write_bytes(bytes(data))
    assert retriever.reload() is False
    assert retriever.build_id == old
    assert retriever.search("cell", k=3).build_id == old
    refused = retriever.stats()["reloads"][-1]
    assert refused["event"] == "refused" and "vectors.npy" in refused["error"]
    events = len(retriever.reload_events)
    assert retriever.reload() is False and len(retriever.reload_events) == events  # not again
    good = build_subset(_variant(docs, 2), tmp_path)  # a rewritten CURRENT is looked at
    assert retriever.reload() is True and retriever.build_id == good.build_id


@pytest.mark.parametrize("name", ["../elsewhere", "/tmp", ".tmp-x", ""])
def test_current_naming_no_build_of_the_root_is_refused(docs, tmp_path, build_subset, name):
    """``CURRENT`` must name a build under the root's builds/: never a path elsewhere."""
    build_subset(docs, tmp_path / "root")
    build_subset(docs, tmp_path / "elsewhere")
    (tmp_path / "root" / CURRENT).write_text(name + "\n")
    with pytest.raises(CorruptArtifactError, match="not a build id"):
        Retriever.load(tmp_path / "root", {"cache": {"backend": "none"}})
    assert cli(["verify", str(tmp_path / "root")]) != 0


def test_gc_keeps_newest_and_live_builds(docs, encoder, tmp_path, capsys, build_subset):
    ids = [build_subset(_variant(docs, n), tmp_path).build_id
           for n in range(4)]
    (tmp_path / CURRENT).write_text(ids[0] + "\n")  # an operator rolled back to the oldest
    assert cli(["gc", str(tmp_path), "--keep", "2"]) == 0
    remaining = sorted(p.name for p in (tmp_path / "builds").iterdir())
    assert remaining == sorted([ids[0], ids[2], ids[3]])
    assert read_manifest(tmp_path / "builds" / ids[0]).build_id == ids[0]


def test_gc_removes_a_crashed_build_s_staging_at_once_but_never_one_in_progress(
        docs, tmp_path, build_subset):
    """A staging directory is held (a lock beside it) while its build writes: one nobody holds
    is a crashed build's and goes at once, whatever its age; one still held stays."""
    import fcntl

    build_subset(docs, tmp_path)
    builds = tmp_path / "builds"
    for name in ("crashed", "running"):
        (builds / f".tmp-{name}").mkdir()
        (builds / f".tmp-{name}" / "vectors.npy").write_bytes(b"x" * 1000)
        (builds / f".tmp-{name}.lock").write_text("")
    (builds / ".tmp-unlocked-young").mkdir()  # no lock file: only once stale (an hour)
    with open(builds / ".tmp-running.lock", "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert cli(["gc", str(tmp_path), "--keep", "1"]) == 0
    left = sorted(p.name for p in builds.iterdir())
    assert ".tmp-crashed" not in left and ".tmp-crashed.lock" not in left
    assert {".tmp-running", ".tmp-running.lock", ".tmp-unlocked-young"} <= set(left)
    # A finished build leaves no lock behind: only the one still held is there.
    assert {p.name for p in builds.iterdir() if p.name.endswith(".lock")} == {".tmp-running.lock"}


def test_a_retriever_dropped_without_close_is_collected(docs, encoder, tmp_path, build_subset):
    """The reloader's thread held its retriever: one dropped without ``close()`` kept its
    build mapped and went on reloading forever (10 of them: 230 maps, 236 fds)."""
    build_subset(docs[:50], tmp_path)
    retriever = Retriever.load(tmp_path, {"reload_interval_seconds": 0.02,
                                          "cache": {"backend": "none"}}, encoder=encoder)
    thread = retriever._reloader._thread
    dropped = weakref.ref(retriever)
    del retriever
    gc.collect()
    assert dropped() is None
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_reload_thread_outlives_an_unexpected_error(docs, encoder, tmp_path, build_subset):
    """It caught RetrievalError and OSError only: anything else ended it, and the process
    served its build until restarted, whatever was published."""
    build_subset(docs[:50], tmp_path)
    with Retriever.load(tmp_path, {"reload_interval_seconds": 0.02, "live_lag_seconds": None,
                                   "cache": {"backend": "none"}}, encoder=encoder) as retriever:
        reload, failed = retriever.reload, threading.Event()

        def fails_once(*args, **kwargs):
            if not failed.is_set():
                failed.set()
                raise ValueError("a bug in one check")
            return reload(*args, **kwargs)

        retriever.reload = fails_once  # type: ignore[method-assign]
        assert failed.wait(10)
        new = build_subset(docs[:40], tmp_path)
        deadline = time.monotonic() + 30
        while retriever.build_id != new.build_id:
            assert time.monotonic() < deadline, "the reload thread stopped following CURRENT"
            time.sleep(0.02)
