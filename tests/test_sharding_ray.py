"""Ray only: one local cluster (2 CPUs) for the whole module. The Ray Data build against the
local build (whole documents and passages); SciFact in 2 shards of 2 replicas each on Ray
Serve, searched by ``Retriever.connect``: ``retrieval serve`` in front of it, no
failed search while a replica is killed under load, and a shard whose replicas are all killed:
a typed error naming it, or a partial answer. What every layout must do alike (Ray among them)
is the contract in ``test_layouts``."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray import serve
from ray_local import local_ray

from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.manifest import EncoderInfo, read_manifest
from indexes.passages import PASSAGE_ARRAYS, PassageConfig
from indexes.ray_build import _check_json_files, build_on_ray, ray_runner, read_documents
from indexes.shard_build import GivenRows, build_streamed, run_here
from indexes.sharding import read_layout
from indexes.sources import FieldMapping
from indexes.writer import IndexWriter
from retrieval import Retriever, ShardUnavailableError
from retrieval.loaded_build import LoadedBuild
from retrieval.sharding import ShardedBuild
from retrieval.sharding.ray_serve import APP_NAME, RayShardedBuild, serve_shards

FILTER = {"department": {"in": ["cardiology", "oncology"]}, "year": {"gte": 2005}}
CONFIG = {"cache": {"backend": "none"}}


@pytest.fixture(scope="module")
def cluster():
    with local_ray():
        yield


def test_a_streamed_build_on_ray_equals_it_here(cluster, tmp_path):
    """Each shard read, analyzed and written by a Ray task: the same files as in this process
    (tests/test_shard_build: those of ``build_index(shards=S)``)."""
    documents = [Document(f"d{i}", f"alpha beta {'gamma ' * (i % 4)}doc{i}",
                          metadata={"group": f"g{i % 3}", "year": 2000 + i})
                 for i in range(30)]
    vectors = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    info = EncoderInfo(encoder_id="given", model="given", dim=8, vector_dtype="float32")
    parts = [GivenRows(documents[a:a + 10], vectors[a:a + 10]) for a in (0, 10, 20)]
    here = build_streamed(parts, tmp_path / "here", encoder_info=info, run=run_here)
    on_ray = build_streamed(parts, tmp_path / "ray", encoder_info=info, run=ray_runner())

    def files(build: Path) -> dict[str, bytes]:
        return {str(p.relative_to(build)): p.read_bytes() for p in (build / "shards").rglob("*")
                if p.is_file() and not p.name.startswith("manifest.json")}

    assert len(files(here.path)) > 30 and files(on_ray.path) == files(here.path)
    assert len(on_ray.part_peak_rss_bytes) == 3


def test_ray_data_build_equals_the_local_build(cluster, dataset, encoder, tmp_path,
                                              monkeypatch):
    lines = (dataset("cranfield") / "corpus.jsonl").read_text().splitlines()[:40]
    whole, many = tmp_path / "all.jsonl", tmp_path / "parts"
    whole.write_text("\n".join(lines) + "\n")
    many.mkdir()
    for name, part in (("a.jsonl", lines[:25]), ("b.jsonl", lines[25:])):
        (many / name).write_text("\n".join(part) + "\n")
    local = build_index(read_corpus(whole), tmp_path / "local", encoder=encoder, progress=False)
    # One encoder actor; the analysis in three Ray tasks, merged into the local arrays.
    on_ray = build_on_ray(many, tmp_path / "ray", workers=1,
                          config=BuildConfig(analysis_workers=3))
    assert (on_ray.vectors_encoded, on_ray.vectors_reused) == (40, 0)
    for name in ("indptr.npy", "rows.npy", "impacts.npy", "vocab.json", "params.json"):
        assert (local.path / "bm25" / name).read_bytes() == (on_ray.path / "bm25" / name
                                                             ).read_bytes(), name
    mine, theirs = (LoadedBuild.load(r.path) for r in (local, on_ray))
    assert mine.docs.all_ids() == theirs.docs.all_ids()
    cosines = np.sum(mine.vectors.reconstruct_all() * theirs.vectors.reconstruct_all(), axis=1)
    assert cosines.min() >= 0.9999
    # A write acknowledged while the corpus encodes is applied on top of the build: the log
    # was sealed only after the encoding (hours at scale), and the write counted as
    # superseded by the corpus, so it was lost.
    import indexes.ray_build

    encode = indexes.ray_build.encode_on_ray

    def write_then_encode(*args, **kwargs):
        with IndexWriter(tmp_path / "ray") as writer:
            writer.upsert([Document("during", "written while the corpus encodes")],
                          vectors=encoder.encode(["written while the corpus encodes"]))
        return encode(*args, **kwargs)

    IndexWriter(tmp_path / "ray").close()  # the root has a log
    monkeypatch.setattr(indexes.ray_build, "encode_on_ray", write_then_encode)
    again = build_on_ray(many, tmp_path / "ray", workers=1)  # unchanged texts: nothing to encode
    assert (again.vectors_encoded, again.vectors_reused) == (0, 40)
    assert again.live_writes is not None and again.live_writes.records == 0
    with Retriever.load(tmp_path / "ray", CONFIG, encoder=encoder) as retriever:
        assert retriever.get_documents(["during"])[0] is not None
    monkeypatch.undo()
    table = tmp_path / "parquet"
    table.mkdir()
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in lines]),
                   table / "part-0.parquet")
    assert [d.id for d in read_documents(table)] == mine.docs.all_ids()
    with pytest.raises(CorpusError, match="unknown file types"):
        read_documents(dataset("cranfield") / "qrels")
    with pytest.raises(CorpusError, match="does not exist"):
        read_documents(tmp_path / "nowhere")
    # Refused before the encoding (hours at scale), not after it.
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (twice / name).write_text(lines[0] + "\n")
    with pytest.raises(CorpusError, match="duplicate"):
        build_on_ray(twice, tmp_path / "twice-root", workers=1)
    with pytest.raises(CorpusError, match="workers must be"):
        build_on_ray(many, tmp_path / "no-workers", workers=0)
    with pytest.raises(CorpusError, match="supersedes the live writes"):
        build_on_ray(many, tmp_path / "replayed", workers=1, live_writes="replayed")
    with pytest.raises(CorpusError, match="shards"):
        build_on_ray(many, tmp_path / "too-many", workers=1, shards=100)


def test_a_key_repeated_in_a_json_object_is_refused_on_ray_as_here(cluster, tmp_path):
    """Ray Data's JSON lines reader kept the last value of a repeated key: document b was
    built with the text "second", where a local build refuses the line."""
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.jsonl").write_text('{"_id": "a", "text": "fine"}\n')
    (parts / "b.jsonl").write_text('{"_id": "c", "text": "x"}\n\n'
                                   '{"_id": "b", "text": "first", "text": "second"}\n')
    message = r"b.jsonl:3: the key 'text' appears twice in one object"
    with pytest.raises(CorpusError, match=message):
        list(read_corpus(parts / "b.jsonl"))
    with pytest.raises(CorpusError, match=message) as caught:
        read_documents(parts)
    assert type(caught.value) is CorpusError  # not Ray's task error wrapping it
    # A file in parts of 64 bytes (a task each): the refusal names the line in the file.
    lines = [json.dumps({"_id": f"d{i}", "text": f"text {i}"}) for i in range(40)]
    lines[33] = '{"_id": "d33", "text": "a", "text": "b"}'
    (parts / "c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"c.jsonl:34: the key 'text' appears twice"):
        _check_json_files([str(parts / "c.jsonl")], part_bytes=64)


def test_a_ray_passage_build_equals_the_local_one(cluster, long_docs, encoder, tmp_path):
    """Passages are cut on the driver as a local build cuts them; only their encoding runs
    on the cluster: the same passage map, BM25 postings and (within float noise) vectors."""
    corpus = tmp_path / "long.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                          "metadata": d.metadata}) + "\n" for d in long_docs))
    config = BuildConfig(passages=PassageConfig(max_tokens=128, overlap_tokens=16))
    local = build_index(read_corpus(corpus), tmp_path / "local", config=config,
                        encoder=encoder, progress=False)
    on_ray = build_on_ray(corpus, tmp_path / "ray", workers=1, config=config, shards=2)
    assert on_ray.passages == local.passages and local.passages.n_passages > len(long_docs)
    mine, theirs = LoadedBuild.load(local.path), Retriever.load(tmp_path / "ray").snapshot
    for name in PASSAGE_ARRAYS:
        np.testing.assert_array_equal(getattr(mine.passages, name),
                                      getattr(theirs.passages, name))
    rows = np.arange(mine.manifest.n_docs)
    assert [d.content for d in mine.docs.get_many(rows)] == \
        [d.content for d in theirs.docs.get_many(rows)]
    cosines = np.sum(mine.vectors.reconstruct_all() * theirs.vectors.reconstruct_all(), axis=1)
    assert cosines.min() >= 0.9999


@pytest.fixture(scope="module")
def on_ray(cluster, scifact_sharded, scifact_exact, encoder):
    root = scifact_sharded(2)
    serve_shards(root, CONFIG, replicas=2)
    retriever = Retriever.connect(root, CONFIG, encoder=encoder)
    assert isinstance(retriever.snapshot, RayShardedBuild)
    yield retriever, scifact_exact
    retriever.close()  # Serve is shut down with the cluster (ray_local)


def same(got, want) -> None:
    assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits]
    assert [h.score for h in got.hits] == pytest.approx([h.score for h in want.hits], abs=1e-6)
    assert [h.text for h in got.hits] == [h.text for h in want.hits]
    assert (got.candidates, got.allowed) == (want.candidates, want.allowed)


def test_the_service_fronts_a_build_served_by_ray(on_ray, scifact_sharded, encoder):
    """``retrieval serve`` with a [ray] table opens the build through the shard deployments:
    /v1/search answers as ``Retriever.connect`` in process."""
    from starlette.testclient import TestClient

    from retrieval.service.app import create_app
    from retrieval.service.settings import ServeConfig

    retriever, (_, texts, _) = on_ray
    root = scifact_sharded(2)
    config = ServeConfig.model_validate({"retriever": CONFIG, "ray": {"app_name": APP_NAME}})
    with Retriever.connect(root, CONFIG) as local, \
            TestClient(create_app(root, config)) as client:
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.1)
        for text in texts[:10]:
            got = client.post("/v1/search", json={"query": text, "k": 5, "filters": FILTER})
            assert got.status_code == 200, got.text
            want = local.search(text, FILTER, 5)
            assert [h["doc_id"] for h in got.json()["hits"]] == [h.doc_id for h in want.hits]


def test_the_shards_are_served_without_an_http_proxy(on_ray):
    """Reached through deployment handles only: Serve, started by ``serve_shards``, runs its
    controller and the replicas, and no HTTP proxy actor."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert any(name.startswith("SERVE_CONTROLLER") for name in names), names
    assert not any("PROXY" in name for name in names), names


