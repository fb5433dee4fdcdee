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
    build_ann,
    ivf_params,
    load_dense,
    make_dense,
    recall_at,
)
from indexes.ann_exact import exact_top, exact_top_masked
from indexes.ann_hnsw import EF_LADDER, MAX_EF, HnswDense, calibrated_ef, hnsw_params
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


def test_asking_the_dense_leg_for_more_rows_than_the_build_holds_gives_them_all(scifact):
    """faiss allocates its result arrays for k: a console side asking for 10**9 dense
    candidates took 7.45 GB for them, and a larger one killed the server."""
    root, _, _, vectors = scifact
    snapshot = LoadedBuild.load(root)
    rows, scores = snapshot.dense.search(vectors[0], 10**12)
    assert len(rows) == len(scores) == snapshot.vectors.n_docs


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
    (old / f"{MANIFEST}.sha256").unlink()  # a build from then has no sha256 of its manifest
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


def test_guardrail_min_bm25_calls_the_dense_leg_on_a_weak_best_score(scifact, encoder):
    """A best BM25 score below ``guardrail_min_bm25`` adds the dense leg's rows; at it (and
    with enough BM25 candidates for the count floor) the candidates stay BM25's."""
    root, _, _, _ = scifact
    query = "statin therapy and cardiovascular risk"
    vector = encoder.encode([query])[0]
    keyword = Retriever.load(root, RetrieverConfig(candidate_policy="keyword"), encoder=encoder)
    snapshot = keyword.snapshot
    bm25_rows, bm25_scores = snapshot.bm25.top_candidates(snapshot.analyzer(query), 300)
    assert bm25_rows.size == 300  # the count floor (max(k, C/10)) cannot fire
    base = keyword.search(query, k=10, query_vector=vector)
    dense_rows, _ = snapshot.dense.search(vector, RetrieverConfig().dense_candidates)
    keyword.close()
    best = float(bm25_scores[0])

    def candidates(min_bm25: float) -> int:
        retriever = Retriever.load(root, RetrieverConfig(
            candidate_policy="guardrail", guardrail_min_bm25=min_bm25), encoder=encoder)
        found = retriever.search(query, k=10, query_vector=vector).candidates
        retriever.close()
        return found

    added = set(dense_rows.tolist()) - set(bm25_rows.tolist())
    assert added
    assert candidates(best) == base.candidates == 300
    assert candidates(best + 0.01) == 300 + len(added)


def test_hnsw_recall_per_setting_and_exact_filters(scifact, tmp_path):
    """The HNSW alternative on SciFact's vectors: recall@100 against exact search per ef, the
    calibrated ef reaches the 0.98 target on the real test queries, and filters stay exact."""
    root, _, _, vectors = scifact
    snapshot = LoadedBuild.load(root)
    matrix = snapshot.vectors.reconstruct_all()
    meta = build_ann(matrix, tmp_path / ANN_DIR, kind="hnsw")
    dense = load_dense(tmp_path, snapshot.vectors)
    assert isinstance(dense, HnswDense) and meta["kind"] == "hnsw"
    queries = np.ascontiguousarray(vectors)
    truth = np.stack([exact_top(snapshot.vectors, v, 100)[0] for v in vectors])
    ladder = {ef: recall_at(dense.index.search(queries, 100, params=hnsw_params(ef))[1], truth)
              for ef in EF_LADDER[:9]}
    chosen = recall_at(np.stack([dense.search(v, 100)[0] for v in vectors]), truth)
    print("ef per k", dense.ef_by_k, {ef: round(r, 4) for ef, r in ladder.items()},
          "calibrated", round(chosen, 4))
    assert chosen >= 0.98
    assert ladder[EF_LADDER[0]] < ladder[EF_LADDER[8]]
    where, predicate = FILTERS[1]  # wide: the HNSW + ID selector path
    allowed = np.array([predicate(snapshot.docs.get(r).metadata)
                        for r in range(snapshot.manifest.n_docs)])
    for vector in vectors[:30]:
        rows, _ = dense.search(vector, 100, allowed)
        assert rows.size == 100 and allowed[rows].all()


