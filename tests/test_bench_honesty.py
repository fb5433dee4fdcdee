"""The benchmarks measure what their reports say: the configuration timed is the one scored,
peers and ours run on the same queries, and counts cover the samples they claim.

Nothing here asserts a timing: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from small_index import QUERIES as CRANFIELD_QUERIES
from small_index import index_fixture  # noqa: F401 (the `index` fixture)

from benchmarks import suite
from benchmarks.common import measure_in_chunks, measure_side_by_side
from benchmarks.streamed_shards import SyntheticShard, build_tantivy
from benchmarks.synthetic import random_unit_vectors, synthetic_documents
from benchmarks.synthetic_corpus import SyntheticCorpus
from benchmarks.workloads import Workload
from indexes.build import build_index
from indexes.manifest import EncoderInfo
from indexes.sharding import shard_ranges

DIM = 16
QUERIES = ["heart disease risk", "cancer therapy trial outcome", "immune response virus",
           "blood pressure statin", "insulin glucose obesity diet", "brain neuron signal",
           "gene expression mutation", "patient mortality cohort"]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 generated documents with random vectors: every query word matches many rows."""
    root = tmp_path_factory.mktemp("honesty") / "index"
    info = EncoderInfo(encoder_id=f"random:none:fp32:{DIM}", model="random", dim=DIM,
                       vector_dtype="float32")
    build_index(list(synthetic_documents(600)), root, vectors=random_unit_vectors(600, DIM),
                encoder_info=info, progress=False)
    return root


def test_suite_scores_at_ten_the_configuration_it_times(tiny_root: Path) -> None:
    """A k=1000 search raises C to 1000: the top 10 scored must come from the k=10 runs."""
    n = len(QUERIES)
    ids = [f"q{i}" for i in range(n)]
    w = Workload("tiny", "synthetic", tiny_root, ids, QUERIES, [None] * n,
                 random_unit_vectors(n, DIM, seed=5), None, None, 0, {})
    systems, _, default = suite.our_systems(w, argparse.Namespace(candidates=30, weight=0.6), {})
    try:
        timed = systems[0].runner(suite.K)
        # Graded by the timed configuration's own order: only that order scores nDCG@10 = 1.
        w.qrels = {q: {doc: suite.K - rank for rank, doc in enumerate(timed(i)[1])}
                   for i, q in enumerate(ids)}
        scores = suite.quality(systems, w)
    finally:
        default.close()
    assert scores[systems[0].name]["ndcg@10"] == pytest.approx(1.0)
    assert set(scores[systems[0].name]) == set(suite.SUITE_METRICS)


def test_search_speed_up_over_rank_bm25_is_taken_on_its_queries(tiny_root: Path) -> None:
    """rank-bm25 is timed on a prefix of the queries: ours must be timed beside it on that
    prefix, and the speed-up taken from that pair, not from ours over every query."""
    from benchmarks import search
    from benchmarks.peers import tokenize_corpus
    from retrieval import Retriever, RetrieverConfig

    retriever = Retriever.load(tiny_root, RetrieverConfig(candidates=search.CANDIDATES))
    try:
        docs = [retriever.snapshot.docs.get(r) for r in range(len(retriever.snapshot.docs))]
        ds = search.Dataset(
            "tiny", retriever, [d.content for d in docs],
            np.array([d.id for d in docs], dtype=object),
            retriever.snapshot.vectors.reconstruct_all(), queries=QUERIES,
            query_vectors=random_unit_vectors(len(QUERIES), DIM, seed=5), warmup=[0, 1],
            measured=list(range(2, len(QUERIES))))
        terms, ids = tokenize_corpus(ds.analyzer, ds.texts)
        args = argparse.Namespace(rank_bm25_queries=2, chunk=3)
        result = search.summarize_dataset(ds, search.run_dataset(ds, args, terms, ids))
    finally:
        retriever.close()
    configs = result["configs"]
    peer = configs[search.PEER_A]
    beside = [c for name, c in configs.items()
              if name.startswith(search.OURS) and c["queries"] == peer["queries"]]
    assert len(beside) == 1, {name: c["queries"] for name, c in configs.items()}
    speed_up = next(c for c in result["checks"] if "rank-bm25" in c["check"])["value"]
    assert speed_up == {q: peer["e2e"][q] / beside[0]["e2e"][q] for q in ("p50", "p95")}


def test_in_process_load_counts_errors_of_the_measured_window_only() -> None:
    """A failure in the warm-up is discarded with it, as its time is."""
    from benchmarks.http_load import closed_loop_threads

    calls = []

    def first_call_fails(item: str) -> None:
        calls.append(item)
        if len(calls) == 1:  # the first call starts the warm-up
            raise RuntimeError("cold")

    cell = closed_loop_threads(first_call_fails, ["q"], 1, seconds=0.1, warmup=0.1)
    assert cell["errors"] == 0
    assert cell["requests"] == cell["latency"]["n"]


@pytest.fixture()
def shedding_server() -> Iterator[str]:
    """A real HTTP server that sheds every search (503), as an overloaded service does."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Shed(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Shed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_httpx_load_counts_shed_requests_as_no_answers(shedding_server: str) -> None:
    """As wrk's cells: a 503 is an error, not an answer a second; counts cover the measured
    window only."""
    from benchmarks.http_load import httpx_load

    cell = httpx_load(shedding_server, ["q"], 2, seconds=0.2, warmup=0.1)
    assert cell["requests"] > 0
    assert cell["errors"] == cell["requests"]
    assert cell["rps"] == 0


def small_tantivy(directory: Path) -> Any:
    """A tantivy index of 50 generated documents, as keyword_peer's schema."""
    import tantivy

    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", tokenizer_name="en_stem")
    index = tantivy.Index(schema.build(), path=str(directory))
    writer = index.writer(heap_size=15_000_000, num_threads=1)
    for doc in synthetic_documents(50):
        writer.add_document(tantivy.Document(id=doc.id, body=doc.text))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index


