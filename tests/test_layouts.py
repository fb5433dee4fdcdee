"""One contract, one test body per capability, run against every in-process layout: a whole
build and the same collection in 2 shards, both opened by ``Retriever.load`` and searched by the
one request path. The unsharded build is the reference (its dense leg exact, as the shards')."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from live_index import build_small, scifact_docs, unit_vectors

from indexes.build import build_index
from indexes.docstore import Document
from indexes.manifest import EncoderInfo
from indexes.publish import publish_build
from indexes.sharding import is_sharded
from indexes.writer import IndexWriter
from retrieval import Retriever, SearchResult
from retrieval.integrations.langchain import LangChainRetriever
from retrieval.integrations.llamaindex import LlamaIndexRetriever
from retrieval.sharding import ShardedBuild

CONFIG = {"cache": {"backend": "none"}}
FILTER = {"department": {"in": ["cardiology", "oncology"]}, "year": {"gte": 2005}}
LAYOUTS = ["whole", "2 shards"]


@pytest.fixture(scope="module")
def layouts(scifact_exact, scifact_sharded, encoder):
    """({layout: retriever}, query texts, query vectors); "whole" is the reference."""
    reference, texts, vectors = scifact_exact
    sharded = Retriever.load(scifact_sharded(2), CONFIG, encoder=encoder)
    assert isinstance(sharded.snapshot, ShardedBuild)
    yield {"whole": reference, "2 shards": sharded}, texts, vectors
    sharded.close()


def same(got: SearchResult, want: SearchResult) -> None:
    assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits], got.query
    for a, b in zip(got.hits, want.hits, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-6)
        assert a.bm25_score == pytest.approx(b.bm25_score, abs=1e-6)
        assert a.vector_score == pytest.approx(b.vector_score, abs=1e-6)
    assert (got.candidates, got.allowed, got.degraded) == (want.candidates, want.allowed,
                                                          want.degraded)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("filters", [None, FILTER], ids=["all", "filtered"])
def test_search_batch_and_asearch_equal_the_reference_on_every_test_query(layouts, layout,
                                                                          filters):
    retrievers, texts, vectors = layouts
    reference, retriever = retrievers["whole"], retrievers[layout]
    wanted = [reference.search(t, filters, 10, query_vector=v)
              for t, v in zip(texts, vectors, strict=True)]
    batch = retriever.search_batch(texts, filters, 10, query_vectors=vectors)

    async def concurrently() -> list[SearchResult]:
        return await asyncio.gather(*(retriever.asearch(t, filters, 10, query_vector=v)
                                      for t, v in zip(texts, vectors, strict=True)))

    for want, got_batch, got_async in zip(wanted, batch, asyncio.run(concurrently()),
                                          strict=True):
        same(got_batch, want)
        same(got_async, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_deadline_that_cuts_the_encoder_degrades_the_same_way(layouts, layout):
    """Past the deadline the search ranks by BM25 alone, on any layout."""
    retrievers, texts, _ = layouts
    retriever = retrievers[layout]
    long_query = " ".join(texts[:12])  # a long text: the encoder takes milliseconds
    got = retriever.search(long_query, None, 10, deadline_ms=0.01)
    assert got.degraded == ["embed"] and got.hits
    rows, scores = retrievers["whole"].snapshot.bm25.top_candidates(
        retrievers["whole"].snapshot.analyzer(long_query), 10)
    want = [retrievers["whole"].snapshot.docs.doc_id(int(r)) for r in rows]
    assert [h.doc_id for h in got.hits] == want
    assert all(h.vector_score == 0.0 for h in got.hits)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_named_filters_and_value_suggestions_see_the_whole_collection(layouts, layout):
    retrievers, texts, vectors = layouts
    retriever = retrievers[layout]
    allowed = retriever.register_filter("cardio", {"department": "cardiology"})
    try:
        whole = retrievers["whole"].snapshot.metadata
        assert allowed == len(whole.keyword_rows("department", "cardiology"))
        assert retriever.snapshot.metadata.value_counts("department") == \
            whole.value_counts("department")
        got = retriever.search(texts[3], {"$named": "cardio"}, 10, query_vector=vectors[3])
        want = retrievers["whole"].search(texts[3], {"department": "cardiology"}, 10,
                                          query_vector=vectors[3])
        same(got, want)
    finally:
        retriever.unregister_filter("cardio")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_framework_adapters_run_over_every_layout(layouts, layout):
    retrievers, texts, _ = layouts
    want = [h.doc_id for h in retrievers["whole"].search(texts[0], k=5).hits]
    docs = LangChainRetriever(retrievers[layout], k=5).invoke(texts[0])
    assert [d.id for d in docs] == want
    nodes = LlamaIndexRetriever(retrievers[layout], k=5).retrieve(texts[0])
    assert [n.node.node_id for n in nodes] == want


def test_the_service_answers_over_a_sharded_build_as_in_process(layouts, scifact_sharded):
    """``retrieval serve``'s app over the 2-shard build: /v1/search and /v1/search/batch equal
    the in-process searches of the same build."""
    from starlette.testclient import TestClient

    from retrieval.service.app import create_app
    from retrieval.service.settings import ServeConfig

    _, texts, _ = layouts
    config = ServeConfig.model_validate({"retriever": CONFIG})
    local = Retriever.load(scifact_sharded(2), CONFIG)  # the service's default encoder
    with local, TestClient(create_app(scifact_sharded(2), config)) as client:
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.05)
        assert client.get("/v1/index").json()["documents"] == local.snapshot.manifest.n_docs
        one = client.post("/v1/search", json={"query": texts[5], "k": 10, "filters": FILTER})
        assert one.status_code == 200, one.text
        want = local.search(texts[5], FILTER, 10)
        assert [h["doc_id"] for h in one.json()["hits"]] == [h.doc_id for h in want.hits]
        batch = client.post("/v1/search/batch", json={"queries": texts[:20], "k": 5})
        assert batch.status_code == 200, batch.text
        wanted = local.search_batch(texts[:20], k=5)
        assert [[h["doc_id"] for h in r["hits"]] for r in batch.json()["results"]] == \
            [[h.doc_id for h in r.hits] for r in wanted]


INFO = EncoderInfo(encoder_id="test:precomputed:fp32:8", model="test", dim=8,
                   vector_dtype="float32")


def _generation(root, tag: str, publish: bool):
    """30 documents whose text and metadata name the build generation ``tag``."""
    docs = [Document(f"d{i}", f"alpha beta gen{tag} doc{i}", metadata={"gen": tag})
            for i in range(30)]
    vectors = np.random.default_rng(len(tag)).normal(size=(30, 8)).astype(np.float32)
    return build_index(docs, root, shards=3, vectors=vectors, encoder_info=INFO,
                               progress=False, publish=publish)


def test_a_publish_flips_every_shard_at_once_under_load(tmp_path):
    """Searches running while builds flip each see one build: every hit is of the generation
    its result's build id names, never a mix."""
    first = _generation(tmp_path, "a", publish=True)
    staged = [_generation(tmp_path, tag, publish=False) for tag in ("bb", "ccc")]
    generation = {first.build_id: "a", staged[0].build_id: "bb", staged[1].build_id: "ccc"}
    vector = np.ones(8, np.float32)
    seen: list[SearchResult] = []
    stop = threading.Event()
    with Retriever.load(tmp_path, CONFIG) as retriever:
        def search() -> None:
            while not stop.is_set():
                seen.append(retriever.search("alpha beta", k=30, query_vector=vector))

        threads = [threading.Thread(target=search) for _ in range(2)]
        for thread in threads:
            thread.start()
        for report in (*staged, first):
            publish_build(tmp_path, report.build_id)
            assert retriever.refresh()
            assert retriever.build_id == report.build_id
        stop.set()
        for thread in threads:
            thread.join()
    assert {r.build_id for r in seen} >= {first.build_id}
    for result in seen:
        assert len(result.hits) == 30
        assert {h.metadata["gen"] for h in result.hits} == {generation[result.build_id]}


