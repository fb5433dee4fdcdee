"""The benchmark suite end to end at tiny size, and ranx against a hand computation.

Nothing here asserts a timing: the machines are shared and noisy. The suite run checks that
every figure the report promises is there, with the right type, and that the plots are PNGs.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from benchmarks import suite
from benchmarks.common import measure_side_by_side, pareto_front
from benchmarks.quality import SUITE_METRICS, evaluate_run, run_from_outputs
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY = {"n": int, "p50": float, "p95": float, "p99": float, "max": float}
# Required keys and their types; a nested dict is checked recursively.
SCHEMA = {
    "benchmark": str, "schema": int, "seconds": float, "markdown": str, "config": dict,
    "versions": dict, "notes": dict, "cold": list,
    "environment": {"git_sha": str, "python": str, "packages": dict, "cpu_count": int,
                    "source_digest": str},
    "workload": {"name": str, "mode": str, "n_docs": int, "queries": int, "warmup": int,
                 "measured": int, "qrels_queries": int, "encoder": str},
    "build": {"sizes": {"bm25": int, "vectors": int, "metadata": int, "docstore": int,
                        "total": int}},
    "load": {"snapshot_load_seconds": float, "fresh_process": list},
    "systems": dict, "end_to_end": dict, "concurrency": dict, "plots": dict,
}
PEERS = ["rank-bm25", "bm25s", "dense"] + [
    name for name in ("lancedb", "txtai") if importlib.util.find_spec(name) is not None]


def check_schema(value: object, schema: object, where: str = "payload") -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where} is {type(value).__name__}, not an object"
        for key, sub in schema.items():
            assert key in value, f"{where} lacks {key!r}"
            check_schema(value[key], sub, f"{where}.{key}")
    elif schema is float:  # JSON writes 2.0 as 2.0 but a count-like float may come back int
        assert isinstance(value, int | float) and not isinstance(value, bool), where
    else:
        assert isinstance(value, schema), f"{where} is {type(value).__name__}, not {schema}"


def check_summary(summary: dict, where: str) -> None:
    check_schema(summary, SUMMARY, where)
    assert summary["n"] > 0, where
    # Order of the percentiles, not their values: these are not timing assertions.
    assert 0 <= summary["p50"] <= summary["p95"] <= summary["p99"] <= summary["max"], where


def check_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    assert path.stat().st_size > 10_000, f"{path} is suspiciously small"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) >= 200, (path, image.size)


@pytest.fixture(scope="module")
def tiny_log(dataset, beir_index, build_subset, tmp_path_factory):
    """A SciFact subset index (vectors reused) and a query log with filters and judgments."""
    _, queries, qrels = beir_index("scifact")
    judged = list(queries)[:40]
    keep = {d for q in judged for d in qrels[q]}
    docs = [d for i, d in enumerate(with_demo_metadata(read_corpus(dataset("scifact"))))
            if i < 800 or d.id in keep]
    work = tmp_path_factory.mktemp("suite")
    build_subset(docs, work / "index")
    lines = [{"query": queries[q], "relevant": sorted(qrels[q]),
              **({"filters": {"year": {"gte": 2000}}} if n % 5 == 4 else {})}
             for n, q in enumerate(judged)]
    (work / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return work


def test_suite_tiny_end_to_end(tiny_log: Path) -> None:
    out = tiny_log / "results"
    code = suite.main(["--index", str(tiny_log / "index"), "--queries-log",
                       str(tiny_log / "log.jsonl"), "--tiny", "--work", str(tiny_log),
                       "--out", str(out), "--peers", *PEERS])
    assert code == 0
    [json_path] = out.glob("suite-*.json")
    payload = json.loads(json_path.read_text())
    check_schema(payload, SCHEMA)
    assert payload["workload"]["qrels_queries"] == 40
    assert payload["workload"]["measured"] >= 20

    systems = payload["systems"]
    assert sum(s["kind"] == "peer" for s in systems.values()) == len(PEERS)
    for name, system in systems.items():
        assert set(SUITE_METRICS) <= set(system["quality"]), name
        assert all(0.0 <= v <= 1.0 for v in system["quality"].values()), name
        check_summary(system["latency"]["e2e"], f"{name} e2e")
        for stage, summary in system["latency"]["stages"].items():
            check_summary(summary, f"{name} {stage}")
    default = next(s for s in systems.values() if s["kind"] == "ours")
    assert {"bm25", "rerank", "fuse", "hydrate", "total"} <= set(default["latency"]["stages"])

    e2e = payload["end_to_end"]
    assert any("cache miss (torch)" in name for name in e2e)
    assert any("cache hit" in name for name in e2e)
    for name, row in e2e.items():
        check_summary(row["e2e"], name)
        assert isinstance(row["share_as_expected"], float), name

    for mode, levels in payload["concurrency"].items():
        assert set(levels) == {"1", "4", "16"}, mode  # JSON object keys are strings
        for level in levels.values():
            assert level["qps"] > 0
            check_summary(level["latency"], mode)

    [cold] = payload["cold"]
    assert cold["load_seconds"] > 0 and cold["first_query_ms"] > 0
    assert cold["memory_after_load_mb"]["rss"] > 0

    assert set(payload["plots"]) == {"latency_cdf", "quality_vs_p95", "throughput"}
    for path in payload["plots"].values():
        check_png(Path(path))
    markdown = Path(payload["markdown"]).read_text()
    assert "## Quality and search-path latency" in markdown
    assert all(f"| {name} |" in markdown for name in systems)


# -- ranx against a hand computation ------------------------------------------------------

QRELS = {
    "q1": {"d1": 1, "d3": 1, "d6": 1},
    "q2": {"d7": 2, "d8": 1},  # graded: ranx's nDCG gain is the grade itself (trec_eval)
    "q3": {"d10": 1},  # not in the run: scores 0 on every metric
    "q4": {"d20": 1},  # first relevant at rank 11: outside every @10 cut-off
}
RUN = {
    "q1": {"d2": 5.0, "d1": 4.0, "d4": 3.0, "d3": 2.0, "d5": 1.0},
    "q2": {"d8": 3.0, "d9": 2.0, "d7": 1.0},
    "q4": {f"x{r}": 20.0 - r for r in range(1, 11)} | {"d20": 1.0},
}


def hand_computed() -> dict[str, float]:
    log2 = math.log2
    # q1: relevant at ranks 2 and 4 of 3 relevant. DCG = 1/log2(3) + 1/log2(5);
    #     ideal: ranks 1-3 -> 1/log2(2) + 1/log2(3) + 1/log2(4) = 2.1309.
    ndcg_q1 = (1 / log2(3) + 1 / log2(5)) / (1 / log2(2) + 1 / log2(3) + 1 / log2(4))
    # q2: d8 (grade 1) at rank 1, d7 (grade 2) at rank 3. DCG = 1/log2(2) + 2/log2(4) = 2;
    #     ideal: grade 2 first, then 1 -> 2/log2(2) + 1/log2(3) = 2.6309.
    ndcg_q2 = (1 / log2(2) + 2 / log2(4)) / (2 / log2(2) + 1 / log2(3))
    return {
        "ndcg@10": (ndcg_q1 + ndcg_q2 + 0 + 0) / 4,  # = (0.4982 + 0.7602) / 4 = 0.3146
        # recall@10: q1 found 2 of 3, q2 2 of 2, q3 none, q4's hit is at rank 11.
        "recall@10": (2 / 3 + 1 + 0 + 0) / 4,
        "recall@100": (2 / 3 + 1 + 0 + 1) / 4,  # q4's rank-11 document now counts
        "recall@2": (1 / 3 + 1 / 2 + 0 + 0) / 4,  # top 2: q1 has d1, q2 has d8
        # MRR@10: first relevant at rank 2 (q1), rank 1 (q2), none (q3), beyond 10 (q4).
        "mrr@10": (1 / 2 + 1 + 0 + 0) / 4,
    }


def test_ranx_matches_hand_computation() -> None:
    expected = hand_computed()
    got = evaluate_run(QRELS, RUN, list(expected))
    assert got == pytest.approx(expected, abs=1e-9)
    assert expected["ndcg@10"] == pytest.approx(0.31460, abs=1e-4)


def test_run_from_outputs_keeps_the_returned_order() -> None:
    # Tied scores (as RRF gives) must not be re-ordered: q1 puts d1 before d2 on a tie.
    outputs = [(None, ["d1", "d2", "d1"], [0.5, 0.5, 0.1])]
    run = run_from_outputs(["q1"], outputs)
    assert list(run["q1"]) == ["d1", "d2"]
    assert run["q1"]["d1"] > run["q1"]["d2"]
    assert evaluate_run({"q1": {"d1": 1}}, run, ["mrr@10"])["mrr@10"] == 1.0


def test_pareto_front() -> None:
    points = [{"n": 0.70, "p": 1.0}, {"n": 0.72, "p": 2.0}, {"n": 0.71, "p": 3.0},
              {"n": 0.72, "p": 2.5}, {"n": 0.60, "p": 0.5}]
    front = pareto_front(points, "n", "p")
    assert front == [{"n": 0.60, "p": 0.5}, {"n": 0.70, "p": 1.0}, {"n": 0.72, "p": 2.0}]


def test_side_by_side_rotates_turns_and_rewarms_each_runner() -> None:
    calls: list[tuple[str, str]] = []
    runners = {name: (lambda item, name=name: calls.append((name, item)) or item)
               for name in ("a", "b", "c")}
    samples = measure_side_by_side(runners, ["q1", "q2", "q3", "q4"], warmup=["w1", "w2"],
                                   chunk=2, rewarm=1)
    timed = [(name, item) for name, item in calls[6:] if item.startswith("q")]
    # chunk 1 in order a, b, c; chunk 2 starts with b: no runner always follows the same one
    assert [name for name, _ in timed] == ["a", "a", "b", "b", "c", "c",
                                           "b", "b", "c", "c", "a", "a"]
    # each timed chunk is preceded by that runner's untimed warmup item
    turns = calls[6:]
    for i, (name, item) in enumerate(turns):
        if item.startswith("q") and (i == 0 or turns[i - 1][0] != name):
            pytest.fail(f"{name} timed without a re-warm")
    assert [s.outputs for s in samples.values()] == [["q1", "q2", "q3", "q4"]] * 3
