"""The streamed sharded build (``indexes.shard_build``): each shard read and written by its own
task, in worker processes here (on Ray in test_sharding_ray), equals ``build_index(shards=S)``
over the same rows file for file, BM25 arrays included; its typed errors leave nothing
behind."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.manifest import EncoderInfo, read_manifest, resolve_build_dir
from indexes.shard_build import GivenRows, build_streamed, run_here, run_in_processes
from indexes.sharding import build_parts, read_layout, shard_ranges
from indexes.vectors import VectorStore
from retrieval import Retriever

INFO = EncoderInfo(encoder_id="given", model="given", dim=16, vector_dtype="float32")
CONFIG = {"cache": {"backend": "none"}}
QUERIES = ["boundary layer transition", "heat transfer in hypersonic flow", "flutter of panels",
           "shock wave", "slender body lift and drag"]


@dataclass
class Changing:
    """A source that reads other rows the second time."""

    rows: GivenRows
    reads: int = 0

    def __call__(self) -> tuple[list[Document], np.ndarray]:
        self.reads += 1
        documents, vectors = self.rows()
        return (documents, vectors) if self.reads == 1 else (documents[1:], vectors[1:])


@pytest.fixture(scope="module")
def corpus(dataset) -> tuple[list[Document], np.ndarray]:
    documents = list(islice(with_demo_metadata(read_corpus(dataset("cranfield"))), 400))
    # A keyword field present in one shard only, and a list field.
    documents = [Document(d.id, d.text, d.title,
                          {**d.metadata, "tags": ["a", "b"] if i % 3 else ["c"],
                           **({"desk": "north"} if i < 100 else {})})
                 for i, d in enumerate(documents)]
    vectors = np.random.default_rng(0).normal(size=(len(documents), INFO.dim))
    return documents, (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def sources(documents: list[Document], vectors: np.ndarray, shards: int) -> list[GivenRows]:
    return [GivenRows(documents[a:b], vectors[a:b])
            for a, b in shard_ranges(len(documents), shards)]


def shard_files(build: Path) -> dict[str, bytes]:
    """Every file of every shard but the manifests and their sha256 (they name their own
    build id and time)."""
    return {str(p.relative_to(build)): p.read_bytes()
            for p in sorted((build / "shards").rglob("*"))
            if p.is_file() and not p.name.startswith("manifest.json")}


def test_streamed_shards_equal_the_one_process_sharded_build(corpus, tmp_path):
    documents, vectors = corpus
    whole = build_index(documents, tmp_path / "whole", vectors=vectors, encoder_info=INFO,
                        shards=3, progress=False)
    streamed = build_streamed(sources(documents, vectors, 3), tmp_path / "streamed",
                              encoder_info=INFO, run=run_in_processes(2))
    expected, got = shard_files(whole.path), shard_files(streamed.path)
    assert any(name.endswith("bm25/impacts.npy") for name in expected)
    assert got.keys() == expected.keys()
    assert [name for name in expected if got[name] != expected[name]] == []
    (_, mine), (_, theirs) = read_layout(streamed.path), read_layout(whole.path)
    assert mine.model_dump(exclude={"shards"}) == theirs.model_dump(exclude={"shards"})
    assert [(e.start, e.stop) for e in mine.shards] == [(e.start, e.stop) for e in theirs.shards]
    assert streamed.n_docs == len(documents) and len(streamed.part_peak_rss_bytes) == 3
    with (Retriever.load(tmp_path / "whole", CONFIG) as a,
          Retriever.load(tmp_path / "streamed", CONFIG) as b):
        for query, vector in zip(QUERIES, vectors, strict=False):
            for filters in (None, {"department": "oncology"}, {"desk": "north"}):
                hits = [[(h.doc_id, h.score) for h in r.search(query, filters, k=10,
                                                          query_vector=vector).hits]
                        for r in (a, b)]
                assert hits[0] == hits[1], (query, filters)


def streamed_as_whole(documents: list[Document], vectors: np.ndarray, tmp_path: Path) -> Any:
    """The streamed build of ``documents`` in 2 shards, checked file for file against the
    one-process sharded build's."""
    whole = build_index(documents, tmp_path / "whole", vectors=vectors, encoder_info=INFO,
                        shards=2, progress=False)
    streamed = build_streamed(sources(documents, vectors, 2), tmp_path / "streamed",
                              encoder_info=INFO)
    assert shard_files(streamed.path) == shard_files(whole.path)
    return streamed


def test_a_field_of_dates_in_one_shard_and_words_in_another_is_a_keyword_field(corpus,
                                                                                tmp_path):
    documents, vectors = corpus
    documents = [Document(d.id, d.text, d.title,
                          {**d.metadata, "when": "2020-01-02" if i < 200 else f"week {i % 7}"})
                 for i, d in enumerate(documents)]
    streamed_as_whole(documents, vectors, tmp_path)
    with Retriever.load(tmp_path / "streamed", CONFIG) as retriever:
        hits = retriever.search("flow", {"when": "2020-01-02"}, k=400,
                                query_vector=vectors[0]).hits
        assert hits and {h.metadata["when"] for h in hits} == {"2020-01-02"}


