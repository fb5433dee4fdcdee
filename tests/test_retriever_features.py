"""Nightly features in ranking on SciFact: direction, cache invalidation, store outages."""

from __future__ import annotations

import time

import pytest
from redis_servers import RedisProcess

from retrieval import Retriever, RetrieverConfig
from retrieval.errors import ConfigError
from retrieval.features import CallableSource, Feature, FeatureView, LocalStore, materialize

VIEW = FeatureView(name="popularity", features=(Feature(name="clicks", dtype="float32",
                                                        default=0.0),))
QUERY = "vitamin D deficiency and bone fractures"


def _clicks(favourite: str, all_ids: list[str], value: float = 1000.0):
    def rows():
        return [{"doc_id": d, "clicks": value if d == favourite else 1.0} for d in all_ids]
    return CallableSource(rows)


def _config(weight: float, **extra) -> dict:
    return {"cache": {"backend": "none"}, "features": [
        {"view": "popularity", "weights": {"clicks": weight}, "normalization": "minmax"}],
        **extra}


@pytest.fixture(scope="module")
def index(beir_index):
    return beir_index("scifact")[0]


def test_feature_weight_moves_ranking_in_its_direction(index, encoder, tmp_path):
    plain = Retriever.load(index, {"cache": {"backend": "none"}}, encoder=encoder)
    baseline = [h.doc_id for h in plain.search(QUERY, k=10).hits]
    favourite = baseline[6]
    store = LocalStore(tmp_path / "features")
    materialize(VIEW, _clicks(favourite, plain.snapshot.docs.all_ids()), store, progress=False)
    boosted = Retriever.load(index, _config(0.5), encoder=encoder, feature_store=store)
    result = boosted.search(QUERY, k=10)
    ids = [h.doc_id for h in result.hits]
    assert ids[0] == favourite
    assert result.hits[0].features["clicks"] == 1000.0
    assert result.feature_snapshot_id and result.feature_snapshot_id.startswith("popularity=")
    assert result.features_available is True
    assert "features" in result.timings
    demoted = Retriever.load(index, _config(-0.5), encoder=encoder, feature_store=store)
    assert favourite not in [h.doc_id for h in demoted.search(QUERY, k=10).hits[:6]]


def test_hits_report_features_with_the_views_dtypes(index, encoder, tmp_path):
    """An int64 feature is an exact int in the hits (2**53 + 1 has no float64), a bool a bool,
    also when the result comes back from the cache."""
    view = FeatureView(name="signals", features=(
        Feature(name="views", dtype="int64", default=0),
        Feature(name="editor_pick", dtype="bool", default=False),
        Feature(name="quality", dtype="float64", default=0.0)))
    plain = Retriever.load(index, {"cache": {"backend": "none"}}, encoder=encoder)
    ids = plain.snapshot.docs.all_ids()
    big = 2**53 + 1
    rows = [{"doc_id": d, "views": big + i, "editor_pick": i % 2 == 0, "quality": i / 7}
            for i, d in enumerate(ids)]
    store = LocalStore(tmp_path / "features")
    materialize(view, CallableSource(lambda: rows), store, progress=False)
    config = {"cache": {"backend": "memory"}, "features": [
        {"view": "signals", "weights": {"views": 0.1}, "normalization": "minmax"}]}
    retriever = Retriever.load(index, config, encoder=encoder, feature_store=store)
    position = {d: i for i, d in enumerate(ids)}
    for expected_cache in ("miss", "hit"):
        result = retriever.search(QUERY, k=5)
        assert result.cache.result == expected_cache
        for hit in result.hits:
            i = position[hit.doc_id]
            assert type(hit.features["views"]) is int and hit.features["views"] == big + i
            assert type(hit.features["editor_pick"]) is bool
            assert hit.features["editor_pick"] is (i % 2 == 0)
            assert type(hit.features["quality"]) is float and hit.features["quality"] == i / 7


def test_materialization_invalidates_cached_results(index, encoder, tmp_path):
    store = LocalStore(tmp_path / "features")
    plain = Retriever.load(index, {"cache": {"backend": "none"}}, encoder=encoder)
    ids = plain.snapshot.docs.all_ids()
    first_pick = [h.doc_id for h in plain.search(QUERY, k=10).hits][5]
    materialize(VIEW, _clicks(first_pick, ids), store, progress=False)
    config = _config(0.5, feature_snapshot_refresh_seconds=0.05)
    config["cache"] = {"backend": "memory"}
    retriever = Retriever.load(index, config, encoder=encoder, feature_store=store)
    before = retriever.search(QUERY, k=10)
    assert retriever.search(QUERY, k=10).cache.result == "hit"
    second_pick = [h.doc_id for h in plain.search(QUERY, k=10).hits][8]
    materialize(VIEW, _clicks(second_pick, ids), store, progress=False)
    time.sleep(0.1)
    after = retriever.search(QUERY, k=10)
    assert after.cache.result == "miss"
    assert after.feature_snapshot_id != before.feature_snapshot_id
    assert after.hits[0].doc_id == second_pick != before.hits[0].doc_id