def _replicas(deployment: str, app_name: str = APP_NAME) -> list[str]:
    prefix = f"SERVE_REPLICA::{app_name}#{deployment}#"
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)]


def test_a_hung_shard_is_left_out_within_the_deadline(on_ray, scifact_sharded):
    """Both replicas of shard-001 stopped (SIGSTOP): the shard calls waited their own
    timeout on every trip, whatever the search's deadline (a 300 ms search took 10 s)."""
    import os
    import signal

    _, (_, texts, vectors) = on_ray
    partial = Retriever.connect(scifact_sharded(2), CONFIG, allow_partial=True,
                                retry_seconds=600.0, timeout_seconds=600.0)
    pids = [ray.get(ray.get_actor(name, namespace="serve").__ray_call__.remote(
        lambda _: os.getpid())) for name in _replicas("shard-001")]
    answered: list = []
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        search = threading.Thread(target=lambda: answered.append(partial.search(
            texts[2], None, 10, query_vector=vectors[2], deadline_ms=500)))
        search.start()
        search.join(120)  # without the deadline it waits out the 600 s timeout
        assert not search.is_alive(), "the search waited past its deadline"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        partial.close()
    assert answered[0].degraded == ["partial:shard-001"] and answered[0].hits


def test_killing_a_replica_under_load_fails_no_search(on_ray):
    retriever, (unsharded, texts, vectors) = on_ray
    victims = _replicas("shard-000")
    assert len(victims) == 2
    done = threading.Event()
    count = {"served": 0}
    lock = threading.Lock()

    def search(i: int):
        result = retriever.search(texts[i % 300], None, 10, query_vector=vectors[i % 300])
        with lock:
            count["served"] += 1
            if count["served"] == 40:
                done.set()
        return i, result

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(search, i) for i in range(240)]
        assert done.wait(60)
        ray.kill(ray.get_actor(victims[0], namespace="serve"), no_restart=True)
        results = [f.result() for f in futures]  # any failed search raises here
    assert len(results) == 240
    for i, got in results[::10]:
        same(got, unsharded.search(texts[i % 300], None, 10, query_vector=vectors[i % 300]))


