"""The two-stage retriever on SciFact with the real model: exact filters, exact re-rank."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes.demo_metadata import DEPARTMENTS, DOC_TYPES
from retrieval import Retriever, RetrieverConfig

QUERIES = [
    "statins lower cardiovascular risk",
    "vitamin D deficiency and bone fractures",
    "gene expression in tumor cells",
    "immune response to viral infection",
    "sleep and memory consolidation",
]


NO_CACHE = {"cache": {"backend": "none"}}  # these tests exercise the uncached pipeline
# The naive oracle below re-implements the keyword gate and min-max fusion; the dense leg and
# the other fusions have their own oracles (tests/test_dense_leg.py).
KEYWORD_MINMAX = {**NO_CACHE, "candidate_policy": "keyword", "fusion": "minmax"}


@pytest.fixture(scope="module")
def scifact(beir_index, encoder):
    root, _, _ = beir_index("scifact")
    return Retriever.load(root, KEYWORD_MINMAX, encoder=encoder)


def naive_match(spec: dict, metadata: dict) -> bool:
    """A plain-Python reading of the dict filter language used below."""
    for field, condition in spec.items():
        value = metadata.get(field)
        if isinstance(condition, dict):
            if "in" in condition and value not in condition["in"]:
                return False
            for op, bound in condition.items():
                if op == "in":
                    continue
                if value is None:
                    return False
                ok = {"gt": value > bound, "gte": value >= bound, "lt": value < bound,
                      "lte": value <= bound}[op]
                if not ok:
                    return False
        elif value != condition:
            return False
    return True


filters_strategy = st.fixed_dictionaries({}, optional={
    "department": st.sampled_from(DEPARTMENTS),
    "doc_type": st.builds(lambda v: {"in": v}, st.lists(st.sampled_from(DOC_TYPES), min_size=1,
                                                        max_size=3, unique=True)),
    "year": st.builds(lambda op, y: {op: y}, st.sampled_from(["gt", "gte", "lt", "lte"]),
                      st.integers(1990, 2030)),
})


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=filters_strategy, query=st.sampled_from(QUERIES), k=st.integers(1, 30))
def test_filters_are_exact_against_naive_filter(scifact, spec, query, k):
    docs = scifact.snapshot.docs
    allowed = {docs.doc_id(r) for r in range(len(docs)) if naive_match(spec, docs.get(r).metadata)}
    result = scifact.search(query, filters=spec, k=k)
    assert result.allowed == len(allowed)
    assert len(result.hits) <= min(k, len(allowed))
    for hit in result.hits:
        assert hit.doc_id in allowed
        assert naive_match(spec, hit.metadata)
        assert hit.bm25_score > 0  # no zero-score filler
    # Same answer as a naive post-filter over an unbounded candidate list, re-ranked the same way.
    expected = _naive_filtered_search(scifact, query, allowed, k)
    assert [h.doc_id for h in result.hits] == expected


def _naive_filtered_search(
    retriever: Retriever, query: str, allowed: set[str], k: int
) -> list[str]:
    snapshot = retriever.snapshot
    rows, scores = snapshot.bm25.score_touched(snapshot.analyzer(query))
    keep = np.array([snapshot.docs.doc_id(int(r)) in allowed for r in rows], dtype=bool)
    rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))[: retriever.config.candidates]
    rows, scores = rows[order], scores[order]
    if rows.size == 0:
        return []
    vector = retriever.encoder.encode([query])[0]
    cosine = snapshot.vectors.reconstruct_all()[rows] @ vector
    w = retriever.config.vector_weight

    def mm(x: np.ndarray) -> np.ndarray:
        span = x.max() - x.min()
        return np.ones_like(x) if span <= 0 else (x - x.min()) / span

    fused = w * mm(cosine.astype(np.float64)) + (1 - w) * mm(scores)
    best = np.lexsort((np.arange(fused.size), -fused))[:k]
    return [snapshot.docs.doc_id(int(rows[i])) for i in best]


def test_filter_matching_nothing_returns_no_hits(scifact):
    result = scifact.search("statins", filters={"year": {"gt": 3000}}, k=10)
    assert result.hits == [] and result.allowed == 0


def test_k_is_capped_by_allowed_count(scifact):
    docs = scifact.snapshot.docs
    target = docs.get(0)
    spec = {"year": target.metadata["year"], "department": target.metadata["department"],
            "doc_type": target.metadata["doc_type"]}
    result = scifact.search(target.title, filters=spec, k=1000)
    assert 0 < len(result.hits) <= result.allowed < 1000


def test_rerank_equals_brute_force_cosine_over_candidates(beir_index, encoder):
    root, _, _ = beir_index("scifact")
    by_cosine = Retriever.load(root, RetrieverConfig(vector_weight=1.0, candidates=50,
                                                       **KEYWORD_MINMAX),
                               encoder=encoder)
    snapshot = by_cosine.snapshot
    everything = snapshot.vectors.reconstruct_all().astype(np.float64)
    for query in QUERIES:
        rows, _ = snapshot.bm25.top_candidates(snapshot.analyzer(query), 50)
        vector = encoder.encode([query])[0].astype(np.float64)
        brute = everything[rows] @ vector
        expected = [snapshot.docs.doc_id(int(r)) for r in rows[np.argsort(-brute, kind="stable")]]
        result = by_cosine.search(query, k=50)
        assert [h.doc_id for h in result.hits] == expected
        got = {h.doc_id: h.vector_score for h in result.hits}
        for row, cosine in zip(rows, brute, strict=True):
            assert got[snapshot.docs.doc_id(int(row))] == pytest.approx(cosine, abs=1e-5)


def test_result_shape_and_timings(scifact):
    result = scifact.search("statins lower cardiovascular risk",
                            filters={"doc_type": {"in": ["review", "trial"]},
                                     "year": {"gte": 2000}}, k=5)
    assert len(result.hits) == 5
    assert result.build_id == scifact.build_id
    assert [h.score for h in result.hits] == sorted((h.score for h in result.hits), reverse=True)
    for stage in ("validate", "filter", "bm25", "embed", "rerank", "fuse", "hydrate", "total"):
        assert result.timings[stage] >= 0
    # No cache configured: "off", not a miss a service would count as a lookup.
    assert result.cache.embedding == "off" and result.cache.result == "off"
    batch = scifact.search_batch(["statins", "cell"], k=2)
    assert [r.cache.embedding for r in batch] == ["off", "off"]
    for each in batch:  # the batch's one validation and encode are each query's, in its total
        assert each.timings["embed"] > 0 and each.timings["validate"] > 0
        assert each.timings["total"] >= sum(each.timings[stage] for stage in (
            "validate", "embed", "bm25"))
    hit = result.hits[0]
    assert hit.text and hit.metadata["doc_type"] in ("review", "trial")


def test_sequential_stage_timings_do_not_overlap(beir_index, encoder):
    """Encoded before filter and BM25, the query's encode is its own stage, not part of
    ``filter``: the stages then add up to no more than the total."""
    root, _, _ = beir_index("scifact")
    serial = Retriever.load(root, RetrieverConfig(parallel_stages=False, **NO_CACHE),
                            encoder=encoder)
    for query in QUERIES:
        timings = serial.search(query, filters={"year": {"gte": 2000}}, k=5).timings
        stages = sum(ms for stage, ms in timings.items() if stage != "total")
        assert stages <= timings["total"] + 1e-6, timings


def test_search_batch_equals_search(scifact):
    batch = scifact.search_batch(QUERIES, filters="year >= 2005", k=7)
    for query, result in zip(QUERIES, batch, strict=True):
        single = scifact.search(query, filters={"year": {"gte": 2005}}, k=7)
        assert [h.doc_id for h in result.hits] == [h.doc_id for h in single.hits]
        np.testing.assert_allclose([h.score for h in result.hits], [h.score for h in single.hits],
                                   atol=1e-6)


def test_serial_and_parallel_stages_agree(beir_index, encoder):
    root, _, _ = beir_index("scifact")
    serial, parallel = (Retriever.load(root, RetrieverConfig(parallel_stages=p, **NO_CACHE),
                                       encoder=encoder) for p in (False, True))
    assert (serial.stats()["parallel_stages"], parallel.stats()["parallel_stages"]) == (
        "never", "always")
    for query in QUERIES:
        a, b = serial.search(query, k=10), parallel.search(query, k=10)
        assert [h.doc_id for h in a.hits] == [h.doc_id for h in b.hits]


class ThreadedEncoder:
    """The real encoder under a declared intra-op thread count (our Encoder interface)."""

    def __init__(self, inner, threads: int) -> None:
        self.inner, self.threads = inner, threads
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim

    def encode(self, texts, *, batch_size=64, progress=False):
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


def test_stages_overlap_by_default_only_when_a_core_is_spare(beir_index, encoder):
    """Auto: always when the encoder leaves a core free, else only under load."""
    root, _, _ = beir_index("scifact")
    cores = os.cpu_count() or 1
    spare = "always" if cores > 1 else "under load"
    for threads, expected in ((cores, "under load"), (max(1, cores - 1), spare)):
        retriever = Retriever.load(root, RetrieverConfig(**NO_CACHE),
                                   encoder=ThreadedEncoder(encoder, threads))
        assert retriever.stats()["parallel_stages"] == expected


def test_rrf_fusion_is_selectable(beir_index, encoder):
    root, _, _ = beir_index("scifact")
    rrf = Retriever.load(root, RetrieverConfig(fusion="rrf", **NO_CACHE), encoder=encoder)
    result = rrf.search(QUERIES[0], k=5)
    assert len(result.hits) == 5
    assert all(0 < h.score <= 2 / 61 for h in result.hits)
