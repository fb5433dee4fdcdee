"""The dense leg on real SciFact vectors: ANN recall against exact search per setting, filters
stay exact (checked against a naive filter over the stored metadata), never-empty searches, and
builds made before the dense leg still load (exact dense search)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from indexes.ann import (
    ANN_DIR,
    NPROBE_LADDER,
    ExactDense,
    IvfDense,
    exact_top,
    ivf_params,
    recall_at,
)
from indexes.manifest import MANIFEST, resolve_build_dir
from retrieval import Retriever, RetrieverConfig
from retrieval.loaded_build import LoadedBuild

# (filter, naive predicate over a document's metadata): wide ones take the IVF + ID selector
# path, narrow ones (< 4096 allowed rows) the exact path over the allowed rows.
FILTERS = [
    ({"department": "cardiology"}, lambda m: m["department"] == "cardiology"),
    ({"year": {"gte": 2000}}, lambda m: m["year"] >= 2000),
    ({"department": "oncology", "year": {"lt": 2003}},
     lambda m: m["department"] == "oncology" and m["year"] < 2003),
    ({"doc_type": {"in": ["review", "trial"]}, "year": 2010},
     lambda m: m["doc_type"] in ("review", "trial") and m["year"] == 2010),
]


@pytest.fixture(scope="module")
def scifact(beir_index, encoder):
    root, queries, qrels = beir_index("scifact")
    vectors = encoder.encode(list(queries.values()))
    return root, queries, qrels, vectors


def test_ann_recall_at_100_per_setting(scifact):
    """Recall@100 of the IVF leg against exact search on the real test queries, per nprobe;
    the nprobe the build chose reaches the 0.98 target."""
    root, _, _, vectors = scifact
    snapshot = LoadedBuild.load(root)
    dense = snapshot.dense
    assert isinstance(dense, IvfDense)
    truth = np.stack([exact_top(snapshot.vectors, v, 100)[0] for v in vectors])
    ladder = {}
    for nprobe in (p for p in NPROBE_LADDER if p <= dense.nlist):
        # faiss itself at this nprobe (IvfDense.search would widen a short answer)
        _, found = dense.index.search(np.ascontiguousarray(vectors), 100, params=ivf_params(nprobe))
        ladder[nprobe] = recall_at(found, truth)
    print("nlist", dense.nlist, "chosen nprobe", dense.nprobe,
          {p: round(r, 4) for p, r in ladder.items()})
    assert ladder[dense.nprobe] >= 0.98
    assert ladder[min(ladder)] < ladder[max(ladder)]  # the ladder measures something


@pytest.mark.parametrize("case", range(len(FILTERS)))
def test_dense_leg_filters_are_exact(scifact, case):
    """Every dense row satisfies the filter (naive check); the allowed top-k matches exact."""
    root, _, _, vectors = scifact
    retriever = Retriever.load(root)
    snapshot = retriever.snapshot
    where, predicate = FILTERS[case]
    allowed = np.array([predicate(snapshot.docs.get(r).metadata)
                        for r in range(snapshot.manifest.n_docs)])
    assert allowed.any()
    recalls = []
    for vector in vectors[:60]:
        rows, _ = snapshot.dense.search(vector, 100, allowed)
        assert allowed[rows].all()
        assert rows.size == min(100, int(allowed.sum()))
        exact_rows, _ = exact_top(snapshot.vectors, vector, 100, np.flatnonzero(allowed))
        recalls.append(len(set(rows.tolist()) & set(exact_rows.tolist())) / exact_rows.size)
    print(where, int(allowed.sum()), "allowed; recall vs exact", round(float(np.mean(recalls)), 4))
    assert np.mean(recalls) >= 0.95
    retriever.close()


@pytest.mark.parametrize("policy", ["guardrail", "union"])
def test_search_with_dense_leg_keeps_filters_and_never_empties(scifact, encoder, policy):
    root, _, _, _ = scifact
    retriever = Retriever.load(root, RetrieverConfig(candidate_policy=policy), encoder=encoder)
    docs = retriever.snapshot.docs
    for where, predicate in FILTERS:
        allowed = sum(predicate(docs.get(r).metadata) for r in range(len(docs)))
        for query in ("cardiovasclar efects of statns", "zqxj wvvk"):  # no known term
            result = retriever.search(query, filters=where, k=10)
            assert len(result.hits) == min(10, allowed)
            assert all(predicate(h.metadata) for h in result.hits)
    retriever.close()


def test_keyword_policy_keeps_the_old_gate(scifact, encoder):
    root, _, _, _ = scifact
    keyword = Retriever.load(root, RetrieverConfig(candidate_policy="keyword"), encoder=encoder)
    assert keyword.search("zqxj wvvk").hits == []
    keyword.close()
    default = Retriever.load(root, encoder=encoder)
    assert len(default.search("zqxj wvvk").hits) == 10
    assert len(default.search("cardiovasclar efects of statns").hits) == 10
    default.close()


def test_tiny_allowed_set_returns_all_of_it(scifact, encoder):
    """A filter allowing a handful of documents, a query sharing no term with any: all of them."""
    root, _, _, _ = scifact
    retriever = Retriever.load(root, encoder=encoder)
    docs = retriever.snapshot.docs
    first = docs.get(3).metadata
    where = {"department": first["department"], "doc_type": first["doc_type"],
             "year": first["year"]}
    allowed = {docs.doc_id(r) for r in range(len(docs))
               if all(docs.get(r).metadata[f] == first[f] for f in where)}
    assert 0 < len(allowed) < 100
    result = retriever.search("zqxj wvvk", filters=where, k=100)
    assert {h.doc_id for h in result.hits} == allowed
    retriever.close()


def test_build_without_ann_loads_with_exact_dense_leg(scifact, encoder, tmp_path):
    """A build from before the dense leg (no ann/, not in the manifest) loads, verified, and
    its dense leg is exact search over the stored vectors: same answers as exact."""
    root, _, _, vectors = scifact
    old = tmp_path / "old-build"
    shutil.copytree(resolve_build_dir(root), old)
    shutil.rmtree(old / ANN_DIR)
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items()
                         if not k.startswith(ANN_DIR + "/")}
    (old / MANIFEST).write_text(json.dumps(manifest))
    snapshot = LoadedBuild.load(old, verify=True)
    assert type(snapshot.dense) is ExactDense
    rows, _ = snapshot.dense.search(vectors[0], 10)
    assert rows.tolist() == exact_top(snapshot.vectors, vectors[0], 10)[0].tolist()
    retriever = Retriever.load(old, encoder=encoder)
    assert len(retriever.search("cardiovasclar efects of statns").hits) == 10
    retriever.close()


def test_ann_file_is_checksummed(scifact):
    """The faiss file is in the manifest like every file: a changed byte fails the load."""
    root, _, _, _ = scifact
    build = resolve_build_dir(root)
    files = json.loads((build / MANIFEST).read_text())["files"]
    assert f"{ANN_DIR}/ivf.faiss" in files and f"{ANN_DIR}/ann.json" in files