def test_a_shard_with_no_live_replica_fails_naming_it_or_answers_partial(on_ray, scifact_sharded):
    """Both replicas of shard-001 killed (``ray.kill``). Serve starts replacements at once, so
    the shard's directory is moved away first (a lost disk): the replacements cannot load it
    and the shard stays without a live replica while the searches run, one strict and one
    partial."""
    _, (unsharded, texts, vectors) = on_ray
    root = scifact_sharded(2)
    options = {"retry_seconds": 2.0, "timeout_seconds": 1.0}
    strict = Retriever.connect(root, CONFIG, **options)
    partial = Retriever.connect(root, CONFIG, allow_partial=True, **options)
    same(strict.search(texts[0], None, 10, query_vector=vectors[0]),
         unsharded.search(texts[0], None, 10, query_vector=vectors[0]))
    directory, layout = read_layout(root)
    victims = _replicas("shard-001")
    assert len(victims) == 2
    shard_dir = layout.shard_dir(directory, 1)
    lost = shard_dir.with_name("shard-001.lost")
    shard_dir.rename(lost)
    try:
        for name in victims:
            ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        with pytest.raises(ShardUnavailableError, match="shard-001") as caught:
            strict.search(texts[1], None, 10, query_vector=vectors[1])
        answered = partial.search(texts[1], None, 10, query_vector=vectors[1])
    finally:
        lost.rename(shard_dir)
        strict.close()
        partial.close()
    assert caught.value.shard == "shard-001"
    assert answered.degraded == ["partial:shard-001"] and answered.hits
    # What shard-000 alone answers, in this process: the same hits.
    first = LoadedBuild.load(layout.shard_dir(directory, 0))
    manifest = read_manifest(directory).model_copy(update={"n_docs": layout.shards[0].stop})
    with Retriever(ShardedBuild.of(directory, manifest, [first], [0]),
                   unsharded.config, None) as alone:
        want = alone.search(texts[1], None, 10, query_vector=vectors[1])
    assert [h.doc_id for h in answered.hits] == [h.doc_id for h in want.hits]
    assert set(h.doc_id for h in answered.hits) <= set(first.docs.all_ids())