def test_tantivy_is_asked_without_a_count(tmp_path: Path) -> None:
    """The tantivy side of keyword_peer and streamed_shards collects the top n only: a
    ``Count`` collector would time work the project's side does not do."""
    from benchmarks.keyword_peer import tantivy_top

    found = tantivy_top(small_tantivy(tmp_path), QUERIES, 5)(0)
    assert len(found.hits) == 5
    assert found.count is None


def test_filters_cpu_and_wall_cover_the_same_calls() -> None:
    """The validate + mask table's CPU column summarizes the calls its wall column does."""
    from benchmarks import filters

    setup = filters.MetadataSetup(2_000)
    runs = filters.validate_mask_runs(setup, filters.selective_filters(setup)["IN 10"], 20)
    for wall, cpu in (("first sight (parse + mask)", "first"), ("repeat, fresh JSON", "fresh"),
                      ("repeat, same object", "same")):
        assert runs["cpu"][cpu]["n"] == runs[wall]["n"], wall


def sorted_words(text: str) -> list[str]:
    return sorted(text.split() * 2_000)


def test_keyword_peer_reports_cpu_per_search_as_a_mean(tmp_path: Path) -> None:
    """Linux reads the CPU time of threads other than the reading one only as of their last
    tick or switch, so per-search percentiles of all-thread CPU do not hold: the CPU column is
    the measured searches' total CPU over their number, and is labelled a mean."""
    from benchmarks.keyword_peer import PEER, report, tantivy_top

    with ThreadPoolExecutor(2) as pool:
        runners = {PEER: tantivy_top(small_tantivy(tmp_path), QUERIES, 5),
                   "sorts in two threads": lambda i: list(pool.map(sorted_words, QUERIES))}
        samples = measure_side_by_side(runners, list(range(len(QUERIES))), warmup=[0], chunk=3)
    results, table = report(samples)
    header, _, *rows = table.splitlines()
    assert "CPU ms per search, mean (all threads)" in header
    assert "p95 (all threads)" not in header
    for row in rows:
        name, _, cpu, _ = (cell.strip() for cell in row.strip("|").split("|"))
        mean = samples[name].cpu_total_ms / len(QUERIES)
        assert cpu == f"{mean:.3g}"
        assert results["cpu_ms_mean"][name] == mean


def test_cpu_total_is_kept_across_chunks_of_measure_in_chunks() -> None:
    """``measure_in_chunks`` carries each chunk's CPU total into its samples, as their walls."""
    samples = measure_in_chunks({"sort": lambda i: sorted_words(QUERIES[i])},
                                list(range(len(QUERIES))), warmup=[0], chunk=3)
    assert len(samples["sort"].wall_ms) == len(QUERIES)
    assert samples["sort"].cpu_total_ms > 0


def test_filters_in_cases_are_named_by_the_values_they_hold(tmp_path: Path) -> None:
    """2,000 passages hold 400 articles: the IN cases asking 1,000, 10,000 and 100,000 ids
    hold 400, and their names and the validate + mask tables say so."""
    from benchmarks import filters

    setup = filters.MetadataSetup(2_000)
    in_cases = {name: spec for name, spec in filters.selective_filters(setup).items()
                if name.startswith("IN ")}
    assert len(in_cases) == len(filters.IN_SIZES)
    for name, spec in in_cases.items():
        assert int(name.split()[1].replace(",", "")) == len(spec["article"]["in"]), name
    args = filters.parse_args(["--docs", "2000", "--validate-mask-only", "--in-repeats", "3",
                               "--out", str(tmp_path)])
    assert filters.validate_mask_only(args) == 0
    markdown = next(tmp_path.glob("filters-validate-mask-*.md")).read_text()
    assert markdown.count("validate + mask, 400 IN values:") == 2
    assert "10,000 IN values" not in markdown


def test_zipf_replay_leaves_its_warm_up_out(index: Path) -> None:
    """A fresh retriever's first search is a miss on an empty cache: a replay of one
    question counts only hits once that miss is in its warm-up, and counts the requests
    asked for."""
    from benchmarks.cache import zipf_replay
    from retrieval import Retriever

    retriever = Retriever.load(index, {"cache": {"backend": "memory"}})
    try:
        replay = zipf_replay(retriever, CRANFIELD_QUERIES[:1], n=20, a=2.0, seed=7)
    finally:
        retriever.close()
    assert replay["requests"] == replay["summary"]["n"] == 20
    assert replay["hit_rate"] == 1.0


PAUSE = 1.0  # seconds a slow shard source waits on each read


class SlowShard(SyntheticShard):
    """A shard whose generation waits ``PAUSE``, as a read from a slow store does."""

    def corpus(self) -> SyntheticCorpus:
        time.sleep(PAUSE)
        return super().corpus()


def test_tantivy_build_seconds_count_generating_its_texts(tmp_path: Path) -> None:
    """The project's streamed build generates each shard inside its timed tasks, so tantivy's
    build seconds count generating the same texts too."""
    sources = [SlowShard(200, a, b, i) for i, (a, b) in enumerate(shard_ranges(200, 2))]
    built = build_tantivy(sources, tmp_path / "tantivy")
    assert built["seconds"] >= PAUSE * len(sources)
    assert built["seconds"] >= built["generate_seconds"] >= PAUSE * len(sources)


def test_tantivy_is_fed_the_passages_the_project_builds() -> None:
    shard = SyntheticShard(200, 100, 200, 1)
    documents, _ = shard()
    assert shard.passages() == [(d.id, d.text) for d in documents]
