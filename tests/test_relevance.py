"""The relevance score (``retrieval.relevance``): on held-out judged queries of every shipped
collection the share of queries whose top hit is relevant rises with the score; a
``min_score`` chosen on SciFact's training queries keeps its precision on Cranfield's held-out
queries; the shipped calibration is what a fit on the training queries gives; hits carry the
score, thresholds filter by it, and bad thresholds are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from live_index import build_small, scifact_docs, unit_vectors

from indexes.errors import InvalidQueryError
from retrieval import Retriever
from retrieval.calibrate import (
    fit_judged,
    judged_hits,
    judged_splits,
    precision_above,
    reliability,
    threshold_for,
)
from retrieval.errors import ConfigError
from retrieval.relevance import ROOT_FILE, SHIPPED, Calibration, calibration_for, fit_calibration

COLLECTIONS = ("scifact", "cranfield", "cisi")
UNCACHED = {"cache": {"backend": "none"}}


@pytest.fixture(scope="module")
def judged(beir_index, dataset):
    """name -> (training judged hits, held-out judged hits), the retriever's defaults."""
    parts = {}
    for name in COLLECTIONS:
        root, _, _ = beir_index(name)
        queries, train, held_out = judged_splits(dataset(name))
        with Retriever.load(root, UNCACHED) as retriever:
            parts[name] = (judged_hits(retriever, queries, train),
                           judged_hits(retriever, queries, held_out))
    return parts


@pytest.fixture(scope="module")
def shipped() -> Calibration:
    return Calibration.model_validate_json(SHIPPED.read_bytes())


def test_judged_hits_are_fitted_on_whole_rankings_under_a_serving_deadline(judged, beir_index,
                                                                          dataset):
    """``calibrate`` takes the caller's retriever: under its deadline (one budget for a
    whole batch) the later queries of each batch came back ranked by BM25 alone, and the fit
    learned from cosines of 0."""
    root, _, _ = beir_index("cranfield")
    queries, _, held_out = judged_splits(dataset("cranfield"))
    with Retriever.load(root, {**UNCACHED, "deadline_ms": 1}) as retriever:
        hits = judged_hits(retriever, queries, held_out)
    assert np.array_equal(hits.features, judged["cranfield"][1].features)


def test_the_shipped_calibration_is_the_fit_on_the_training_queries(judged, shipped):
    fitted = fit_judged({name: train for name, (train, _) in judged.items()}, shipped.model)
    assert fitted.fitted_on == shipped.fitted_on
    assert fitted.intercept == pytest.approx(shipped.intercept, abs=0.05)
    for name, weight in shipped.weights.items():
        assert fitted.weights[name] == pytest.approx(weight, abs=0.05)


@pytest.mark.parametrize("name", COLLECTIONS)
def test_top_hits_are_relevant_more_often_as_the_score_rises(judged, shipped, name):
    """The top bin beats the bottom one, and no bin falls below an earlier bin by more than
    sampling noise (two standard errors of the difference). Held-out bins hold 10-29 queries:
    one query whose top hit changes with the CPU's float kernels moves a bin by 0.03-0.1."""
    table = reliability(shipped, judged[name][1], bins=4)
    print(name, [(round(b["estimate"], 2), round(b["relevant"], 2)) for b in table])
    assert table[-1]["relevant"] > table[0]["relevant"], f"held-out {name}: {table}"
    for later, row in enumerate(table):
        for earlier in table[:later]:
            allowed = 2 * difference_error(earlier, row)
            assert row["relevant"] >= earlier["relevant"] - allowed, \
                f"held-out {name} falls by more than {allowed:.2f}: {table}"


def difference_error(first: dict[str, float], second: dict[str, float]) -> float:
    """The standard error of the difference between two bins' shares of relevant top hits,
    under the pooled share (a two-proportion test's)."""
    relevant = first["relevant"] * first["queries"] + second["relevant"] * second["queries"]
    pooled = relevant / (first["queries"] + second["queries"])
    return float(np.sqrt(pooled * (1 - pooled) * (1 / first["queries"] + 1 / second["queries"])))


def test_the_score_is_calibrated_on_scifacts_held_out_queries(judged, shipped):
    """Estimated and measured top-hit relevance agree within 0.1 in every bin."""
    for row in reliability(shipped, judged["scifact"][1], bins=4):
        assert row["estimate"] == pytest.approx(row["relevant"], abs=0.15), row


def test_a_threshold_chosen_on_scifact_keeps_its_precision_on_cranfield(judged, shipped):
    for target in (0.7, 0.8):
        threshold = threshold_for(shipped, judged["scifact"][0], target)
        precision, kept = precision_above(shipped, judged["cranfield"][1], threshold)
        assert kept >= 10 and precision >= target, (target, threshold, precision, kept)
        everyone = judged["cranfield"][1].top_labels().mean()
        assert precision > everyone  # the threshold selects, it does not just pass all


