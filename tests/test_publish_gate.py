"""The publish gate on SciFact: a truncated export refused under load, a different model
refused, canary and labeled-log figures of a --no-stem build checked independently (ranx)."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
from ranx import Qrels, Run, evaluate

from indexes.analyzer import AnalyzerConfig
from indexes.build import BuildConfig, build_index
from indexes.docstore import Document
from indexes.history import read_history
from indexes.manifest import CURRENT, EncoderInfo, current_build_dir
from indexes.publish import list_builds, publish_build
from retrieval import Retriever
from retrieval.cli import main as cli
from retrieval.loaded_build import LoadedBuild
from retrieval.publishing import GateConfig, check, publish

NO_CACHE = {"cache": {"backend": "none"}}


@pytest.fixture(scope="module", name="scifact")
def scifact_fixture(beir_index):
    """(full SciFact build dir, test queries, qrels, documents in row order)."""
    root, queries, qrels = beir_index("scifact")
    source = current_build_dir(root)
    snapshot = LoadedBuild.load(source)
    docs = [snapshot.docs.get(row) for row in range(len(snapshot.docs))]
    return source, queries, qrels, docs


@pytest.fixture()
def live_root(scifact, tmp_path):
    """An index root whose live build is a copy of the full SciFact build."""
    source = scifact[0]
    shutil.copytree(source, tmp_path / "builds" / source.name)
    publish_build(tmp_path, source.name)
    return tmp_path


def _candidate(docs: list[Document], root, encoder, scifact, **config) -> str:
    build = BuildConfig(reuse_from=str(scifact[0].parent.parent), **config)
    return build_index(docs, root, encoder=encoder, config=build, progress=False,
                       publish=False).build_id


def test_truncated_export_is_refused_while_the_live_build_serves(live_root, scifact, encoder,
                                                                  tmp_path, capsys):
    docs = scifact[3]
    live_id = (live_root / CURRENT).read_text().strip()
    kept = docs[: int(len(docs) * 0.6)]  # the nightly export lost 40% of the documents
    staged = _candidate(kept, live_root, encoder, scifact)
    gate = tmp_path / "gate.toml"
    gate.write_text("max_doc_drop = 0.10\n")
    retriever = Retriever.load(live_root, {**NO_CACHE, "reload_interval_seconds": 0.05},
                               encoder=encoder)
    failures: list[BaseException] = []
    served: list[str] = []
    stop = threading.Event()

    def searcher(offset: int) -> None:
        queries = list(scifact[1].values())
        n = offset
        while not stop.is_set():
            try:
                served.append(retriever.search(queries[n % len(queries)], k=10).build_id)
            except BaseException as exc:  # noqa: BLE001 - the test counts every failure
                failures.append(exc)
            n += 4

    threads = [threading.Thread(target=searcher, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        code = cli(["publish", str(live_root), staged, "--gate", str(gate), "--json"])
        retriever.reload()  # as the reloader would: CURRENT still names the live build
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        retriever.close()
    assert code == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # with --json, stdout is the report alone
    out = captured.out + captured.err
    drop = next(c for c in report["checks"] if c["name"] == "document count")
    assert drop["outcome"] == "refused"
    assert drop["figures"]["live_docs"] == len(docs)
    assert drop["figures"]["candidate_docs"] == len(kept)
    assert "a drop of 40.0%" in drop["summary"]
    changed = next(c for c in report["checks"] if c["name"] == "documents changed")
    assert changed["figures"]["removed"] == len(docs) - len(kept)
    assert "stays staged" in out
    assert not failures, failures[:3]
    assert served and set(served) == {live_id}
    assert (live_root / CURRENT).read_text().strip() == live_id
    assert {b.build_id: b.status for b in list_builds(live_root)}[staged] == "staged"


def _rotated(snapshot: LoadedBuild) -> np.ndarray:
    """Another model's vectors: the same documents in a different (rotated) embedding space."""
    rows = np.arange(snapshot.vectors.n_docs)
    vectors = snapshot.vectors.reconstruct_rows(rows)
    rotation, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(vectors.shape[1],) * 2))
    return (vectors @ rotation).astype(np.float32)


