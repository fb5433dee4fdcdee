"""Session fixtures for real data: datasets, the real model, and indexes built from them.

Datasets come from ``--data-dir`` / ``RETRIEVAL_DATA`` (default ``../shared/data``), else from
the copies the repository ships (``examples/data``: Cranfield, SciFact and CISI, with their
SOURCE.md), so a fresh clone runs every test. A dataset found nowhere skips with a message
saying where it was looked for, except under CI (``CI`` set), where it is a failure. Indexes
are built under ``RETRIEVAL_TEST_INDEXES`` (default ``build/test-indexes``); a rebuild there
reuses vectors by content hash, as operators' rebuilds do.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "examples" / "data"  # the collections the repository ships


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--data-dir", default=None, help="folder holding scifact/, cranfield/, cisi/")


def _data_dir(config: pytest.Config) -> Path:
    given = config.getoption("--data-dir") or os.environ.get("RETRIEVAL_DATA")
    return Path(given) if given else (REPO.parent / "shared" / "data")


@pytest.fixture(scope="session")
def dataset(request: pytest.FixtureRequest):
    """dataset(name) -> Path of a BEIR folder, skipping (failing under CI) when absent."""

    def find(name: str) -> Path:
        path = _data_dir(request.config) / name
        if not (path / "corpus.jsonl").is_file():
            path = SHIPPED / name
        if not (path / "corpus.jsonl").is_file():
            message = (f"dataset {name!r} not found at {_data_dir(request.config) / name} nor "
                       f"{path}; pass --data-dir or RETRIEVAL_DATA")
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        return path

    return find


@pytest.fixture(scope="session")
def encoder() -> SentenceTransformerEncoder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceTransformerEncoder()


def _index_root(name: str) -> Path:
    base = Path(os.environ.get("RETRIEVAL_TEST_INDEXES", REPO / "build" / "test-indexes"))
    return base / name


@pytest.fixture(scope="session")
def beir_index(dataset, encoder):
    """beir_index(name) -> (index root, queries, test qrels); built once per session."""
    built: dict[str, tuple[Path, dict[str, str], dict[str, dict[str, int]]]] = {}

    def get(name: str) -> tuple[Path, dict[str, str], dict[str, dict[str, int]]]:
        if name not in built:
            path = dataset(name)
            root = _index_root(name)
            build_index(with_demo_metadata(read_corpus(path)), root, encoder=encoder,
                        progress=False)
            qrels = read_qrels(path / "qrels" / "test.tsv")
            queries = {q: t for q, t in read_queries(path / "queries.jsonl").items() if q in qrels}
            built[name] = (root, queries, qrels)
        return built[name]

    return get


@pytest.fixture(scope="session")
def build_subset(beir_index, encoder):
    """build_subset(docs, root): build SciFact documents, reusing the full build's vectors.

    Documents whose text is unchanged get their vectors from the session's SciFact index (by
    content hash, as a nightly rebuild would); changed documents are encoded by the real model.
    """
    source, _, _ = beir_index("scifact")
    config = BuildConfig(reuse_from=str(source))

    def build(docs, root):
        return build_index(docs, root, encoder=encoder, config=config, progress=False)

    return build


@pytest.fixture(scope="module")
def uncached_scifact(beir_index, encoder):
    """A Retriever over the session's SciFact index with caching off: every call searches."""
    from retrieval import Retriever

    root, _, _ = beir_index("scifact")
    retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    yield retriever
    retriever.close()


@pytest.fixture(scope="session")
def scifact_exact(beir_index, encoder):
    """(Retriever over the session's SciFact index with its dense leg searched exactly and
    caching off, test query texts, their vectors): the reference sharded search equals."""
    import dataclasses

    from indexes.ann import ExactDense
    from retrieval import Retriever

    root, queries, _ = beir_index("scifact")
    retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    snapshot = retriever.snapshot
    retriever._live = dataclasses.replace(
        retriever._live, snapshot=dataclasses.replace(snapshot, dense=ExactDense(snapshot.vectors)))
    texts = list(queries.values())
    yield retriever, texts, encoder.encode(texts, batch_size=64)
    retriever.close()


@pytest.fixture(scope="session")
def scifact_sharded(beir_index, dataset, encoder, tmp_path_factory):
    """scifact_sharded(S) -> root of SciFact in S shards with exact dense legs (vectors reused
    from the session's SciFact index by content hash); built once per session."""
    from indexes.build import build_index

    source, _, _ = beir_index("scifact")
    built: dict[int, Path] = {}

    def get(count: int) -> Path:
        if count not in built:
            root = tmp_path_factory.mktemp(f"scifact-{count}-shards")
            docs = list(with_demo_metadata(read_corpus(dataset("scifact"))))
            report = build_index(docs, root, shards=count, encoder=encoder, progress=False,
                                         config=BuildConfig(reuse_from=str(source)),
                                         dense="exact")
            assert report.vectors_reused == len(docs)
            built[count] = root
        return built[count]

    return get
