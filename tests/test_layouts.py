"""One contract, one test body per capability, run against every layout: a whole build, the
same collection in 2 shards (``Retriever.load``) and those 2 shards served by Ray Serve
deployments of 2 replicas (``Retriever.connect``; a local cluster of 2 CPUs for the module),
all searched by the one request path. The unsharded build is the reference (its dense leg
exact, as the shards')."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from live_index import build_small, scifact_docs, unit_vectors
from passage_fixtures import CAR_QUERY, TARGET
from ray import serve
from ray_local import local_ray

from indexes.build import BuildConfig, build_index
from indexes.docstore import Document
from indexes.manifest import EncoderInfo
from indexes.passages import PassageConfig
from indexes.publish import publish_build
from indexes.sharding import is_sharded
from indexes.writer import IndexWriter
from retrieval import Retriever, SearchResult
from retrieval.integrations.langchain import LangChainRetriever
from retrieval.integrations.llamaindex import LlamaIndexRetriever
from retrieval.sharding import ShardedBuild
from retrieval.sharding.ray_serve import RayShardedBuild, serve_shards

CONFIG = {"cache": {"backend": "none"}}
FILTER = {"department": {"in": ["cardiology", "oncology"]}, "year": {"gte": 2005}}
RAY = "2 shards on Ray"
LAYOUTS = ["whole", "2 shards", RAY]


@pytest.fixture(scope="module")
def cluster():
    with local_ray():
        yield


def open_layout(layout: str, root, config=CONFIG, encoder=None, replicas: int = 1
                ) -> Retriever:
    """A retriever over ``root`` in ``layout`` (on Ray: its shards deployed first, as an
    application named after the root)."""
    if layout != RAY:
        return Retriever.load(root, config, encoder=encoder)
    app = f"app-{abs(hash(str(root)))}"
    if app not in serve.status().applications:
        serve_shards(root, config, replicas=replicas, app_name=app)
    retriever = Retriever.connect(root, config, encoder=encoder, app_name=app)
    assert isinstance(retriever.snapshot, RayShardedBuild)
    return retriever


@pytest.fixture(scope="module")
def layouts(cluster, scifact_exact, scifact_sharded, encoder):
    """({layout: retriever}, query texts, query vectors); "whole" is the reference."""
    reference, texts, vectors = scifact_exact
    sharded = Retriever.load(scifact_sharded(2), CONFIG, encoder=encoder)
    assert isinstance(sharded.snapshot, ShardedBuild)
    on_ray = open_layout(RAY, scifact_sharded(2), encoder=encoder, replicas=2)
    yield {"whole": reference, "2 shards": sharded, RAY: on_ray}, texts, vectors
    sharded.close()
    on_ray.close()


def same(got: SearchResult, want: SearchResult) -> None:
    assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits], got.query
    for a, b in zip(got.hits, want.hits, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-6)
        assert a.bm25_score == pytest.approx(b.bm25_score, abs=1e-6)
        assert a.vector_score == pytest.approx(b.vector_score, abs=1e-6)
        assert (a.relevance is None) == (b.relevance is None)
        if b.relevance is not None:
            assert a.relevance == pytest.approx(b.relevance, abs=1e-6)
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
    assert all(h.relevance is not None for w in wanted for h in w.hits)  # MiniLM: calibrated
    batch = retriever.search_batch(texts, filters, 10, query_vectors=vectors)

    async def concurrently() -> list[SearchResult]:
        return await asyncio.gather(*(retriever.asearch(t, filters, 10, query_vector=v)
                                      for t, v in zip(texts, vectors, strict=True)))

    for want, got_batch, got_async in zip(wanted, batch, asyncio.run(concurrently()),
                                          strict=True):
        same(got_batch, want)
        same(got_async, want)


class LateEncoder:
    """The real encoder, started ``delay`` seconds late: an encode a deadline always cuts,
    whatever a layout's BM25 trip costs."""

    def __init__(self, inner, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim

    def encode(self, texts, *, batch_size: int = 64, progress: bool = False):
        time.sleep(self.delay)
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_deadline_that_cuts_the_encoder_degrades_the_same_way(layouts, layout, encoder):
    """Past the deadline the search ranks by BM25 alone, on any layout."""
    retrievers, texts, _ = layouts
    root = retrievers[layout].root
    with open_layout(layout, root, encoder=LateEncoder(encoder, 0.5)) as retriever:
        got = retriever.search(texts[7], None, 10, deadline_ms=50)
    assert got.degraded == ["embed"] and got.hits
    reference = retrievers["whole"].snapshot
    rows, _ = reference.bm25.top_candidates(reference.analyzer(texts[7]), 10)
    assert [h.doc_id for h in got.hits] == [reference.docs.doc_id(int(r)) for r in rows]
    assert all(h.vector_score == 0.0 for h in got.hits)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_features_and_the_keyword_policy_rank_the_same_on_every_layout(layouts, layout, encoder):
    """Recency re-scores the merged candidates as on a whole build; without the dense leg the
    cosines of the candidates take their own trip on Ray."""
    retrievers, texts, vectors = layouts
    settings = {**CONFIG, "candidate_policy": "keyword",
                "recency": {"field": "year", "weight": 0.3, "half_life_days": 1e-4}}
    with open_layout(layout, retrievers[layout].root, settings, encoder) as retriever, \
            Retriever.load(retrievers["whole"].root, settings, encoder=encoder) as reference:
        for text, vector in list(zip(texts, vectors, strict=True))[:40]:
            got = retriever.search(text, FILTER, 10, query_vector=vector)
            same(got, reference.search(text, FILTER, 10, query_vector=vector))
            assert got.hits and all("recency" in h.features for h in got.hits)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_explanations_split_bm25_by_term_the_same_on_every_layout(layouts, layout):
    """Each term's part of a hit's BM25 score is that term's alone (on Ray, a dense row's
    whole-query score fetched with the dense trip answered every single term)."""
    retrievers, texts, vectors = layouts
    for text, vector in list(zip(texts, vectors, strict=True))[:15]:
        want = retrievers["whole"].search(text, None, 10, query_vector=vector, explain=True)
        got = retrievers[layout].search(text, None, 10, query_vector=vector, explain=True)
        same(got, want)
        for a, b in zip(got.hits, want.hits, strict=True):
            assert a.explanation is not None and b.explanation is not None
            assert a.explanation.bm25_terms == pytest.approx(b.explanation.bm25_terms,
                                                             abs=1e-6), text
            assert sum(a.explanation.bm25_terms.values()) == pytest.approx(a.bm25_score,
                                                                           abs=1e-6)


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
def test_the_id_filter_and_fetching_by_id_see_the_whole_collection(layouts, layout):
    retrievers, texts, vectors = layouts
    retriever, whole = retrievers[layout], retrievers["whole"]
    last = whole.snapshot.manifest.n_docs - 1  # in the last shard
    ids = [whole.snapshot.docs.doc_id(row) for row in (0, 1, last)]
    for spec in ({"id": {"in": ids}}, f'id IN ("{ids[0]}", "{ids[1]}", "{ids[2]}")'):
        got = retriever.search(texts[3], spec, 10, query_vector=vectors[3])
        same(got, whole.search(texts[3], spec, 10, query_vector=vectors[3]))
        assert {h.doc_id for h in got.hits} == set(ids) and got.allowed == 3
    one = retriever.search(texts[3], {"id": ids[2]}, 10, query_vector=vectors[3])
    assert [h.doc_id for h in one.hits] == [ids[2]]
    assert retriever.get_documents([*ids, "absent"]) == whole.get_documents([*ids, "absent"])
    assert retriever.get_documents(["absent"]) == [None]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_framework_adapters_run_over_every_layout(layouts, layout):
    retrievers, texts, _ = layouts
    want = [h.doc_id for h in retrievers["whole"].search(texts[0], k=5).hits]
    docs = LangChainRetriever(retrievers[layout], k=5).invoke(texts[0])
    assert [d.id for d in docs] == want
    nodes = LlamaIndexRetriever(retrievers[layout], k=5).retrieve(texts[0])
    assert [n.node.node_id for n in nodes] == want


@pytest.fixture(scope="module")
def passage_layouts(cluster, passage_roots, long_docs, encoder, tmp_path_factory):
    """{layout: retriever} of the long documents' 256-token passage build: whole (the
    session's) and in 2 shards (exact dense legs, as the whole build's at this size)."""
    root = tmp_path_factory.mktemp("passages-2-shards")
    build_index(long_docs, root, encoder=encoder, shards=2, dense="exact", progress=False,
                config=BuildConfig(passages=PassageConfig(max_tokens=256)))
    retrievers = {"whole": Retriever.load(passage_roots("passages"), CONFIG, encoder=encoder),
                  **{layout: open_layout(layout, root, encoder=encoder)
                     for layout in LAYOUTS[1:]}}
    yield retrievers
    for retriever in retrievers.values():
        retriever.close()


PASSAGE_QUERIES = [CAR_QUERY, "protein expression in cells", "cancer risk",
                   "immune response to infection", "gene mutation and disease"]


def same_passages(got: SearchResult, want: SearchResult) -> None:
    same(got, want)
    for a, b in zip(got.hits, want.hits, strict=True):
        assert (a.passage, a.start, a.end, a.text) == (b.passage, b.start, b.end, b.text)
        assert a.context == b.context


@pytest.mark.parametrize("layout", LAYOUTS)
def test_passages_grouped_and_with_context_are_the_same_on_every_layout(passage_layouts,
                                                                         layout):
    """A document's passages stay in one shard; ungrouped, grouped and with ``context`` the
    hits (passage positions, offsets, context slices) equal the whole build's."""
    retriever, reference = passage_layouts[layout], passage_layouts["whole"]
    snapshot = retriever.snapshot
    assert snapshot.manifest.passages == reference.snapshot.manifest.passages
    if layout == "2 shards":
        per_shard = [{p.docs.doc_id(r) for r in range(p.manifest.n_docs)}
                     for p in snapshot.shards]
        assert not per_shard[0] & per_shard[1] and all(per_shard)
    for query in PASSAGE_QUERIES:
        for options in ({}, {"group_by": "document"}, {"group_by": "document", "context": 1},
                        {"context": 2, "filters": {"group": {"in": [0, 1]}}}):
            same_passages(retriever.search(query, k=5, **options),
                          reference.search(query, k=5, **options))
    grouped = retriever.search(CAR_QUERY, k=3, group_by="document").hits
    assert grouped[0].doc_id == TARGET


def test_live_writes_and_compaction_of_a_sharded_passage_build(long_docs, encoder, tmp_path):
    """On a 2-shard passage build an upsert replaces every passage of its document and a
    delete removes all of them, as on the whole build; compaction publishes the next 2-shard
    passage build, equal to a fresh whole build of the live corpus."""
    config = BuildConfig(passages=PassageConfig(max_tokens=256))
    roots = {"whole": tmp_path / "whole", "2 shards": tmp_path / "sharded"}
    for name, root in roots.items():
        build_index(long_docs, root, encoder=encoder, config=config, progress=False,
                    **({"shards": 2, "dense": "exact"} if name == "2 shards" else {}))
    gone, changed = long_docs[5].id, long_docs[3]
    new = Document(changed.id, f"{NEEDLE} measured in cold water.\n\n{changed.text[:900]}",
                   changed.title, changed.metadata)
    retrievers = {name: Retriever.load(root, {**CONFIG, "live_lag_seconds": None},
                                       encoder=encoder) for name, root in roots.items()}
    try:
        for root in roots.values():
            with IndexWriter(root, encoder=encoder) as writer:
                writer.upsert([new])
                writer.delete([gone])
        for retriever in retrievers.values():
            assert retriever.refresh()
        queries = [NEEDLE, CAR_QUERY, long_docs[5].text[:60], "protein expression"]
        for query in queries:
            for options in ({}, {"group_by": "document", "context": 1}):
                got = retrievers["2 shards"].search(query, k=5, **options)
                same_passages(got, retrievers["whole"].search(query, k=5, **options))
                assert gone not in {h.doc_id for h in got.hits}
        top = retrievers["2 shards"].search(NEEDLE, k=1).hits[0]
        assert top.doc_id == changed.id and top.passage == 0
        with IndexWriter(roots["2 shards"], encoder=encoder) as writer:
            report = writer.compact()
        assert report.records_folded == 2 and is_sharded(roots["2 shards"])
        assert retrievers["2 shards"].refresh()
        fresh_root = tmp_path / "fresh"
        live = [new if d.id == changed.id else d for d in long_docs if d.id != gone]
        build_index(live, fresh_root, encoder=encoder, config=config, progress=False)
        with Retriever.load(fresh_root, CONFIG, encoder=encoder) as fresh:
            for query in queries:
                same_passages(retrievers["2 shards"].search(query, k=5, group_by="document"),
                              fresh.search(query, k=5, group_by="document"))
    finally:
        for retriever in retrievers.values():
            retriever.close()


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


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_a_publish_flips_every_shard_at_once_under_load(cluster, tmp_path, layout):
    """Searches running while builds flip each see one build: every hit is of the generation
    its result's build id names, never a mix."""
    first = _generation(tmp_path, "a", publish=True)
    staged = [_generation(tmp_path, tag, publish=False) for tag in ("bb", "ccc")]
    generation = {first.build_id: "a", staged[0].build_id: "bb", staged[1].build_id: "ccc"}
    vector = np.ones(8, np.float32)
    seen: list[SearchResult] = []
    stop = threading.Event()
    with open_layout(layout, tmp_path) as retriever:
        def search() -> None:
            while not stop.is_set():
                seen.append(retriever.search("alpha beta", k=30, query_vector=vector))

        threads = [threading.Thread(target=search) for _ in range(2)]
        for thread in threads:
            thread.start()
        for report in (*staged, first):
            publish_build(tmp_path, report.build_id)
            retriever.refresh()  # the log thread may have swapped it in already
            assert retriever.build_id == report.build_id
            time.sleep(0.2)  # searches run on each generation
        stop.set()
        for thread in threads:
            thread.join()
    assert {r.build_id for r in seen} == set(generation)
    for result in seen:
        assert len(result.hits) == 30
        assert {h.metadata["gen"] for h in result.hits} == {generation[result.build_id]}


@pytest.fixture
def live_roots(tmp_path, dataset):
    """{layout: index root} of the same 120 SciFact documents and vectors (whole, then 2
    shards for each sharded layout)."""
    docs = scifact_docs(dataset("scifact"), 120)
    roots = {layout: tmp_path / f"layout-{i}" for i, layout in enumerate(LAYOUTS)}
    for layout, root in roots.items():
        build_small(root, docs, shards=None if layout == "whole" else 2)
    return roots, docs


LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": 0.2, "vector_weight": 0.5}
NEEDLE = "zebrafish telomerase hibernation"


def _write_the_day(root, docs) -> None:
    with IndexWriter(root) as writer:
        writer.upsert([Document("live-1", f"{NEEDLE} in a new study", metadata={"year": 2031}),
                       Document(docs[70].id, f"{NEEDLE} rewritten", metadata={"year": 1999})],
                      vectors=unit_vectors(2, 7))
        writer.delete([docs[3].id, docs[90].id])


def test_live_writes_and_compaction_are_the_same_on_every_layout(cluster, live_roots):
    """An upsert and a delete through the writer are visible within the live lag, searched
    exactly alike on every layout (the whole build is the reference); compaction folds them
    into the next build of the same layout, which every layout then serves."""
    roots, docs = live_roots
    vector = unit_vectors(1, 99)[0]
    queries = [NEEDLE, docs[3].text[:80], docs[90].title, "cell growth in tumors"]
    retrievers = {name: open_layout(name, root, LIVE) for name, root in roots.items()}
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
            for layout in LAYOUTS[1:]:
                got = retrievers[layout].search(query, None, 10, query_vector=vector)
                same(got, want)
                assert not {docs[3].id, docs[90].id} & {h.doc_id for h in got.hits}
                assert got.build_id.endswith("+2")  # the sharded build plus two log records
        written = {"id": {"in": ["live-1", docs[70].id, docs[3].id]}}
        want = retrievers["whole"].search(NEEDLE, written, 10, query_vector=vector)
        assert sorted(h.doc_id for h in want.hits) == sorted(["live-1", docs[70].id])
        fetched = retrievers["whole"].get_documents(["live-1", docs[70].id, docs[3].id])
        assert fetched[1] is not None and fetched[1].text == f"{NEEDLE} rewritten"
        assert fetched[2] is None
        for layout in LAYOUTS[1:]:
            same(retrievers[layout].search(NEEDLE, written, 10, query_vector=vector), want)
            assert retrievers[layout].get_documents(
                ["live-1", docs[70].id, docs[3].id]) == fetched
        for name, root in roots.items():
            with IndexWriter(root) as writer:
                report = writer.compact()
            assert report.records_folded == 2 and report.n_docs == 119
            assert is_sharded(root) == (name != "whole")
            retrievers[name].refresh()  # the log thread may have swapped it in already
            assert retrievers[name].build_id == report.build_id
        for query in queries:
            want = retrievers["whole"].search(query, None, 10, query_vector=vector)
            for layout in LAYOUTS[1:]:
                same(retrievers[layout].search(query, None, 10, query_vector=vector), want)
        assert isinstance(retrievers["2 shards"].snapshot, ShardedBuild)
        assert isinstance(retrievers[RAY].snapshot, RayShardedBuild)
    finally:
        for retriever in retrievers.values():
            retriever.close()