def test_hits_carry_the_score_and_min_score_filters_by_it(beir_index):
    root, queries, _ = beir_index("scifact")
    texts = list(queries.values())[:20]
    with Retriever.load(root, UNCACHED) as retriever:
        calibration = calibration_for(root, retriever.snapshot.manifest)
        assert calibration is not None
        for text in texts:
            result = retriever.search(text, k=10, explain=True)
            scores = [h.relevance for h in result.hits]
            assert all(s is not None and 0 < s < 1 for s in scores)
            expected = calibration.score(
                [h.vector_score for h in result.hits],
                [h.explanation.coverage for h in result.hits], np.arange(1, 11))
            assert scores == pytest.approx(expected.tolist(), abs=1e-9)
            threshold = float(np.median(scores))
            kept = retriever.search(text, k=10, min_score=threshold)
            assert [h.doc_id for h in kept.hits] == \
                [h.doc_id for h in result.hits if h.relevance >= threshold]
            assert retriever.search(text, k=10, min_score=1.0).hits == []
            assert len(retriever.search(text, k=10, min_score=0.0).hits) == 10
        batch = retriever.search_batch(texts[:3], k=5, min_score=0.5)
        assert all(h.relevance >= 0.5 for r in batch for h in r.hits)


OFF_TOPIC = ["best pizza toppings in naples", "which football team won the 1998 world cup",
             "how to bake sourdough bread", "stock market prices tomorrow"]


def test_questions_the_corpus_cannot_answer_score_low(beir_index):
    """The fused score of their top hit is 1.000 like any query's; the relevance is not."""
    root, queries, qrels = beir_index("scifact")
    with Retriever.load(root, UNCACHED) as retriever:
        off_topic = [r.hits[0] for r in retriever.search_batch(OFF_TOPIC, k=1)]
        answered = [r.hits[0] for qid, r in zip(queries, retriever.search_batch(
            list(queries.values()), k=1), strict=True) if r.hits[0].doc_id in qrels[qid]]
    assert all(h.score == pytest.approx(1.0) for h in off_topic + answered)
    assert max(h.relevance for h in off_topic) < 0.25
    assert np.median([h.relevance for h in answered]) > 0.5


def test_numpy_scalars_are_taken_for_min_score_and_context():
    """k took np.int64(3); context and min_score refused numpy's scalars."""
    from retrieval.relevance import check_min_score
    from retrieval.request_path.grouping import check_grouping

    assert check_min_score(np.float32(0.5)) == 0.5 and check_min_score(np.int64(1)) == 1.0
    assert check_grouping("document", np.int64(1)) == ("document", 1)
    with pytest.raises(InvalidQueryError, match="min_score must be a number from 0 to 1"):
        check_min_score(np.float64("nan"))


@pytest.mark.parametrize("bad", [-0.1, 1.5, "high", True, float("nan")])
def test_a_bad_min_score_is_a_typed_error(beir_index, bad):
    root, _, _ = beir_index("scifact")
    with Retriever.load(root, UNCACHED) as retriever:
        with pytest.raises(InvalidQueryError, match="min_score must be a number from 0 to 1"):
            retriever.search("cells", k=3, min_score=bad)
        assert retriever.search("cells", k=3).hits  # still serving


def test_a_root_calibration_wins_and_round_trips(tmp_path, beir_index):
    root, _, _ = beir_index("scifact")
    with Retriever.load(root, UNCACHED) as retriever:
        manifest = retriever.snapshot.manifest
    own = Calibration(model=manifest.encoder.model, intercept=-1.0,
                      weights={"vector": 1.0, "coverage": 2.0, "log_rank": -0.5})
    own.save(tmp_path)
    assert (tmp_path / ROOT_FILE).is_file()
    assert calibration_for(tmp_path, manifest) == own
    other = own.model_copy(update={"model": "another-model"})
    other.save(tmp_path)
    assert calibration_for(tmp_path, manifest).intercept != other.intercept  # shipped instead
    assert calibration_for(None, manifest.model_copy(update={
        "encoder": manifest.encoder.model_copy(update={"model": "another-model"})})) is None


@pytest.mark.parametrize(("body", "says"), [
    ('{"model": "all-MiniLM-L6-v2", "intercept": 1, "weights": {"vector": 1, "coverage": 1}}',
     "weights must name exactly"),
    ('{"model": "all-MiniLM-L6-v2", "intercept": NaN, "weights": '
     '{"vector": 1, "coverage": 1, "log_rank": -1}}', "intercept"),
    ("not json", "Invalid JSON"),
])
def test_a_root_file_that_is_no_calibration_is_refused_naming_it(tmp_path, beir_index, body,
                                                                 says):
    """A weight missing made every search a KeyError (a 500); NaN made every relevance NaN
    and min_score drop every hit; a file that is not JSON a bare ValidationError."""
    root, _, _ = beir_index("scifact")
    with Retriever.load(root, UNCACHED) as retriever:
        manifest = retriever.snapshot.manifest
    (tmp_path / ROOT_FILE).write_text(body)
    with pytest.raises(ConfigError, match=f"relevance.json is no relevance calibration.*{says}"):
        calibration_for(tmp_path, manifest)