def test_a_shard_holding_only_empty_lists_takes_the_other_shards_kind(corpus, tmp_path):
    """An empty list holds no value: a shard whose field held only [] made a number field
    "mixed" and a date field a keyword field, where the one-process build kept their kinds
    (and an only-[] field stays a keyword field, as there)."""
    documents, vectors = corpus
    values = [{"n": 5, "when": "2020-01-02", "tags": []}, {"n": [], "when": [], "tags": []}]
    documents = [Document(d.id, d.text, d.title, {**d.metadata, **values[i >= 200]})
                 for i, d in enumerate(documents)]
    streamed = streamed_as_whole(documents, vectors, tmp_path)
    kinds = read_manifest(streamed.path).metadata_fields
    assert {f: kinds[f] for f in ("n", "when", "tags")} == \
        {"n": "number", "when": "date", "tags": "keyword"}


def test_int8_shards_hold_the_whole_builds_codes_and_cosines(corpus, tmp_path):
    """Every layout quantizes by the whole collection's bounds: a shard's own bounds rounded
    its rows otherwise, and changed the top 10 of whole-build searches."""
    documents, vectors = corpus
    config = BuildConfig(vector_dtype="int8")
    int8 = INFO.model_copy(update={"vector_dtype": "int8"})
    build_index(documents, tmp_path / "whole", vectors=vectors, encoder_info=int8,
                config=config, progress=False, dense="exact")
    build_index(documents, tmp_path / "sharded", vectors=vectors, encoder_info=int8,
                config=config, shards=3, progress=False, dense="exact")
    build_streamed(sources(documents, vectors, 3), tmp_path / "streamed", encoder_info=int8,
                   config=config, dense="exact")
    whole = VectorStore.load(resolve_build_dir(tmp_path / "whole") / "vectors")
    for name in ("sharded", "streamed"):
        parts = [VectorStore.load(p / "vectors") for p in build_parts(tmp_path / name)]
        assert np.array_equal(np.concatenate([p.data for p in parts]), whole.data), name
        assert all(np.array_equal(p.scale, whole.scale) and np.array_equal(p.low, whole.low)
                   for p in parts), name
    with (Retriever.load(tmp_path / "whole", CONFIG) as a,
          Retriever.load(tmp_path / "sharded", CONFIG) as b,
          Retriever.load(tmp_path / "streamed", CONFIG) as c):
        for query, vector in zip(QUERIES, vectors, strict=False):
            want = [(h.doc_id, h.vector_score) for h in a.search(query, k=10,
                                                                 query_vector=vector).hits]
            for retriever in (b, c):
                assert [(h.doc_id, h.vector_score) for h in retriever.search(
                    query, k=10, query_vector=vector).hits] == want, query


def test_a_document_id_in_two_shards_is_refused_naming_it(corpus, tmp_path):
    documents, vectors = corpus
    documents = [*documents[:399], Document(documents[5].id, "a copy", "", {})]
    with pytest.raises(CorpusError, match=rf"duplicate document id '{documents[5].id}' "
                                          r"\(in shards \[0, 1\]\)"):
        build_streamed(sources(documents, vectors, 2), tmp_path, encoder_info=INFO)
    assert not (tmp_path / "CURRENT").exists()


def test_a_build_directory_its_builds_or_a_file_is_refused_as_the_root(corpus, tmp_path):
    """build_streamed skipped the root check build_index makes: a live build directory took a
    root nested in it (its files changed under it), and a file was a raw FileExistsError."""
    documents, vectors = corpus
    root = tmp_path / "root"
    build_index(documents[:40], root, vectors=vectors[:40], encoder_info=INFO, progress=False,
                dense="exact")
    build = resolve_build_dir(root)
    before = sorted(p.relative_to(build) for p in build.rglob("*"))
    (tmp_path / "a_file").write_text("not a directory")
    for target, why in ((build, "is a build directory"), (root / "builds", "is the builds"),
                        (tmp_path / "a_file", "is a file")):
        with pytest.raises(CorpusError, match=why):
            build_streamed(sources(documents[40:80], vectors[40:80], 2), target,
                           encoder_info=INFO, dense="exact")
    assert sorted(p.relative_to(build) for p in build.rglob("*")) == before


def test_a_field_of_numbers_in_one_shard_and_words_in_another_is_refused(corpus, tmp_path):
    documents, vectors = corpus
    documents = [Document(d.id, d.text, d.title,
                          {"rank": i if i < 200 else f"r{i}"}) for i, d in enumerate(documents)]
    with pytest.raises(CorpusError, match="'rank' holds keyword values in shard 1, number "
                                          "values in shard 0"):
        build_streamed(sources(documents, vectors, 2), tmp_path, encoder_info=INFO)