def test_vectors_that_do_not_cluster_get_the_exact_scan(tmp_path):
    """IVF on random vectors reaches the recall only by probing every list (a full scan plus
    the list overhead): the build stores the exact leg instead and says why."""
    from indexes.vectors import VectorStore

    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((4000, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    meta = build_ann(matrix, tmp_path / ANN_DIR)
    assert meta["kind"] == "exact" and "needs every list" in meta["fallback"]
    assert meta["calibration"][-1]["recall_at_100"] < 0.99  # IVF was tried and fell short
    assert not (tmp_path / ANN_DIR / "ivf.faiss").exists()
    vectors = VectorStore.build(matrix)
    dense = load_dense(tmp_path, vectors)
    assert type(dense) is ExactDense
    query = matrix[0] + 0.1 * matrix[1]
    rows, scores = dense.search(query, 10)
    truth = np.argsort(-(matrix @ (query / np.linalg.norm(query))), kind="stable")[:10]
    assert rows.tolist() == truth.tolist()
    clustered = np.repeat(matrix[:40], 100, axis=0) + 0.01 * rng.standard_normal((4000, 384))
    clustered = (clustered / np.linalg.norm(clustered, axis=1, keepdims=True)).astype(np.float32)
    assert build_ann(clustered, tmp_path / "clustered")["kind"] == "ivf"


def test_the_full_exact_scan_equals_the_gathered_one():
    from indexes.vectors import VectorStore

    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((50_000, 16)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[5]
    for dtype in ("float32", "int8"):
        store = VectorStore.build(matrix, dtype)
        everything = np.arange(store.n_docs)
        assert np.allclose(store.scores_all(query), store.scores(query, everything), atol=1e-5)
        rows, _ = exact_top(store, query, 20)
        assert rows[0] == 5
        for share in (0.9, 0.5, 0.1, 0.0005):  # wide masks score in place, narrow ones gather
            mask = rng.random(store.n_docs) < share
            want_rows, want_scores = exact_top(store, query, 20, np.flatnonzero(mask))
            got_rows, got_scores = exact_top_masked(store, query, 20, mask)
            assert got_rows.tolist() == want_rows.tolist()
            assert np.allclose(got_scores, want_scores, atol=1e-5)


def tied_matrix(n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """(query e0, rows scoring 1 (every 10th), 0.6 (duplicates, every 3rd) or 0 (the rest))."""
    matrix = np.zeros((n, 8), dtype=np.float32)
    matrix[:, 7] = 1.0
    matrix[np.arange(n) % 3 == 1] = [0.6, 0.8, 0, 0, 0, 0, 0, 0]
    matrix[np.arange(n) % 10 == 0] = np.eye(8, dtype=np.float32)[0]
    return np.eye(8, dtype=np.float32)[0], matrix


def test_rows_tied_at_the_kth_score_are_the_lowest_ones():
    """The exact leg kept an arbitrary few of the rows tied at the k-th score (argpartition),
    though ties go to the lower row: a sharded build, whose merge keeps the lowest rows,
    returned other duplicate documents than the whole build."""
    from indexes.vectors import VectorStore
    from retrieval.sharding.whole import merged_top

    query, matrix = tied_matrix()
    n, k = matrix.shape[0], 50  # 30 rows score 1, 20 of the 100 scoring 0.6 are kept
    for dtype in ("float32", "int8"):
        store = VectorStore.build(matrix, dtype)
        scores = store.scores_all(query)
        for mask in (None, np.arange(n) % 2 == 0, np.arange(n) % 5 == 1):
            allowed = np.arange(n) if mask is None else np.flatnonzero(mask)
            want = allowed[np.lexsort((allowed, -scores[allowed]))][:k]  # the naive order
            got, _ = exact_top(store, query, k) if mask is None else exact_top_masked(
                store, query, k, mask)
            assert got.tolist() == want.tolist(), (dtype, mask is None)
            parts = [(a, exact_top(VectorStore.build(matrix[a:b], dtype), query, k,
                                   None if mask is None else np.flatnonzero(mask[a:b])))
                     for a, b in ((0, 97), (97, 210), (210, n))]
            merged, _ = merged_top([part for _, part in parts],
                                   np.array([a for a, _ in parts]), k)
            assert merged.tolist() == want.tolist()


def test_the_best_of_scores_with_nan_rank_nan_last():
    """A NaN score ranks below every number; it fills the best n only when too few numbers
    are left."""
    from indexes.topk import best_first

    scores = np.array([np.nan, 0.5, np.nan, 0.9, 0.5], dtype=np.float32)
    rows = np.arange(5)
    assert best_first(rows, scores, 2).tolist() == [3, 1]
    assert best_first(rows, scores, 4).tolist() == [3, 1, 4, 0]
    assert best_first(rows, scores, 9).tolist() == [3, 1, 4, 0, 2]
    assert best_first(rows, scores, 0).tolist() == []


def test_exact_neighbours_of_no_neighbours_and_of_nan_scores():
    """k = 0 gives no rows; a NaN score never enters a query's best k."""
    from indexes.ann_train import exact_neighbours

    matrix = np.eye(4, dtype=np.float32)
    matrix[3, 3] = np.nan  # row 3 scores NaN against any query
    queries = np.array([[0, 0, 2, 1], [1, 0, 0, 1]], dtype=np.float32)
    assert exact_neighbours(matrix, queries, 0).shape == (2, 0)
    found = exact_neighbours(matrix, queries, 2)
    assert 2 in found[0] and 3 not in found[0]
    assert 0 in found[1] and 3 not in found[1]


def test_exact_neighbours_by_blocks_are_the_exact_top_k():
    from indexes.ann_train import exact_neighbours

    rng = np.random.default_rng(11)
    matrix = rng.standard_normal((5000, 32)).astype(np.float32)
    queries = rng.standard_normal((7, 32)).astype(np.float32)
    truth = np.argsort(-(queries @ matrix.T), axis=1, kind="stable")
    for k, block in ((100, 1000), (100, 64), (10, 5000), (6000, 999)):
        found = exact_neighbours(matrix, queries, k, block)
        assert found.shape == (7, min(k, 5000))
        for got, want in zip(found, truth[:, :k], strict=True):
            assert sorted(got.tolist()) == sorted(want.tolist())


def test_two_level_lists_fit_as_well_as_flat_kmeans():
    """Lists trained in two levels fit the points at least as well as faiss' flat k-means with
    its default 25 rounds (mean squared distance to the nearest list, over three corpora of
    60 tight clusters; k-means' local minima leave some clusters sharing a list either way)."""
    import faiss

    from indexes.ann_train import train_two_level

    def fit(points: np.ndarray, lists: np.ndarray) -> float:
        return float(np.mean(np.min(((points[:, None] - lists[None]) ** 2).sum(-1), axis=1)))

    two_level = flat = 0.0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        centres = rng.standard_normal((60, 48)).astype(np.float32)
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        points = np.repeat(centres, 50, axis=0) + 0.02 * rng.standard_normal((3000, 48))
        points = points.astype(np.float32)
        lists = train_two_level(points, 60, seed=0)
        assert lists.shape == (60, 48) and lists.dtype == np.float32
        kmeans = faiss.Kmeans(48, 60, niter=25, seed=0)
        kmeans.train(points)
        two_level += fit(points, lists)
        flat += fit(points, kmeans.centroids)
    assert two_level <= 1.05 * flat
    assert len(train_two_level(points[:30], 60, seed=0)) == 30  # fewer points than lists


def test_a_build_with_many_lists_calibrates_with_a_few_probed(tmp_path):
    """256 lists trained in two levels on clustered vectors reach the calibration's recall
    with a fraction of the lists probed."""
    lists = 256
    rng = np.random.default_rng(9)
    centres = rng.standard_normal((80, 32)).astype(np.float32)  # a query's 100 in its cluster
    matrix = np.repeat(centres, 150, axis=0) + 0.05 * rng.standard_normal((12_000, 32))
    matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)
    meta = build_ann(matrix, tmp_path / ANN_DIR, nlist=lists)
    assert meta["kind"] == "ivf" and meta["nlist"] == lists
    assert meta["nprobe"] < lists // 4
    assert meta["calibration"][-1]["recall_at_100"] >= 0.99


def test_lists_hold_8_bit_vectors_and_float32_lists_still_load(tmp_path):
    """A build's IVF lists hold 8 bits a dimension (a quarter of float32's bytes), calibrated
    against exact search over those same 8-bit vectors; a build whose lists are float32
    (IVF-Flat, as builds wrote them before) loads and searches with its nprobe as it did."""
    import faiss

    from benchmarks.ann import float32_lists
    from benchmarks.synthetic import clustered_unit_vectors
    from indexes.vectors import VectorStore

    matrix = clustered_unit_vectors(20_000, 384, seed=11)  # clusters as loose as SciFact's
    meta = build_ann(matrix, tmp_path / ANN_DIR)
    assert meta["kind"] == "ivf" and meta["calibration"][-1]["recall_at_100"] >= 0.99
    vectors = VectorStore.build(matrix)
    dense = load_dense(tmp_path, vectors)
    assert isinstance(dense.index, faiss.IndexIVFScalarQuantizer)
    assert dense.index.code_size == matrix.shape[1]  # one byte a dimension
    flat = float32_lists(dense.index, matrix)
    flat_size = len(faiss.serialize_index(flat))
    assert (tmp_path / ANN_DIR / "ivf.faiss").stat().st_size < flat_size / 3

    old = tmp_path / "old"
    shutil.copytree(tmp_path / ANN_DIR, old / ANN_DIR)
    faiss.write_index(flat, str(old / ANN_DIR / "ivf.faiss"))
    old_dense = load_dense(old, vectors)
    assert isinstance(old_dense, IvfDense) and old_dense.nprobe == meta["nprobe"]
    assert isinstance(old_dense.index, faiss.IndexIVFFlat)
    queries = clustered_unit_vectors(40, 384, seed=12, centers_of=len(matrix))
    for query in queries:
        rows, _ = old_dense.search(query, 10)
        assert rows.tolist() == flat.search(query.reshape(1, -1), 10,
                                            params=ivf_params(meta["nprobe"]))[1][0].tolist()
    truth = np.stack([exact_top(vectors, q, 100)[0] for q in queries])  # the re-rank store
    found = np.stack([dense.search(q, 100)[0] for q in queries])
    assert recall_at(found, truth) >= 0.98


def test_duplicate_vectors_do_not_widen_the_calibration():
    """Exact search keeps one of the rows tied at the k-th score; an index finding another
    counted as a miss, and 3% duplicates drove HNSW to its widest ef (4,096, ~66x slower)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(40, 64)).astype(np.float32)
    matrix = centers[rng.integers(0, 40, 4000)] + 0.3 * rng.normal(size=(4000, 64)).astype(
        np.float32)
    matrix[:120] = matrix[0]
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    hnsw = make_dense(matrix, kind="hnsw").meta
    if hnsw["kind"] == "exact":  # faiss' AVX2 kernels built a graph the duplicates trap
        assert "stopped gaining" in hnsw["fallback"], hnsw
        assert calibrated_ef({int(k): [(s["ef"], s[f"recall_at_{k}"]) for s in ladder]
                              for k, ladder in hnsw["calibration"].items()}) is None
        return
    assert max(hnsw["ef_search"].values()) < EF_LADDER[-1], hnsw["ef_search"]
    for k, ladder in hnsw["calibration"].items():  # the chosen setting reached the target
        chosen = next(step for step in ladder if step["ef"] == hnsw["ef_search"][k])
        assert chosen[f"recall_at_{k}"] >= hnsw["calibrated_to"]


def test_hnsw_breadth_stops_where_recall_stops_gaining():
    """ef widens to reach the target, to MAX_EF while the widest step still gained, and
    not at all once recall stopped gaining short of it (the exact scan instead): a trapped
    graph at ef 4,096 cost ~66x and found nothing more."""
    rising = [(512, 0.97), (768, 0.98), (1024, 0.99)]
    reached = [(16, 0.98), (24, 0.996)]
    flat = [(16, 0.9795), (24, 0.9805), (1024, 0.9805)]
    assert calibrated_ef({10: reached, 100: rising}) == {10: 24, 100: MAX_EF}
    assert calibrated_ef({10: flat, 100: reached}) is None