def test_a_variant_of_the_retriever_scores_with_the_roots_calibration(tmp_path, dataset):
    """The console's sides (``with_ranking``) scored with the shipped calibration, or none,
    while /v1/search used the root's own."""
    build_small(tmp_path, scifact_docs(dataset("scifact"), 50))  # a model nothing ships for
    Calibration(model="random-8", intercept=-1.0,
                weights={"vector": 1.0, "coverage": 2.0, "log_rank": -0.5}).save(tmp_path)
    vector = unit_vectors(1, 1)[0]
    with Retriever.load(tmp_path, UNCACHED) as retriever, \
            retriever.with_ranking() as variant:
        want = [h.relevance for h in retriever.search("cells", k=3, query_vector=vector).hits]
        got = [h.relevance for h in variant.search("cells", k=3, query_vector=vector).hits]
    assert None not in want and got == pytest.approx(want)


def test_min_score_without_a_calibration_says_how_to_get_one(tmp_path, dataset):
    build_small(tmp_path, scifact_docs(dataset("scifact"), 50))  # a model with no calibration
    with Retriever.load(tmp_path, UNCACHED) as retriever:
        vector = unit_vectors(1, 1)[0]
        assert retriever.search("cells", k=2, query_vector=vector).hits[0].relevance is None
        with pytest.raises(InvalidQueryError, match="retrieval calibrate"):
            retriever.search("cells", k=2, query_vector=vector, min_score=0.5)


def test_fitting_is_deterministic_and_recovers_a_known_model():
    rng = np.random.default_rng(3)
    features = np.column_stack([rng.uniform(0, 1, 4000), rng.uniform(0, 1, 4000),
                                rng.integers(1, 11, 4000)])
    truth = -2.0 + 3.0 * features[:, 0] + 1.5 * features[:, 1] - 1.0 * np.log(features[:, 2])
    labels = (rng.uniform(0, 1, 4000) < 1 / (1 + np.exp(-truth))).astype(int)
    first = fit_calibration(features, labels, "m")
    assert first == fit_calibration(features, labels, "m")
    assert first.intercept == pytest.approx(-2.0, abs=0.4)
    assert first.weights["vector"] == pytest.approx(3.0, abs=0.5)
    assert first.weights["log_rank"] == pytest.approx(-1.0, abs=0.3)
    with pytest.raises(InvalidQueryError, match="both kinds"):
        fit_calibration(features, np.zeros(4000), "m")


COMMON = [f"flow {word} of a fluid" for word in ("laminar", "turbulent", "viscous", "heat",
                                                  "supersonic", "boundary")] + \
         ["a study of shock waves", "boundary layers of plates", "heat in metals"]


def rank_bm25_bound(texts: list[str], analyzer, tokens: list[str]) -> float:
    """The most a document can score for ``tokens``: rank-bm25's idf (its floor for a term
    in more than half the documents) times ``k1 + 1``, summed."""
    from rank_bm25 import BM25Okapi

    scorer = BM25Okapi([analyzer(text) for text in texts])
    return sum(scorer.idf.get(token, 0.0) for token in tokens) * (scorer.k1 + 1)


@pytest.mark.parametrize("layout", ["whole", "sharded", "live"])
def test_coverage_counts_a_term_in_most_documents_as_bm25_scores_it(tmp_path, layout):
    """"flow" is in 6 of 9 documents: okapi's idf of it is negative, and BM25 scores it at
    the vocabulary's floor; the coverage's bound counts it the same way, so a hit holding
    every query term is below 1, and "flow" alone is covered above 0."""
    from indexes import Document
    from indexes.writer import IndexWriter

    docs = [Document(f"d{i}", text) for i, text in enumerate(COMMON)]
    build_small(tmp_path, docs, shards=2 if layout == "sharded" else None)
    texts = COMMON
    if layout == "live":
        with IndexWriter(tmp_path) as writer:  # 6 of 8 left: idf over the live documents
            writer.delete(["d7"])
        texts = COMMON[:7] + COMMON[8:]
    with Retriever.load(tmp_path, UNCACHED) as retriever:
        analyzer = retriever.snapshot.analyzer
        for query in ("flow", "laminar flow", "turbulent flow heat"):
            hit = retriever.search(query, k=1, explain=True,
                                   query_vector=unit_vectors(1, 3)[0]).hits[0]
            bound = rank_bm25_bound(texts, analyzer, analyzer(query))
            assert hit.explanation.coverage == pytest.approx(hit.bm25_score / bound, rel=1e-9)
            assert 0 < hit.explanation.coverage < 1