def test_a_source_that_changes_between_its_reads_is_refused_and_nothing_is_left(corpus,
                                                                                tmp_path):
    documents, vectors = corpus
    parts = sources(documents, vectors, 2)
    with pytest.raises(CorpusError, match="shard 1's source gave other documents on its "
                                          "second read"):
        build_streamed([parts[0], Changing(parts[1])], tmp_path, encoder_info=INFO)
    assert not (tmp_path / "CURRENT").exists()
    assert not any((tmp_path / "builds").iterdir())


@pytest.mark.parametrize(("shape", "message"), [
    ((0, 16), "shard 0's source gave no documents"),
    ((10, 8), r"vectors of shape \(10, 8\) for 10 documents"),
    ((9, 16), r"vectors of shape \(9, 16\) for 10 documents"),
])
def test_a_source_with_no_documents_or_wrong_vectors_is_refused(corpus, tmp_path, shape,
                                                                 message):
    documents = corpus[0][:shape[0] and 10]
    vectors = np.zeros(shape, dtype=np.float32)
    with pytest.raises(CorpusError, match=message):
        build_streamed([GivenRows(documents, vectors)], tmp_path, encoder_info=INFO)


def test_a_source_with_a_non_finite_vector_is_refused(corpus, tmp_path):
    documents, vectors = corpus[0][:10], corpus[1][:10].copy()
    vectors[7, 3] = np.inf
    with pytest.raises(CorpusError, match=rf"NaN or infinity \(row 7, document "
                                          rf"'{documents[7].id}'\)"):
        build_streamed([GivenRows(documents, vectors)], tmp_path, encoder_info=INFO)
    assert not (tmp_path / "builds").exists()


@pytest.mark.parametrize(("bad", "message"), [
    (Document(" ", "blank id"), "shard 0: document 3 has a blank id"),
    (Document(7, "an int id"), r"shard 0: document 3 \(7\): its id is a int"),  # type: ignore[arg-type]
    (Document("x", None), "shard 0: document 3 .*its text is a NoneType"),  # type: ignore[arg-type]
])
def test_a_shard_source_is_checked_as_a_whole_build_checks_its_documents(corpus, tmp_path,
                                                                          bad, message):
    """A blank id was built (no write could update or delete it); an int id or a None text
    was an AttributeError deep in the build."""
    documents = [*corpus[0][:3], bad, *corpus[0][4:10]]
    with pytest.raises(CorpusError, match=message):
        build_streamed([GivenRows(documents, corpus[1][:10])], tmp_path, encoder_info=INFO)


def run_twice(task, jobs):
    """Every task run once more after it finished, as Ray runs again a task whose worker it
    killed (out of memory) after it had written part of its shard."""
    for job in jobs:
        task(job)
    return [task(job) for job in jobs]


def test_a_shard_task_run_again_writes_its_shard_anew(corpus, tmp_path):
    documents, vectors = corpus
    once = build_streamed(sources(documents, vectors, 2), tmp_path / "once", encoder_info=INFO)
    twice = build_streamed(sources(documents, vectors, 2), tmp_path / "twice",
                           encoder_info=INFO, run=run_twice)
    assert shard_files(twice.path) == shard_files(once.path)


def test_the_writes_can_run_on_a_runner_of_their_own(corpus, tmp_path):
    """Surveys on one runner, writes on another (as a host fitting one write at a time runs
    its surveys side by side): each task goes to its runner, and the shards are the same."""
    documents, vectors = corpus
    ran: dict[str, list[str]] = {"surveys": [], "writes": []}

    def runner(name):
        def run(task, jobs):
            ran[name].append(task.__name__)
            return run_here(task, jobs)
        return run

    split = build_streamed(sources(documents, vectors, 2), tmp_path / "split",
                           encoder_info=INFO, run=runner("surveys"), run_writes=runner("writes"))
    assert ran == {"surveys": ["survey_shard"], "writes": ["write_shard"]}
    one = build_streamed(sources(documents, vectors, 2), tmp_path / "one", encoder_info=INFO)
    assert shard_files(split.path) == shard_files(one.path)


def test_a_write_acknowledged_while_the_sources_are_surveyed_is_kept(corpus, tmp_path):
    """The sources are the corpus export: a write acknowledged after the streamed build
    started reading them is applied on top of it. The log was sealed only after the surveys
    (hours at scale), so such a write counted as superseded by the export, and was lost."""
    from indexes.writer import IndexWriter

    documents, vectors = corpus
    build_streamed(sources(documents[:200], vectors[:200], 2), tmp_path, encoder_info=INFO)
    IndexWriter(tmp_path).close()  # the root has a log

    def write_then_survey(task, jobs):
        with IndexWriter(tmp_path) as writer:
            writer.upsert([Document("during", "written while the build surveyed")],
                          vectors=vectors[:1])
        return run_here(task, jobs)

    report = build_streamed(sources(documents[:200], vectors[:200], 2), tmp_path,
                            encoder_info=INFO, run=write_then_survey,
                            run_writes=run_here)
    assert report.live_writes is not None and report.live_writes.records == 0
    with Retriever.load(tmp_path, CONFIG) as retriever:
        assert retriever.get_documents(["during"])[0] is not None