def test_a_shard_lost_at_hydration_drops_its_hits_with_allow_partial(cluster, dataset,
                                                                    tmp_path):
    """Shard-001 answers the BM25 and dense trips, then its replica dies reading the hits'
    documents (its text blob truncated under the replica's memory map: a lost disk). With
    ``allow_partial`` the search failed with ``ShardUnavailableError``, where a shard lost at
    an earlier trip is left out: now its hits are dropped and the result says
    ``partial:shard-001``. Without, the error still names the shard."""
    import os

    from live_index import build_small, scifact_docs, unit_vectors

    root = tmp_path / "root"
    docs = scifact_docs(dataset("scifact"), 120)
    build_small(root, docs, shards=2)
    serve_shards(root, CONFIG, app_name="lost-texts", replicas=1)
    options = {"app_name": "lost-texts", "retry_seconds": 2.0, "timeout_seconds": 1.0}
    partial = Retriever.connect(root, CONFIG, allow_partial=True, **options)
    strict = Retriever.connect(root, CONFIG, **options)
    vector = unit_vectors(1, 99)[0]
    second = {d.id for d in docs[60:]}
    try:
        healthy = partial.search("cell growth in tumors", None, 10, query_vector=vector)
        assert not healthy.degraded
        assert {h.doc_id in second for h in healthy.hits} == {True, False}  # both shards'
        directory, layout = read_layout(root)
        os.truncate(layout.shard_dir(directory, 1) / "docstore" / "text.bin.npy", 0)
        answered = partial.search("cell growth in tumors", None, 10, query_vector=vector)
        with pytest.raises(ShardUnavailableError, match="shard-001") as caught:
            strict.search("cell growth in tumors", None, 10, query_vector=vector)
    finally:
        partial.close()
        strict.close()
        serve.delete("lost-texts")
    assert answered.degraded == ["partial:shard-001"]
    assert [h.doc_id for h in answered.hits] == \
        [h.doc_id for h in healthy.hits if h.doc_id not in second]
    assert caught.value.shard == "shard-001"



