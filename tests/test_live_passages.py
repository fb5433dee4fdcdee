"""Live writes on a passage build act on whole documents: an upsert replaces every passage of
the document, a delete removes all of them, delta passages carry their parent, position and
offsets (grouping, ``context`` and hydration over base + delta), and compaction publishes the
passage build a fresh build of the live corpus would be.

Real model, the long documents of ``passage_fixtures`` (a copy of their passage build, so
the session's root is never written to).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors
from passage_fixtures import CAR_QUERY, TARGET

from indexes import BuildConfig, Document, PassageConfig, build_index
from indexes.errors import InvalidWriteError, PublishError
from indexes.manifest import CURRENT, read_manifest, resolve_build_dir
from indexes.publish import publish_build
from indexes.wal import read_all
from indexes.wal.split import split, token_counter
from indexes.writer import IndexWriter
from retrieval import Retriever

VOLCANO = ("Volcanic ash from the eruption in Iceland grounded flights across Europe for six "
           "days. Airlines lost several hundred million euros while the plume drifted south.")
VOLCANO_QUERY = "eruption ash cloud closed European airspace"
GONE = "long-5"
SMALL = PassageConfig(max_tokens=64, overlap_tokens=8)
LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}
QUERIES = ["protein expression in cells", "cancer risk", VOLCANO_QUERY, CAR_QUERY,
           "immune response to infection"]


@pytest.fixture
def root(passage_roots, tmp_path) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(passage_roots("passages"), copy)
    return copy


def changed_target(long_docs: list[Document]) -> Document:
    """``TARGET`` with a new first paragraph and without its car paragraph: every passage
    moves (no old passage sits at its old offsets in the new text)."""
    old = next(d for d in long_docs if d.id == TARGET)
    body = old.text[:old.text.rindex("\n\n")]
    return Document(TARGET, f"{VOLCANO}\n\n{body}", old.title, old.metadata)


def all_hits(retriever: Retriever, query: str, **options):
    return retriever.search(query, k=200, candidates=200, **options).hits


def test_an_upsert_replaces_every_passage_of_its_document(root, long_docs, encoder):
    new = changed_target(long_docs)
    n_new = len(split([new], token_counter(encoder), PassageConfig(max_tokens=256))[1][0])
    with Retriever.load(root, LIVE, encoder=encoder) as retriever:
        assert TARGET in [h.doc_id for h in retriever.search(CAR_QUERY, k=3,
                                                             group_by="document").hits]
        with IndexWriter(root, encoder=encoder) as writer:
            writer.upsert([new])
        assert retriever.refresh()
        grouped = retriever.search(CAR_QUERY, k=3, group_by="document").hits
        assert TARGET not in [h.doc_id for h in grouped]  # its old car paragraph is gone
        for options in ({}, {"group_by": "document"}):
            first = retriever.search(VOLCANO_QUERY, k=3, context=1, **options).hits[0]
            assert first.doc_id == TARGET and first.passage == 0 and first.start == 0
            assert first.context is not None
            assert first.context.text == new.text[first.context.start:first.context.end]
        for query in QUERIES:
            hits = [h for h in all_hits(retriever, query) if h.doc_id == TARGET]
            positions = [h.passage for h in hits]
            assert len(set(positions)) == len(positions) and set(positions) <= set(range(n_new))
            for hit in hits:  # every hit of it is a new passage, at its offsets in the new text
                assert hit.text == new.text[hit.start:hit.end]
                assert hit.title == new.title and hit.metadata == new.metadata


def test_a_delete_removes_every_passage_of_its_document(root, encoder):
    with Retriever.load(root, LIVE, encoder=encoder) as retriever:
        assert any(h.doc_id == GONE for q in QUERIES for h in all_hits(retriever, q))
        with IndexWriter(root, encoder=encoder) as writer:
            writer.delete([GONE])
        assert retriever.refresh()
        for query in QUERIES:
            for options in ({}, {"group_by": "document"}):
                assert GONE not in [h.doc_id for h in all_hits(retriever, query, **options)]


def ranked(retriever: Retriever, query: str, **options) -> list[tuple]:
    return [(h.doc_id, h.passage, h.start, h.end, h.text, h.score)
            for h in retriever.search(query, k=10, **options).hits]


def assert_same_results(live: Retriever, fresh: Retriever) -> None:
    for query in QUERIES:
        for options in ({}, {"group_by": "document", "context": 1}):
            got, want = ranked(live, query, **options), ranked(fresh, query, **options)
            assert [g[:5] for g in got] == [w[:5] for w in want], (query, options)
            np.testing.assert_allclose([g[5] for g in got], [w[5] for w in want], atol=1e-5)


def test_served_and_compacted_results_equal_a_fresh_passage_build(root, long_docs, encoder,
                                                                  tmp_path):
    new = changed_target(long_docs)
    extra = Document("long-new", f"{VOLCANO}\n\n{long_docs[0].text}", "Ash", {"group": 1})
    with IndexWriter(root, encoder=encoder) as writer:
        writer.upsert([new, extra])
        writer.delete([GONE])
        live_docs = ([d for d in long_docs if d.id not in {TARGET, GONE}] + [new, extra])
        build_index(live_docs, tmp_path / "fresh", encoder=encoder, progress=False,
                    config=BuildConfig(passages=PassageConfig(max_tokens=256)))
        with Retriever.load(tmp_path / "fresh", LIVE, encoder=encoder) as fresh, \
                Retriever.load(root, LIVE, encoder=encoder) as live:
            assert_same_results(live, fresh)  # base + delta
            report = writer.compact()
            assert report.records_folded == 2 and report.n_docs == fresh.snapshot.manifest.n_docs
            live.reload()
            assert live.snapshot.build_id == report.build_id
            assert_same_results(live, fresh)  # the compacted build
            assert live.snapshot.manifest.passages == fresh.snapshot.manifest.passages


def test_vectors_given_to_a_passage_build_are_one_per_passage(root, long_docs, encoder):
    with IndexWriter(root, encoder=encoder) as writer:
        with pytest.raises(InvalidWriteError, match="one 384-dimensional row per passage"):
            writer.upsert([changed_target(long_docs)], vectors=np.zeros((1, 384), np.float32))
        assert writer.last_seq == 0 and read_all(root) == []


def test_records_written_for_whole_documents_never_serve_on_a_passage_build(tmp_path,
                                                                           dataset):
    """Pending upserts hold one vector per document, not per passage. A passage build from an
    export supersedes them (they are never applied to it); a build that carries them (given
    their log position, then flipped) is refused by compaction, by a new process and by a
    serving process's reload."""
    docs = scifact_docs(dataset("scifact"), 20)
    build_small(tmp_path, docs)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([docs[0]], vectors=unit_vectors(1, 5))
    whole = resolve_build_dir(tmp_path)
    rows, _ = split(docs, token_counter(None), SMALL)
    vectors = unit_vectors(len(rows), 1)

    def build(**options):
        return build_index(docs, tmp_path, vectors=vectors, encoder_info=INFO,
                           config=BuildConfig(passages=SMALL), progress=False, **options)

    staged = build(publish=False)
    assert staged.live_writes is not None and staged.live_writes.records == 1
    assert read_manifest(staged.path).log_seq == 1  # the upsert is superseded, not applied
    assert resolve_build_dir(tmp_path) == whole
    carrying = build(publish=False, log_seq=0).build_id  # given its log position
    with pytest.raises(PublishError, match="another kind of build"):
        publish_build(tmp_path, carrying)
    assert resolve_build_dir(tmp_path) == whole  # the live build serves on
    with Retriever.load(tmp_path, LIVE) as serving:  # flipped by hand, past the publish
        (tmp_path / CURRENT).write_text(f"{carrying}\n")
        assert not serving.reload() and serving.snapshot.manifest.passages is None
        assert "another kind of build" in serving.reload_events[-1]["error"]
    with IndexWriter(tmp_path) as writer, pytest.raises(InvalidWriteError,
                                                        match="another kind of build"):
        writer.compact()
    assert len(read_all(tmp_path)) == 1  # the record is kept, not dropped
    with pytest.raises(InvalidWriteError, match="another kind of build"):
        Retriever.load(tmp_path, LIVE)


