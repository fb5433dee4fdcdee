"""Named filters through the Retriever on a real index: searches refer to them with
``{"$named": name}``, alone or ANDed with inline clauses; registering again replaces (and the
result cache never serves the old filter's results); masks are bound for a new build before it
is swapped in; a build that cannot serve a registered filter is refused."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from retrieval import MalformedFilterError, Retriever, UnknownFieldError, UnknownNamedFilterError
from retrieval.config import RetrieverConfig
from retrieval.filters import evaluate, parse_filter
from retrieval.service.state import ServiceState

CARDIO = {"department": "cardiology"}


@pytest.fixture(scope="module")
def docs(dataset):
    return list(itertools.islice(with_demo_metadata(read_corpus(dataset("cranfield"))), 200))


@pytest.fixture(scope="module")
def build_subset(index, encoder):
    """build(docs, root): the small index's documents, their vectors reused by content hash."""
    config = BuildConfig(reuse_from=str(index))

    def build(docs: list[Document], root: Path) -> None:
        build_index(docs, root, encoder=encoder, config=config, progress=False)

    return build


@pytest.fixture(scope="module")
def root(docs, build_subset, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("named")
    build_subset(docs, path)
    return path


@pytest.fixture
def retriever(root, query_encoder):
    with Retriever.load(root, encoder=query_encoder) as loaded:  # the in-process result cache
        yield loaded


def _ids(result) -> list[str]:
    return [hit.doc_id for hit in result.hits]


def test_named_filter_equals_its_inline_spec_and_ands_with_inline_clauses(retriever) -> None:
    allowed = retriever.register_filter("cardio", CARDIO)
    assert allowed == retriever.named_filters()["cardio"] > 0
    combined = {**CARDIO, "year": {"gte": 2010}}
    for query in QUERIES[:3]:
        named = retriever.search(query, {"$named": "cardio"}, k=5)
        assert _ids(named) == _ids(retriever.search(query, CARDIO, k=5))
        assert {hit.metadata["department"] for hit in named.hits} == {"cardiology"}
        both = retriever.search(query, {"$named": "cardio", "year": {"gte": 2010}}, k=5)
        assert _ids(both) == _ids(retriever.search(query, combined, k=5))
        assert all(hit.metadata["year"] >= 2010 for hit in both.hits)


def test_registering_again_replaces_and_is_never_served_from_the_old_cache(retriever) -> None:
    retriever.register_filter("team", CARDIO)
    first = retriever.search(QUERIES[1], {"$named": "team"}, k=5)
    assert retriever.flush_cache_writes()
    assert retriever.search(QUERIES[1], {"$named": "team"}, k=5).cache.result == "hit"
    retriever.register_filter("team", {"department": "oncology"})
    second = retriever.search(QUERIES[1], {"$named": "team"}, k=5)
    assert second.cache.result == "miss" and second.hits and _ids(second) != _ids(first)
    assert {hit.metadata["department"] for hit in second.hits} == {"oncology"}


def test_unknown_and_malformed_references_are_refused(retriever) -> None:
    with pytest.raises(UnknownNamedFilterError, match="nobody"):
        retriever.search("cell", {"$named": "nobody"})
    retriever.register_filter("cardio", CARDIO)
    retriever.unregister_filter("cardio")
    with pytest.raises(UnknownNamedFilterError, match="cardio"):
        retriever.search("cell", {"$named": "cardio"})
    with pytest.raises(UnknownNamedFilterError, match="cardio"):
        retriever.unregister_filter("cardio")
    with pytest.raises(MalformedFilterError, match=r"\$named"):
        retriever.search("cell", {"$named": 42})
    with pytest.raises(MalformedFilterError, match="top level"):  # only at the top level
        retriever.search("cell", {"$or": [{"$named": "x"}, CARDIO]})
    with pytest.raises(UnknownFieldError):  # a bad spec registers nothing
        retriever.register_filter("bad", {"nope": 1})
    assert retriever.named_filters() == {}


def _variant(docs: list[Document], n: int, drop: str | None = None) -> list[Document]:
    """A new build: one text changes (a new build id); ``drop`` removes a metadata field."""
    first = docs[0]
    changed = [Document(first.id, f"{first.text} revision {n}", first.title, first.metadata),
               *docs[1:]]
    if drop is None:
        return changed
    return [Document(d.id, d.text, d.title, {k: v for k, v in d.metadata.items() if k != drop})
            for d in changed]


def test_masks_are_bound_before_the_swap_and_unservable_builds_refused(
        docs, query_encoder, tmp_path, build_subset) -> None:
    build_subset(docs, tmp_path)
    # No log follower: its own poll (every second) loaded the new build once before reload()
    # did, which then had nothing to load and returned False.
    retriever = Retriever.load(tmp_path, {"cache": {"backend": "none"}, "live_lag_seconds": None},
                               encoder=query_encoder)
    retriever.register_filter("cardio", CARDIO)
    old = retriever.snapshot
    build_subset(_variant(docs, 1), tmp_path)
    assert retriever.reload() is True
    fresh = retriever.snapshot
    assert fresh is not old
    # Before any request on the new build, its named mask is there, computed on its metadata.
    entry = retriever._live.filters.named.get("cardio")
    assert retriever._live.snapshot is fresh and not entry.mask.flags.writeable
    np.testing.assert_array_equal(entry.mask, evaluate(parse_filter(CARDIO, fresh.metadata.kinds),
                                                       fresh.metadata))
    assert _ids(retriever.search(QUERIES[0], {"$named": "cardio"}, k=5)) == \
        _ids(retriever.search(QUERIES[0], CARDIO, k=5))
    build_subset(_variant(docs, 2, drop="department"), tmp_path)
    assert retriever.reload() is False  # it could not serve "cardio": the old build serves on
    assert retriever.snapshot is fresh
    assert "department" in retriever.stats()["reloads"][-1]["error"]
    retriever.close()


def test_the_service_registers_the_configured_named_filters(index, query_encoder) -> None:
    def load() -> Retriever:
        return Retriever.load(index, {"cache": {"backend": "none"}}, encoder=query_encoder)

    state = ServiceState(index, RetrieverConfig(), load, {"cardio": CARDIO})
    state.start_loading()
    assert state.wait_loaded(120)
    try:
        hits = state.retriever().search(QUERIES[0], {"$named": "cardio"}, k=5).hits
        assert hits and {hit.metadata["department"] for hit in hits} == {"cardiology"}
    finally:
        state.close()
    broken = ServiceState(index, RetrieverConfig(), load, {"bad": {"nope": 1}})
    broken.start_loading()  # it keeps retrying: a build that can serve the filter may come
    try:
        deadline = time.monotonic() + 120
        while broken.load_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not broken.readiness()[0]
        assert broken.load_error is not None and "'bad'" in broken.load_error
    finally:
        broken.close()