def test_a_build_with_another_model_is_refused_unless_allowed(scifact, encoder, tmp_path,
                                                               capsys, build_subset):
    docs = scifact[3][:400]
    live = build_subset(docs, tmp_path)
    other = EncoderInfo(encoder_id="example/other-model:torch:fp32:384", model="other-model",
                        dim=384, vector_dtype="float32")
    staged = build_index(docs, tmp_path, vectors=_rotated(LoadedBuild.load(live.path)),
                         encoder_info=other, progress=False, publish=False).build_id
    assert cli(["publish", str(tmp_path), staged]) == 1
    out = capsys.readouterr().out
    assert "REFUSED encoder: changed from" in out and "other-model" in out
    assert (tmp_path / CURRENT).read_text().strip() == live.build_id
    assert cli(["publish", str(tmp_path), staged, "--allow-encoder-change"]) == 0
    assert "ok      encoder: changed" in capsys.readouterr().out
    assert read_history(tmp_path)[-1].how == "gate"
    assert (tmp_path / CURRENT).read_text().strip() == staged


def _rankings(retriever: Retriever, queries: list[str], vectors: np.ndarray) -> list[list[str]]:
    return [[hit.doc_id for hit in retriever.search(q, k=10, query_vector=v).hits]
            for q, v in zip(queries, vectors, strict=True)]  # one by one, unlike the gate


def _ndcg(rankings: list[list[str]], ids: list[str], qrels: dict) -> float:
    run = Run({q: {doc: 10.0 - rank for rank, doc in enumerate(ranking)}
               for q, ranking in zip(ids, rankings, strict=True)})
    return float(evaluate(Qrels({q: qrels[q] for q in ids}), run, "ndcg@10"))


def test_canary_and_labeled_log_figures_of_a_no_stem_build(live_root, scifact, encoder,
                                                           tmp_path):
    source, queries, qrels, docs = scifact
    staged = _candidate(docs, live_root, encoder, scifact,
                        analyzer=AnalyzerConfig(stemmer=None))
    ids = sorted(queries)
    canary_ids, labeled_ids = ids[:50], ids[:100]  # of SciFact's 300 test queries
    with open(tmp_path / "canaries.jsonl", "w") as handle:
        for q in canary_ids:
            handle.write(json.dumps({"query": queries[q], "expected": sorted(qrels[q])}) + "\n")
    with open(tmp_path / "labeled.jsonl", "w") as handle:
        for q in labeled_ids:
            handle.write(json.dumps({"query": queries[q], "relevant": qrels[q]}) + "\n")
    gate = GateConfig(canaries=str(tmp_path / "canaries.jsonl"),
                      labeled_log=str(tmp_path / "labeled.jsonl"), min_canary_overlap=0.9,
                      min_expected_recall=0.0, max_ndcg_drop=0.02)
    refused = check(live_root, staged, gate, encoder=encoder)
    assert refused.check("analyzer").outcome == "refused"
    assert "stemmer 'english' -> None" in refused.check("analyzer").summary
    assert refused.check("canary overlap").outcome == "skipped"

    outcome = publish(live_root, staged, gate, allow_analyzer_change=True, force=True,
                      encoder=encoder)
    report = outcome.report
    texts = [queries[q] for q in labeled_ids]
    vectors = encoder.encode(texts)
    live = Retriever.load(source, NO_CACHE, encoder=encoder)
    candidate = Retriever.load(live_root / "builds" / staged, NO_CACHE, encoder=encoder)
    try:
        before, after = _rankings(live, texts, vectors), _rankings(candidate, texts, vectors)
    finally:
        live.close()
        candidate.close()
    overlaps = [len(set(a) & set(b)) / 10 for a, b in zip(before[:50], after[:50], strict=True)]
    canary = report.check("canary overlap")
    assert canary.figures["canaries"] == 50
    assert canary.figures["overlaps"] == pytest.approx(overlaps)
    assert canary.figures["mean_overlap"] == pytest.approx(np.mean(overlaps))
    assert 0.0 < np.mean(overlaps) < 1.0  # the analyzer change really moved results
    assert canary.outcome == ("passed" if np.mean(overlaps) >= 0.9 else "refused")
    recall = np.mean([len(set(after[i]) & set(qrels[q])) / len(qrels[q])
                      for i, q in enumerate(canary_ids)])
    assert report.check("canary expected ids").figures["expected_recall_candidate"] == \
        pytest.approx(recall)
    labeled = report.check("labeled log nDCG")
    ndcg_live, ndcg_new = _ndcg(before, labeled_ids, qrels), _ndcg(after, labeled_ids, qrels)
    assert labeled.figures["queries"] == len(labeled_ids) == 100
    assert labeled.figures["ndcg_live"] == pytest.approx(ndcg_live, abs=1e-6)
    assert labeled.figures["ndcg_candidate"] == pytest.approx(ndcg_new, abs=1e-6)
    assert labeled.outcome == ("refused" if ndcg_live - ndcg_new > 0.02 else "passed")
    assert report.passed == (canary.outcome == labeled.outcome == "passed")
    assert outcome.published and outcome.how == ("gate" if report.passed else "forced")
    assert read_history(live_root)[-1].how == outcome.how


