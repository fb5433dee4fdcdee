"""The publish gate on sharded builds (SciFact, vectors reused from the test index): the same
corpus in another shard count passes with identical canaries, a truncated sharded export is
refused and never goes live, and a sharded live build is compared with an unsharded candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_publish_gate import scifact_fixture  # noqa: F401 (``scifact``: dir, queries, qrels, docs)

from indexes.build import BuildConfig, build_index
from indexes.manifest import CURRENT, current_build_dir
from indexes.sharding import is_sharded
from retrieval.publishing import GateConfig, check, publish
from retrieval.publishing.gate import build_contents


def _reusing(source: Path) -> BuildConfig:
    return BuildConfig(reuse_from=str(source.parent.parent))


def _sharded(docs, root: Path, encoder, source: Path, shards: int, publish: bool) -> str:
    return build_index(docs, root, shards=shards, encoder=encoder, config=_reusing(source),
                               progress=False, publish=publish, dense="exact").build_id


@pytest.fixture()
def gate(scifact, tmp_path) -> GateConfig:
    _, queries, qrels, _ = scifact
    judged = [q for q in queries if q in qrels][:60]
    canaries, labeled = tmp_path / "canaries.jsonl", tmp_path / "labeled.jsonl"
    canaries.write_text("".join(json.dumps({"query": queries[q]}) + "\n" for q in judged[:20]))
    labeled.write_text("".join(json.dumps({"query": queries[q], "relevant": qrels[q]}) + "\n"
                               for q in judged))
    return GateConfig(canaries=str(canaries), labeled_log=str(labeled), max_doc_drop=0.10,
                      min_canary_overlap=0.9)


def _checks(report) -> dict[str, tuple[str, dict]]:
    return {c.name: (c.outcome, c.figures or {}) for c in report.checks}


def test_sharded_candidates_are_gated_like_whole_builds(scifact, encoder, gate, tmp_path):
    source, _, _, docs = scifact
    root = tmp_path / "index"
    live = _sharded(docs, root, encoder, source, 2, publish=True)
    contents = build_contents(current_build_dir(root))
    assert contents.doc_ids == [d.id for d in docs]  # shards joined in row order

    same = _sharded(docs, root, encoder, source, 3, publish=False)
    passed = publish(root, same, gate, encoder=encoder)
    checks = _checks(passed.report)
    assert passed.published, passed.report.text()
    assert checks["canary overlap"][1]["mean_overlap"] == 1.0  # exact shards: same answers
    assert checks["labeled log nDCG"][1]["drop"] == pytest.approx(0.0, abs=1e-12)
    assert (root / CURRENT).read_text().strip() == same

    kept = docs[: int(len(docs) * 0.6)]  # the nightly export lost 40% of the documents
    cut = _sharded(kept, root, encoder, source, 2, publish=False)
    refused = publish(root, cut, gate, encoder=encoder)
    checks = _checks(refused.report)
    assert not refused.published
    assert (root / CURRENT).read_text().strip() == same  # the good build serves on
    assert checks["document count"][0] == "refused", refused.report.text()
    labeled = checks["labeled log nDCG"][1]
    assert labeled["ndcg_candidate"] < labeled["ndcg_live"]  # the searches saw the loss
    assert live != same != cut


def test_a_sharded_live_build_against_an_unsharded_candidate(scifact, encoder, gate, tmp_path):
    source, _, _, docs = scifact
    root = tmp_path / "index"
    _sharded(docs, root, encoder, source, 2, publish=True)
    flat = build_index(docs, root, encoder=encoder, config=_reusing(source), progress=False,
                       publish=False).build_id
    assert is_sharded(current_build_dir(root)) and not is_sharded(root / "builds" / flat)
    report = check(root, flat, gate, encoder=encoder)
    checks = _checks(report)
    assert checks["document count"][0] == "passed"
    assert checks["documents changed"][0] == "passed", report.text()
    assert checks["canary overlap"][0] == "passed", report.text()
    assert checks["labeled log nDCG"][0] == "passed", report.text()
