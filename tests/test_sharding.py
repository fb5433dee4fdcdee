"""Shard builds and sharded search: global BM25 statistics, one manifest and one flip, and
results equal to the unsharded index's on every SciFact test query (in-process runtime)."""

from __future__ import annotations

import hashlib
import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from indexes.ann import ExactDense
from indexes.bm25 import Corrected
from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.errors import ArtifactError, CorruptArtifactError
from indexes.fan_out import each_part, fans_out, search_alone
from indexes.manifest import CURRENT, EncoderInfo, read_manifest
from indexes.publish import publish_build
from indexes.sharding import (
    SHARDS_FILE,
    ShardCountError,
    read_layout,
    shard_ranges,
)
from retrieval import Retriever, RetrieverConfig
from retrieval.cli import main as cli
from retrieval.features import CallableSource, Feature, FeatureView, LocalStore, materialize
from retrieval.loaded_build import LoadedBuild
from retrieval.sharding import ShardedBuild, whole

FILTER = {"department": {"in": ["cardiology", "oncology"]}, "year": {"gte": 2005}}
# ~70 allowed documents: BM25 finds fewer than the guardrail's floor, the dense leg adds rows.
TIGHT = {"department": "cardiology", "doc_type": "review", "year": {"gte": 2015}}
CONFIG = {"cache": {"backend": "none"}}


@pytest.fixture(scope="module")
def scifact_shards(scifact_exact, scifact_sharded, encoder):
    """(unsharded retriever, {S: sharded retriever}, query texts, query vectors)."""
    unsharded, texts, vectors = scifact_exact
    sharded = {count: Retriever.load(scifact_sharded(count), CONFIG, encoder=encoder)
               for count in (2, 4)}
    for retriever in sharded.values():
        assert isinstance(retriever.snapshot, ShardedBuild)
        assert all(type(s.dense) is ExactDense for s in retriever.snapshot.shards)
    yield unsharded, sharded, texts, vectors
    for retriever in sharded.values():
        retriever.close()


@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("filters", [None, FILTER, TIGHT], ids=["all", "filtered", "tight"])
def test_sharded_results_equal_unsharded_on_scifact(scifact_shards, count, filters):
    unsharded, sharded, texts, vectors = scifact_shards
    assert len(texts) == 300
    fired = 0
    for text, vector in zip(texts, vectors, strict=True):
        want = unsharded.search(text, filters, 10, query_vector=vector)
        got = sharded[count].search(text, filters, 10, query_vector=vector)
        assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits], text
        assert (got.candidates, got.allowed) == (want.candidates, want.allowed), text
        for a, b in zip(got.hits, want.hits, strict=True):
            # Fused scores are normalized over the candidates. The exact dense leg's cosines
            # come from BLAS over matrices of another size (a shard's) and may differ in the
            # last bit; twice in full-suite runs (never alone) a near-tie at the dense cut
            # swapped one candidate, moving a fused score by 2.7e-5.
            assert a.score == pytest.approx(b.score, abs=1e-4), (text, a.doc_id)
            assert a.bm25_score == pytest.approx(b.bm25_score, abs=1e-6)
            assert a.vector_score == pytest.approx(b.vector_score, abs=1e-6)
            assert a.text == b.text and a.metadata == b.metadata
        fired += any(h.bm25_score == 0 for h in want.hits)  # a row only the dense leg found
    if filters is TIGHT:
        assert fired > 0  # the guardrail's sharded path was exercised


def test_shards_searched_at_once_in_threads_equal_the_whole_build(scifact_shards, monkeypatch):
    """A lone search's shards run in the fan-out's threads (the postings floor at 0, as 1M
    passages' queries reach it); four callers at once keep to their own threads: the same
    hits as one index either way."""
    monkeypatch.setattr(whole, "THREADS_FROM_POSTINGS", 0)
    unsharded, sharded, texts, vectors = scifact_shards
    pairs = list(zip(texts, vectors, strict=True))
    want = [unsharded.search(t, FILTER, 10, query_vector=v) for t, v in pairs]
    alone = [sharded[4].search(t, FILTER, 10, query_vector=v) for t, v in pairs]
    with ThreadPoolExecutor(4) as callers:
        together = list(callers.map(
            lambda p: sharded[4].search(p[0], FILTER, 10, query_vector=p[1]), pairs))
    for got in (alone, together):
        for a, b in zip(got, want, strict=True):
            assert [h.doc_id for h in a.hits] == [h.doc_id for h in b.hits]
            assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits],
                                                              abs=1e-6)