def test_unreachable_feature_store_serves_defaults(index, encoder):
    from retrieval.features import RedisStore

    server = RedisProcess()
    server.start()
    try:
        store = RedisStore(server.url, socket_timeout_ms=200, connect_timeout_ms=200)
        plain = Retriever.load(index, {"cache": {"backend": "none"}}, encoder=encoder)
        ids = plain.snapshot.docs.all_ids()
        favourite = [h.doc_id for h in plain.search(QUERY, k=10).hits][6]
        materialize(VIEW, _clicks(favourite, ids), store, progress=False)
        store.register(VIEW)
        boosted = Retriever.load(index, _config(0.5), encoder=encoder, feature_store=store)
        assert boosted.search(QUERY, k=10).hits[0].doc_id == favourite
        server.stop()
        result = boosted.search(QUERY, k=10)
        assert result.features_available is False
        assert [h.doc_id for h in result.hits] == [h.doc_id for h in plain.search(QUERY,
                                                                                  k=10).hits]
    finally:
        server.cleanup()


def test_feature_weights_without_a_feature_store_are_refused_at_load(index, encoder):
    """Accepted before and ignored: every search ranked as if the weights were not there."""
    with pytest.raises(ConfigError, match="no feature store is configured") as caught:
        Retriever.load(index, _config(0.5), encoder=encoder)
    assert caught.value.key == "features"


def test_a_view_name_no_store_holds_and_more_candidates_than_a_read_are_refused_at_load(
        index, encoder, tmp_path):
    """Both loaded, then failed every search as the caller's bad request (a 400 over HTTP)."""
    with pytest.raises(ConfigError, match="features.0.view") as caught:
        RetrieverConfig(**_config(0.5) | {"features": [
            {"view": "pop.v2/beta", "weights": {"clicks": 0.5}}]})
    assert caught.value.key == "features.0.view"
    store = LocalStore(tmp_path / "fs", max_entities_per_read=150)
    with pytest.raises(ConfigError, match="features of 1000 candidates.*at most 150") as caught:
        Retriever.load(index, _config(0.5), encoder=encoder, feature_store=store)
    assert caught.value.key == "feature_candidates"
    # k=200 read 200 ids in one read as well: within limits.max_k, it is checked too.
    with pytest.raises(ConfigError, match="features of 200 candidates"):
        Retriever.load(index, _config(0.5, limits={"max_k": 200}), encoder=encoder,
                       feature_store=store)
    Retriever.load(index, _config(0.5, limits={"max_k": 150}), encoder=encoder,
                   feature_store=store).close()


def test_a_feature_store_namespace_is_checked_with_the_config():
    """Checked as the cache's namespace is, at config time with its key (it failed at load as
    a cache error naming no setting)."""
    with pytest.raises(ConfigError, match="namespace 'tenant{a}' is invalid") as caught:
        RetrieverConfig(feature_store={"location": "features", "namespace": "tenant{a}"})
    assert caught.value.key == "feature_store.namespace"


def test_live_writes_get_their_own_feature_values(dataset, tmp_path):
    """A live snapshot's ids by row are its base's, then its delta's: each hit reads the
    features of its own id, a live upsert's included, while the base's id list is made once
    (it was made anew, one id per row, on the first search after every write)."""
    from live_index import build_small, scifact_docs, unit_vectors

    from indexes import Document
    from indexes.writer import IndexWriter

    docs = scifact_docs(dataset("scifact"), 30)
    build_small(tmp_path / "root", docs)
    clicks = {d.id: float(i) for i, d in enumerate(docs)} | {"live-1": 500.0, "live-2": 7.0}
    store = LocalStore(tmp_path / "features")
    materialize(VIEW, CallableSource(lambda: [{"doc_id": d, "clicks": c}
                                              for d, c in clicks.items()]), store,
                progress=False)
    config = {**_config(0.1), "live_lag_seconds": None}
    with Retriever.load(tmp_path / "root", config, feature_store=store) as retriever:
        base_ids = retriever._features.doc_ids(retriever.snapshot)
        with IndexWriter(tmp_path / "root") as writer:
            writer.upsert([Document("live-1", "first live write")], vectors=unit_vectors(1, 1))
            writer.delete([docs[0].id])
            seq = writer.upsert([Document("live-2", "second live write"),
                                 Document(docs[1].id, "rewritten live"),
                                 Document("unscored", "a live write the nightly run missed")],
                                vectors=unit_vectors(3, 2))
        statuses = {}
        for query in ("first live write", "second live write", "rewritten live", "cells",
                      "the nightly run missed"):
            result = retriever.search(query, k=10, min_seq=seq,
                                      query_vector=unit_vectors(1, 3)[0])
            assert result.hits
            for hit in result.hits:
                assert hit.features["clicks"] == clicks.get(hit.doc_id, 0.0), hit.doc_id
                statuses[hit.doc_id] = hit.feature_status
        # A default served for a document the store lacks says so: it looked like a value.
        assert statuses["unscored"] == {"popularity": "missing"}
        assert statuses["live-1"] == {"popularity": "present"}
        live_ids = retriever._features.doc_ids(retriever.snapshot)
        assert live_ids.base is base_ids  # the base's list, not made again