@pytest.fixture
def live_roots(tmp_path, dataset):
    """{layout: index root} of the same 120 SciFact documents and vectors: whole, 2 shards."""
    docs = scifact_docs(dataset("scifact"), 120)
    roots = {"whole": tmp_path / "whole", "2 shards": tmp_path / "sharded"}
    build_small(roots["whole"], docs)
    build_small(roots["2 shards"], docs, shards=2)
    return roots, docs


LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": 0.2, "vector_weight": 0.5}
NEEDLE = "zebrafish telomerase hibernation"


def _write_the_day(root, docs) -> None:
    with IndexWriter(root) as writer:
        writer.upsert([Document("live-1", f"{NEEDLE} in a new study", metadata={"year": 2031}),
                       Document(docs[70].id, f"{NEEDLE} rewritten", metadata={"year": 1999})],
                      vectors=unit_vectors(2, 7))
        writer.delete([docs[3].id, docs[90].id])


def test_live_writes_and_compaction_are_the_same_on_every_layout(live_roots):
    """An upsert and a delete through the writer are visible within the live lag, searched
    exactly alike on both layouts (the whole build is the reference); compaction folds them
    into the next build of the same layout."""
    roots, docs = live_roots
    vector = unit_vectors(1, 99)[0]
    queries = [NEEDLE, docs[3].text[:80], docs[90].title, "cell growth in tumors"]
    retrievers = {name: Retriever.load(root, LIVE) for name, root in roots.items()}
    try:
        for root in roots.values():
            _write_the_day(root, docs)
        deadline = time.monotonic() + 10
        while any("live-1" not in
                  [h.doc_id for h in r.search(NEEDLE, k=3, query_vector=vector).hits]
                  for r in retrievers.values()):
            assert time.monotonic() < deadline, "a write was not visible within the lag"
            time.sleep(0.05)
        for query in queries:
            want = retrievers["whole"].search(query, None, 10, query_vector=vector)
            got = retrievers["2 shards"].search(query, None, 10, query_vector=vector)
            same(got, want)
            assert not {docs[3].id, docs[90].id} & {h.doc_id for h in got.hits}
            assert got.build_id.endswith("+2")  # the sharded build plus two log records
        for name, root in roots.items():
            with IndexWriter(root) as writer:
                report = writer.compact()
            assert report.records_folded == 2 and report.n_docs == 119
            assert is_sharded(root) == (name == "2 shards")
            retrievers[name].refresh()
        for query in queries:
            same(retrievers["2 shards"].search(query, None, 10, query_vector=vector),
                 retrievers["whole"].search(query, None, 10, query_vector=vector))
        assert isinstance(retrievers["2 shards"].snapshot, ShardedBuild)
    finally:
        for retriever in retrievers.values():
            retriever.close()