def test_the_fan_out_keeps_shard_order_and_raises_a_shards_error():
    calls = [lambda i=i: i * i for i in range(5)]
    assert each_part(calls, parallel=True) == each_part(calls, parallel=False) == \
        [0, 1, 4, 9, 16]

    def broken() -> int:
        raise ValueError("shard 2 failed")

    with pytest.raises(ValueError, match="shard 2 failed"):
        each_part([calls[0], calls[1], broken], parallel=True)


def test_the_parts_of_a_fan_out_fan_out_no_further():
    """A part already runs beside others (a shard, a BM25 row range): neither the caller's
    part nor the pool's may split again, and the caller may once the parts are done."""
    try:
        search_alone(True)
        assert fans_out()  # this host has two cores
        assert each_part([fans_out] * 3, parallel=True) == [False, False, False]
        assert fans_out()
        search_alone(False)
        assert not fans_out() and each_part([fans_out] * 2, parallel=True) == [False, False]
    finally:
        search_alone(True)


def test_the_ray_layout_reuses_fetched_scores_only_for_the_same_weighted_terms():
    """Explain asks each term's BM25 scores unweighted and weighs them itself; the Ray layout
    took "alpha" for the fetched ``Corrected("alpha", 0.7)`` (equal as strings) and answered
    the weighted scores: a one-word corrected query's explanation was weighed twice."""
    pytest.importorskip("ray")
    from retrieval.sharding.ray_parts import same_terms

    corrected = Corrected("alpha", 0.7)
    assert not same_terms(["alpha"], [corrected])
    assert not same_terms([Corrected("alpha", 0.5)], [corrected])
    assert same_terms([Corrected("alpha", 0.7)], [corrected])
    assert same_terms(["alpha", "beta"], ["alpha", "beta"])
    assert not same_terms(["alpha"], ["alpha", "beta"])


def test_union_policy_and_minmax_fusion_also_equal(scifact_shards, encoder):
    unsharded, sharded, texts, vectors = scifact_shards
    config = {**CONFIG, "candidate_policy": "union", "fusion": "minmax", "candidates": 50}
    plain = Retriever(unsharded.snapshot, unsharded.config.model_copy(
        update={"candidate_policy": "union", "fusion": "minmax", "candidates": 50}), encoder)
    other = Retriever.load(sharded[4].snapshot.path, config, encoder=encoder)
    for text, vector in list(zip(texts, vectors, strict=True))[:60]:
        want = plain.search(text, FILTER, 10, query_vector=vector)
        got = other.search(text, FILTER, 10, query_vector=vector)
        assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits]
        assert [h.score for h in got.hits] == pytest.approx([h.score for h in want.hits],
                                                            abs=1e-6)
    plain.close()
    other.close()


def test_every_bm25_score_equals_the_unsharded_one(scifact_shards):
    """Global N, df and avgdl: a shard's postings are the whole index's, bit for bit."""
    unsharded, sharded, texts, _ = scifact_shards
    whole = unsharded.snapshot
    for text in texts[:50]:
        tokens = whole.analyzer(text)
        rows, scores = whole.bm25.score_touched(tokens)
        expected = dict(zip(rows.tolist(), scores.tolist(), strict=True))
        found = {}
        for shard, start in zip(sharded[4].snapshot.shards,
                                sharded[4].snapshot.bm25.owners.bounds, strict=False):
            local, local_scores = shard.bm25.score_touched(tokens)
            found.update(zip((local + start).tolist(), local_scores.tolist(), strict=True))
        assert found == expected
        rows, scores = sharded[4].snapshot.bm25.score_touched(tokens)
        assert dict(zip(rows.tolist(), scores.tolist(), strict=True)) == expected


def test_sharded_search_encodes_the_query_itself(scifact_shards):
    unsharded, sharded, texts, _ = scifact_shards
    got = sharded[2].search(texts[0], k=5)
    assert got.cache.embedding == "off" and len(got.hits) == 5  # no cache configured
    assert got.build_id == sharded[2].build_id