def test_a_replica_restarted_after_a_gc_starts_on_the_live_build(tmp_path):
    """A replica Serve restarts loads its shard as it starts. It loaded the build deployed,
    which a ``gc`` deletes once newer builds went live: the replica failed to start, again
    and again, and the shard stayed down until the application was deployed again."""
    from indexes.manifest import collect_garbage
    from retrieval.sharding.ray_serve import start_dir

    documents = [Document(f"d{i}", f"alpha beta doc{i}") for i in range(12)]
    info = EncoderInfo(encoder_id="given", model="given", dim=8, vector_dtype="float32")
    vectors = np.random.default_rng(0).normal(size=(12, 8)).astype(np.float32)
    deployed = build_index(documents, tmp_path, vectors=vectors, encoder_info=info,
                           progress=False, shards=2, dense="exact")
    shard = str(deployed.path / "shards" / "shard-001")
    assert start_dir(shard, str(tmp_path)) == shard
    for _ in range(2):
        live = build_index(documents, tmp_path, vectors=vectors, encoder_info=info,
                           progress=False, shards=2, dense="exact")
    collect_garbage(tmp_path, keep=1)
    assert not Path(shard).exists()
    assert start_dir(shard, str(tmp_path)) == str(live.path / "shards" / "shard-001")
    assert start_dir(shard, None) == shard  # deployed from a build directory: no fallback