def test_a_write_logged_while_a_passage_build_ran_keeps_it_from_going_live(tmp_path, dataset):
    """A writer of the live build of whole documents logs an upsert after the passage
    build sealed the log: the build cannot apply it, so its publish is refused."""
    docs = scifact_docs(dataset("scifact"), 20)
    build_small(tmp_path, docs)
    rows, _ = split(docs, token_counter(None), SMALL)
    staged = build_index(docs, tmp_path, vectors=unit_vectors(len(rows), 1), encoder_info=INFO,
                         config=BuildConfig(passages=SMALL), progress=False, publish=False)
    with IndexWriter(tmp_path) as writer:  # during the build, as far as the log can tell
        writer.upsert([docs[0]], vectors=unit_vectors(1, 5))
    with pytest.raises(PublishError, match="another kind of build"):
        publish_build(tmp_path, staged.build_id)
    with Retriever.load(tmp_path, LIVE) as serving:
        assert serving.snapshot.manifest.passages is None and serving.applied_seq == 1


def test_a_writer_opened_before_a_passage_build_went_live_splits_as_it_does(tmp_path,
                                                                           dataset):
    """The writer was opened on the build of whole documents; by its next write a passage
    build is live: the upsert is split as that build splits (it was logged whole, and no
    reader could apply it)."""
    docs = scifact_docs(dataset("scifact"), 20)
    build_small(tmp_path, docs)
    with IndexWriter(tmp_path) as stale:
        rows, _ = split(docs, token_counter(None), SMALL)
        build_index(docs, tmp_path, vectors=unit_vectors(len(rows), 1), encoder_info=INFO,
                    config=BuildConfig(passages=SMALL), progress=False)
        stale.upsert([Document("fresh", "zebrafish telomerase in hibernation")],
                     vectors=unit_vectors(1, 5))
    assert read_all(tmp_path)[-1].passages  # its offsets, as a passage build's rows
    with Retriever.load(tmp_path, LIVE) as serving:
        assert serving.get_documents(["fresh"])[0] is not None