def _tiny_docs(n: int) -> list[Document]:
    return [Document(f"d{i}", f"alpha beta {'gamma ' * (i % 4)}doc{i}",
                     metadata={"group": f"g{i % 3}"}) for i in range(n)]


INFO = EncoderInfo(encoder_id="test:precomputed:fp32:8", model="test", dim=8,
                   vector_dtype="float32")


def _tiny_build(root, shards: int, publish: bool = True, n: int = 30):
    vectors = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
    return build_index(_tiny_docs(n), root, shards=shards, vectors=vectors,
                               encoder_info=INFO, progress=False, publish=publish)


def test_one_manifest_names_the_shards_and_one_flip_publishes_them(tmp_path):
    first = _tiny_build(tmp_path, 3)
    directory, layout = read_layout(tmp_path)
    assert directory == first.path and [e.start for e in layout.shards] == [0, 10, 20]
    files = read_manifest(directory).files
    assert set(files) == {SHARDS_FILE, *(f"shards/{e.name}/manifest.json"
                                         for e in layout.shards)}
    staged = _tiny_build(tmp_path, 3, publish=False)
    assert (tmp_path / CURRENT).read_text().strip() == first.build_id
    publish_build(tmp_path, staged.build_id)
    with Retriever.load(tmp_path, CONFIG) as retriever:
        assert retriever.build_id == staged.build_id
        assert retriever.search("gamma", k=3, query_vector=np.ones(8, np.float32)).hits


def test_a_changed_shard_file_is_refused_naming_it(tmp_path):
    report = _tiny_build(tmp_path, 2)
    impacts = report.path / "shards" / "shard-001" / "bm25" / "impacts.npy"
    impacts.write_bytes(impacts.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CorruptArtifactError, match="shard-001"):
        Retriever.load(tmp_path, CONFIG)


def test_one_front_door_opens_whole_and_sharded_builds(tmp_path):
    """``Retriever.load`` opens both; a whole build's parts are never asked for shards, and the
    lower-level loaders still refuse the other layout naming the way in."""
    _tiny_build(tmp_path / "sharded", 2)
    vectors = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    build_index(_tiny_docs(30)[:6], tmp_path / "plain", vectors=vectors, encoder_info=INFO,
                progress=False)
    with Retriever.load(tmp_path / "sharded", CONFIG) as sharded:
        assert len(sharded.snapshot.shards) == 2
        assert sharded.search("gamma", k=30, query_vector=np.ones(8, np.float32)).hits
    with Retriever.load(tmp_path / "plain", CONFIG) as plain:
        assert not isinstance(plain.snapshot, ShardedBuild)
    with pytest.raises(ArtifactError, match="Retriever.load"):
        LoadedBuild.load(tmp_path / "sharded")
    with pytest.raises(ArtifactError, match="not a sharded build"):
        ShardedBuild.load(tmp_path / "plain")


@pytest.mark.parametrize("count", [0, -1, 31, True])
def test_impossible_shard_counts_are_refused(tmp_path, count):
    with pytest.raises(ShardCountError, match="shard"):
        _tiny_build(tmp_path, count)
    with pytest.raises(ShardCountError):
        shard_ranges(5, count if count != 31 else 6)


VIEW = FeatureView(name="popularity", features=(Feature(name="clicks", dtype="float32",
                                                        default=0.0),))