def test_a_hung_shard_is_left_out_of_a_root_with_live_writes(cluster, dataset, tmp_path):
    """After a live write, searches run on a live snapshot over the Ray-served shards. With
    a shard hung and ``allow_partial``, a search raised ``ShardUnavailableError``, or left
    the shard's hits out with no ``partial:`` flag, and the thread kept leaving it out once
    it was back (its per-search state was never reset).

    A strict retriever connected before the write (``late``), with the shard hung: only a
    search whose own deadline cut the wait says ``by_deadline`` (a single flight's followers
    with time left retry on that alone); the documents of the shard that answers are
    fetched (every id's rows were asked of every shard: each fetch failed), the hung one's
    fail naming it; the write waits for the hung shard's texts, saying so, and is applied
    once it is back."""
    import os
    import signal

    from live_index import build_small, scifact_docs, unit_vectors

    from indexes.writer import IndexWriter

    root = tmp_path / "root"
    docs = scifact_docs(dataset("scifact"), 120)
    build_small(root, docs, shards=2)
    serve_shards(root, CONFIG, app_name="live-partial", replicas=1)
    live = {**CONFIG, "live_lag_seconds": None}
    retriever = Retriever.connect(root, live, allow_partial=True, app_name="live-partial",
                                  retry_seconds=2.0, timeout_seconds=1.0)
    late = Retriever.connect(root, live, app_name="live-partial", retry_seconds=2.0,
                             timeout_seconds=1.0)
    try:
        with IndexWriter(root) as writer:
            writer.upsert([Document("live-1", "cell growth in tumors, a new study")],
                          vectors=unit_vectors(1, 7))
        retriever.refresh()
        vector = unit_vectors(1, 99)[0]
        healthy = retriever.search("cell growth in tumors", None, 10, query_vector=vector)
        second = {d.id for d in docs[60:]}
        assert any(h.doc_id in second for h in healthy.hits) and not healthy.degraded
        pids = [ray.get(ray.get_actor(name, namespace="serve").__ray_call__.remote(
            lambda _: os.getpid())) for name in _replicas("shard-001", "live-partial")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            hung = retriever.search("cell growth in tumors", None, 10, query_vector=vector)
            cut, failed, fetched, unreachable, held = _on_a_hung_shard(late, vector, docs)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert hung.degraded == ["partial:shard-001"] and hung.hits
        assert not any(h.doc_id in second for h in hung.hits)
        again = retriever.search("cell growth in tumors", None, 10, query_vector=vector)
        assert [h.doc_id for h in again.hits] == [h.doc_id for h in healthy.hits]
        assert not again.degraded
        assert (cut.shard, cut.by_deadline) == ("shard-001", True)
        assert (failed.shard, failed.by_deadline) == ("shard-001", False)
        assert [d.id for d in fetched] == [docs[0].id]
        assert unreachable.shard == "shard-001"
        assert held.shard == "shard-001" and "live writes" in str(held)
        assert late.applied_seq == 0 and late.refresh() and late.applied_seq == 1
        assert [d.id for d in late.get_documents(["live-1", docs[60].id])] == \
            ["live-1", docs[60].id]
    finally:
        retriever.close()
        late.close()
        serve.delete("live-partial")


def _on_a_hung_shard(late: Retriever, vector: np.ndarray, docs: list[Document]
                     ) -> tuple[ShardUnavailableError, ShardUnavailableError,
                                list[Document | None], ShardUnavailableError,
                                ShardUnavailableError]:
    """What a strict retriever that has fetched nothing yet meets with shard-001 hung: a
    search's error within a deadline shorter than the shard calls' timeout and without one,
    the documents of each shard, and the write waiting for it (``refresh``)."""
    with pytest.raises(ShardUnavailableError) as cut:
        late.search("cell growth in tumors", None, 10, query_vector=vector, deadline_ms=300)
    with pytest.raises(ShardUnavailableError) as failed:
        late.search("cell growth in tumors", None, 10, query_vector=vector)
    fetched = late.get_documents([docs[0].id])
    with pytest.raises(ShardUnavailableError) as unreachable:
        late.get_documents([docs[60].id])
    with pytest.raises(ShardUnavailableError) as held:
        late.refresh()
    return cut.value, failed.value, fetched, unreachable.value, held.value


def test_a_ray_build_maps_fields_as_a_local_build(cluster, tmp_path):
    """``retrieval build --ray --id-field doc --text-field body ...`` ignored its mapping
    flags: the Ray build read every corpus with the default mapping, so a corpus keyed by
    other field names was refused (or its fields left in the metadata) on Ray alone."""
    rows = [{"doc": "a", "body": "alpha text", "headline": "A", "year": 2001, "secret": 1},
            {"doc": "b", "body": "beta text", "headline": "B", "year": 2002, "secret": 2}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    mapping = FieldMapping(id_field="doc", text_field="body", title_field="headline",
                           drop=("secret",))
    assert read_documents(corpus, mapping) == list(read_corpus(corpus, mapping))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    assert read_documents(tmp_path / "corpus.parquet", mapping) == list(
        read_corpus(corpus, mapping))
    # A name given twice, which the mapping leaves out: neither column is read, as here.
    table = pa.Table.from_pylist(rows)
    twice = table.append_column("secret", pa.array(["x", "y"]))
    pq.write_table(twice, tmp_path / "twice.parquet")
    assert read_documents(tmp_path / "twice.parquet", mapping) == list(
        read_corpus(tmp_path / "twice.parquet", mapping)) == list(read_corpus(corpus, mapping))
    wrong = FieldMapping(id_field="doc", text_field="content")
    with pytest.raises(CorpusError, match=r"'content'.*'body'"):
        read_documents(corpus, wrong)