def test_records_written_for_passages_never_serve_on_a_build_of_whole_documents(tmp_path,
                                                                                dataset):
    """The reverse: a build of whole documents from an export supersedes a logged passage
    upsert (vectors per passage): it publishes and serves; the record stays in the log for
    the rollback target, the passage build it was written for."""
    docs = scifact_docs(dataset("scifact"), 20)
    rows, _ = split(docs, token_counter(None), SMALL)
    build_index(docs, tmp_path, vectors=unit_vectors(len(rows), 1), encoder_info=INFO,
                config=BuildConfig(passages=SMALL), progress=False)
    with IndexWriter(tmp_path) as writer:
        n_passages = len(split([docs[0]], token_counter(None), SMALL)[0])
        writer.upsert([docs[0]], vectors=unit_vectors(n_passages, 5))
    passage_build = resolve_build_dir(tmp_path)
    build_small(tmp_path, docs)
    assert resolve_build_dir(tmp_path) != passage_build
    assert read_all(tmp_path, after=read_manifest(resolve_build_dir(tmp_path)).log_seq) == []
    with Retriever.load(tmp_path, LIVE) as serving:
        assert serving.snapshot.manifest.passages is None and serving.applied_seq == 1


def word_level_tokenizer(directory: Path, texts: list[str]) -> Path:
    """A tokenizer of whole words: it counts fewer tokens than the packaged model's word
    pieces, so it cuts passages elsewhere."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for text in texts for w in text.split()})
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                           unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_a_build_cut_with_a_given_tokenizer_is_written_to_and_compacted_with_it(tmp_path,
                                                                              dataset):
    from indexes.errors import MissingArtifactError
    from indexes.passages import TokenCounter

    docs = scifact_docs(dataset("scifact"), 20)
    long = Document("long", " ".join(d.text for d in docs[:6]))
    words = word_level_tokenizer(tmp_path / "words", [d.content for d in [*docs, long]])
    config = PassageConfig(max_tokens=64, overlap_tokens=8, tokenizer=str(words))
    counter = TokenCounter.for_model(words)
    rows, _ = split(docs, counter, config)
    root = tmp_path / "root"
    build_index(docs, root, vectors=unit_vectors(len(rows), 1), encoder_info=INFO,
                config=BuildConfig(passages=config), progress=False)
    assert read_manifest(resolve_build_dir(root)).passages.tokenizer == str(words.resolve())
    (passages,) = split([long], counter, config)[1]
    assert len(passages) != len(split([long], token_counter(None), config)[1][0])
    with IndexWriter(root) as writer:
        writer.upsert([long], vectors=unit_vectors(len(passages), 2))  # one row a passage
        assert list(read_all(root)[-1].passages[0]) == list(passages)
        report = writer.compact()
    compacted = read_manifest(resolve_build_dir(root))
    assert compacted.build_id == report.build_id
    assert compacted.passages.tokenizer == str(words.resolve())
    assert compacted.passages.n_passages == len(rows) + len(passages)
    shutil.rmtree(words)
    with IndexWriter(root) as writer, pytest.raises(MissingArtifactError, match="words"):
        writer.upsert([long], vectors=unit_vectors(len(passages), 3))