def test_sharded_features_equal_unsharded_features(scifact_shards, tmp_path):
    """A nightly view and recency re-score the merged candidates at the router exactly as the
    unsharded pipeline re-scores its fused candidates."""
    unsharded, sharded, texts, vectors = scifact_shards
    ids = unsharded.snapshot.docs.all_ids()
    store = LocalStore(tmp_path / "features")
    clicks = [{"doc_id": d, "clicks": float(int(hashlib.sha256(d.encode()).hexdigest()[:4], 16))}
              for d in ids]
    materialize(VIEW, CallableSource(lambda: clicks), store, progress=False)
    # "year" holds small integers: as epoch seconds with a ~9 s half-life, years apart differ.
    settings = {**CONFIG, "features": [{"view": "popularity", "weights": {"clicks": 0.4},
                                        "normalization": "minmax"}],
                "recency": {"field": "year", "weight": 0.3, "half_life_days": 1e-4}}
    plain = Retriever(unsharded.snapshot, RetrieverConfig(**settings), None,
                      feature_store=store)
    moved = 0
    for count in (2, 4):
        with Retriever.load(sharded[count].snapshot.path, settings,
                            feature_store=store) as featured:
            for text, vector in list(zip(texts, vectors, strict=True))[:40]:
                want = plain.search(text, FILTER, 10, query_vector=vector)
                got = featured.search(text, FILTER, 10, query_vector=vector)
                assert [h.doc_id for h in got.hits] == [h.doc_id for h in want.hits], text
                assert [h.score for h in got.hits] == pytest.approx(
                    [h.score for h in want.hits], abs=1e-6)
                assert [h.features for h in got.hits] == [h.features for h in want.hits]
                assert got.feature_snapshot_id == want.feature_snapshot_id is not None
                assert got.features_available is want.features_available is True
                base = unsharded.search(text, FILTER, 10, query_vector=vector)
                moved += [h.doc_id for h in base.hits] != [h.doc_id for h in want.hits]
    plain.close()
    assert moved > 0  # the features changed rankings: the comparison is not of plain searches


def test_cli_builds_shards_published_by_one_flip(dataset, encoder, tmp_path, capsys):
    """Also with the fp32 ONNX document encoder: its vectors match the torch model's."""
    corpus = tmp_path / "corpus.jsonl"
    docs = itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 24)
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                          "metadata": d.metadata}) + "\n" for d in docs))
    out = tmp_path / "index"
    assert cli(["build", "--corpus", str(corpus), "--out", str(out), "--shards", "3",
                "--shard-dense", "exact", "--doc-encoder", "onnx"]) == 0
    assert "published build" in capsys.readouterr().out
    directory, layout = read_layout(out)
    assert [(e.start, e.stop) for e in layout.shards] == [(0, 8), (8, 16), (16, 24)]
    assert ":onnx:" in read_manifest(directory).encoder.encoder_id
    with Retriever.load(out, CONFIG, encoder=encoder) as retriever:
        built = retriever.snapshot.vectors.reconstruct_all()
    reference = encoder.encode([d.content for d in itertools.islice(
        with_demo_metadata(read_corpus(dataset("scifact"))), 24)])
    assert np.min(np.sum(built * reference, axis=1)) >= 0.9999
    assert cli(["build", "--corpus", str(corpus), "--out", str(out), "--shards", "0"]) != 0
    assert "shards must be a positive integer" in capsys.readouterr().err


def test_sharded_searches_cache_results_and_embeddings(scifact_sharded, encoder):
    with Retriever.load(scifact_sharded(2), encoder=encoder) as retriever:
        first = retriever.search("vitamin D deficiency", k=5)
        assert retriever.flush_cache_writes(5.0)
        again = retriever.search("vitamin D deficiency", k=5)
        other_k = retriever.search("vitamin D deficiency", k=3)
    assert (first.cache.result, first.cache.embedding) == ("miss", "miss")
    assert again.cache.result == "hit"
    assert [h.doc_id for h in again.hits] == [h.doc_id for h in first.hits]
    assert (other_k.cache.result, other_k.cache.embedding) == ("miss", "hit")
    assert [h.doc_id for h in other_k.hits] == [h.doc_id for h in first.hits][:3]


class CountingEncoder:
    """An in-memory ``Encoder``: a vector from each text's hash; counts what it encodes."""

    encoder_id = "test:counting:fp32:8"
    model = "test"
    dim = 8

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, texts, *, batch_size=64, progress=False):
        self.encoded += len(texts)
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
                 for t in texts]
        rows = np.array([np.random.default_rng(s).normal(size=8) for s in seeds], np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_sharded_rebuild_reuses_the_shards_vectors_by_content_hash(tmp_path):
    encoder = CountingEncoder()
    first = build_index(_tiny_docs(30), tmp_path, shards=3, encoder=encoder, progress=False)
    assert (first.vectors_encoded, encoder.encoded) == (30, 30)
    changed = [Document(d.id, d.text + (" changed" if d.id in ("d3", "d17") else ""),
                        metadata=d.metadata) for d in _tiny_docs(30)]
    again = build_index(changed, tmp_path, shards=2, encoder=encoder, progress=False)
    assert (again.vectors_reused, again.vectors_encoded, encoder.encoded) == (28, 2, 32)
