"""Sharded search on Ray Serve: one local Ray cluster (2 CPUs) for the whole module, SciFact
in 2 shards of 2 replicas each behind a router; equality with the unsharded index over
handles and HTTP, and no failed search while a replica is killed under load."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import ray
from ray import serve

from retrieval.sharding.ray_serve import APP_NAME, serve_sharded

FILTER = {"department": {"in": ["cardiology", "oncology"]}, "year": {"gte": 2005}}
CONFIG = {"cache": {"backend": "none"}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def on_ray(scifact_sharded, scifact_exact):
    root = scifact_sharded(2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        handle = serve_sharded(root, CONFIG, port=port, replicas=2, encode=False)
        yield handle, port, scifact_exact
    finally:
        serve.shutdown()
        ray.shutdown()


def same(got, want) -> None:
    assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits]
    assert [h.score for h in got.hits] == pytest.approx([h.score for h in want.hits], abs=1e-6)
    assert (got.candidates, got.allowed) == (want.candidates, want.allowed)


@pytest.mark.parametrize("filters", [None, FILTER], ids=["all", "filtered"])
def test_ray_serve_results_equal_unsharded_on_scifact(on_ray, filters):
    handle, _, (unsharded, texts, vectors) = on_ray
    assert len(texts) == 300
    with ThreadPoolExecutor(4) as pool:  # concurrent callers, as a router serves them
        answers = list(pool.map(
            lambda pair: handle.search.remote(pair[0], filters, 10, None, pair[1]).result(),
            zip(texts, vectors, strict=True)))
    for text, vector, got in zip(texts, vectors, answers, strict=True):
        same(got, unsharded.search(text, filters, 10, query_vector=vector))


def test_http_route_answers_like_the_unsharded_index(on_ray):
    _, port, (unsharded, texts, vectors) = on_ray
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for text, vector in list(zip(texts, vectors, strict=True))[:20]:
            response = client.post("/search", json={"query": text, "filters": FILTER, "k": 10,
                                                    "query_vector": vector.tolist()})
            assert response.status_code == 200, response.text
            want = unsharded.search(text, FILTER, 10, query_vector=vector)
            assert [h["doc_id"] for h in response.json()["hits"]] == [
                h.doc_id for h in want.hits]
        bad = client.post("/search", json={"query": "x", "k": 0, "query_vector": [0.0] * 384})
        assert bad.status_code == 400 and bad.json()["error"] == "InvalidQueryError"


def _replicas(deployment: str) -> list[str]:
    prefix = f"SERVE_REPLICA::{APP_NAME}#{deployment}#"
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)]


def test_killing_a_replica_under_load_fails_no_search(on_ray):
    handle, _, (unsharded, texts, vectors) = on_ray
    victims = _replicas("shard-000")
    assert len(victims) == 2
    done = threading.Event()
    count = {"served": 0}
    lock = threading.Lock()

    def search(i: int):
        result = handle.search.remote(texts[i % 300], None, 10, None, vectors[i % 300]).result()
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