def test_cli_build_stages_or_gates(dataset, tmp_path, capsys):
    lines = (dataset("scifact") / "corpus.jsonl").read_text().splitlines()[:40]
    full, half = tmp_path / "full.jsonl", tmp_path / "half.jsonl"
    full.write_text("\n".join(lines) + "\n")
    half.write_text("\n".join(lines[:20]) + "\n")
    root = tmp_path / "idx"
    with pytest.raises(SystemExit):  # a bad gate file fails before the build starts
        cli(["build", "--corpus", str(full), "--out", str(root), "--gate", "none.toml"])
    assert "gate file none.toml does not exist" in capsys.readouterr().err
    assert cli(["build", "--corpus", str(full), "--out", str(root)]) == 0
    live = (root / CURRENT).read_text().strip()
    (tmp_path / "gate.json").write_text('{"max_doc_drop": 0.25}')
    assert cli(["build", "--corpus", str(half), "--out", str(root),
                "--gate", str(tmp_path / "gate.json")]) == 1
    assert "a drop of 50.0%, more than the 25.0% allowed" in capsys.readouterr().out
    assert cli(["build", "--corpus", str(half), "--out", str(root), "--gate",
                str(tmp_path / "gate.json"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["passed"] is False  # the JSON alone
    assert cli(["build", "--corpus", str(half), "--out", str(root), "--no-publish",
                "--gate", str(tmp_path / "gate.json")]) == 2  # it ran no gate, and said 0
    assert "give one" in capsys.readouterr().err
    assert cli(["build", "--corpus", str(full), "--out", str(root), "--no-publish"]) == 0
    assert "staged build" in capsys.readouterr().out
    assert (root / CURRENT).read_text().strip() == live
    assert sorted(b.status for b in list_builds(root)) == ["live", "staged", "staged", "staged"]


def test_the_gate_searches_without_the_serving_deadline_cache_or_reloads():
    """Its canaries run as one batch, and a batch's deadline is one budget for all of them:
    under the serving deadline the later canaries would skip the feature read, and the
    verdict would depend on the machine's speed."""
    from retrieval.publishing.gate import _gate_config

    serving = {"deadline_ms": 20, "cache": {"backend": "memory"}, "reload_interval_seconds": 5}
    config = _gate_config(serving)
    assert (config.deadline_ms, config.cache.backend, config.reload_interval_seconds) == \
        (None, "none", None)
