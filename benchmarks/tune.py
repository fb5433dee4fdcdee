"""Choosing the default ranking without the test qrels: a staged sweep on SciFact's train qrels,
checked on Cranfield and CISI (which have only one qrels set), reported on SciFact test.

    python -m benchmarks.tune                 # all three collections (a few minutes)

Stages (each keeps the best of the one before, by SciFact train nDCG@10):
  A. fusion normalization x weight: minmax / zscore at w in 0.5..0.9, and rrf (C=300, union)
  B. candidate policy x C: keyword / guardrail / union at C in 100, 300, 1000
  C. title boost: BM25 over the title twice (precomputed vectors reused, no re-encoding)
  D. dense budget: union with C' (dense_candidates) in 10..100, and C' = 30 at C = 200, 500

    python -m benchmarks.tune --stages D      # stage D only (no title-boosted builds)

Query vectors are encoded once per collection and kept under build/tune/ (keyed by the texts
and the encoder id), so each point, and each rerun, costs only the search path.
Every point reports nDCG@10 and recall@100 on every qrels set; only train picks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, environment, markdown_table, write_results
from benchmarks.quality import dense_run, evaluate_run, retriever_run
from indexes import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.docstore import Document
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.vectors import VectorStore
from retrieval import Retriever, RetrieverConfig

DATA = REPO.parent / "shared" / "data"
WORK = REPO / "build" / "tune"
WEIGHTS = (0.5, 0.6, 0.7, 0.8, 0.9)
DENSE_BUDGETS = (10, 20, 30, 50, 100)


@dataclass
class Collection:
    name: str
    roots: dict[int, Path]  # title repeats -> index root
    qrels: dict[str, dict[str, dict[str, int]]]  # split -> qrels
    queries: dict[str, str]
    vectors: dict[str, np.ndarray]  # query id -> vector


def title_boosted(docs: list[Document], repeats: int) -> list[Document]:
    """The title ``repeats`` times in the indexed text (the stored vectors are reused)."""
    return [replace(d, text=" ".join([d.title] * (repeats - 1) + [d.text])) for d in docs]


def load_collection(name: str, encoder: Any, boosts: tuple[int, ...]) -> Collection:
    path = DATA / name
    docs = list(read_corpus(path))
    base = WORK / name
    build_index(docs, base, encoder=encoder, progress=False,
                config=BuildConfig(reuse_from=str(REPO / "build" / "test-indexes" / name)))
    roots = {1: base}
    live = resolve_build_dir(base)
    matrix = VectorStore.load(live / "vectors").reconstruct_all()
    for repeats in (b for b in boosts if b > 1):
        roots[repeats] = WORK / f"{name}-title{repeats}"
        build_index(title_boosted(docs, repeats), roots[repeats], vectors=matrix,
                    encoder_info=read_manifest(live).encoder, progress=False)
    splits = {s: read_qrels(path / "qrels" / f"{s}.tsv") for s in ("train", "test")
              if (path / "qrels" / f"{s}.tsv").is_file()}
    wanted = set().union(*splits.values())
    queries = {q: t for q, t in read_queries(path / "queries.jsonl").items() if q in wanted}
    encoded = cached_encode(encoder, list(queries.values()), WORK / f"{name}-queries")
    vectors = dict(zip(queries, encoded, strict=True))
    return Collection(name, roots, splits, queries, vectors)


def cached_encode(encoder: Any, texts: list[str], stem: Path) -> np.ndarray:
    """Query vectors from ``stem``-<hash>.npy when the same texts were encoded by the same
    encoder before (tuning reruns cost only the search path), else encoded and stored."""
    key = hashlib.sha256(json.dumps([encoder.encoder_id, texts]).encode()).hexdigest()[:16]
    path = stem.with_name(f"{stem.name}-{key}.npy")
    if path.is_file():
        return np.load(path, allow_pickle=False)
    vectors = np.asarray(encoder.encode(texts), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors, allow_pickle=False)
    return vectors


def score(c: Collection, config: RetrieverConfig, repeats: int, encoder: Any
          ) -> dict[str, dict[str, float]]:
    retriever = Retriever.load(c.roots[repeats], config, encoder=encoder)
    try:
        out = {}
        for split, qrels in c.qrels.items():
            queries = {q: c.queries[q] for q in qrels}
            vectors = np.stack([c.vectors[q] for q in queries])
            out[split] = evaluate_run(qrels, retriever_run(retriever, queries,
                                                           query_vectors=vectors))
            # What a k=10 caller sees: the dense leg then adds max(C', 10) rows, not 100.
            out[split]["ndcg@10 (k=10)"] = evaluate_run(qrels, retriever_run(
                retriever, queries, k=10, query_vectors=vectors), ("ndcg@10",))["ndcg@10"]
        return out
    finally:
        retriever.close()


def dense_scores(c: Collection, encoder: Any) -> dict[str, dict[str, float]]:
    retriever = Retriever.load(c.roots[1], encoder=encoder)
    try:
        return {split: evaluate_run(qrels, dense_run(
            retriever, {q: c.queries[q] for q in qrels},
            np.stack([c.vectors[q] for q in qrels]))) for split, qrels in c.qrels.items()}
    finally:
        retriever.close()


def pick_split(c: Collection) -> str:
    return "train" if "train" in c.qrels else "test"


def sweep(collections: list[Collection], encoder: Any, boosts: tuple[int, ...],
          stages: str = "ABCD") -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    tune = collections[0]

    def run(stage: str, repeats: int = 1, **knobs: Any) -> dict[str, Any]:
        config = RetrieverConfig(**knobs)
        point = {"stage": stage, "title_repeats": repeats, **knobs,
                 "scores": {c.name: score(c, config, repeats, encoder) for c in collections}}
        points.append(point)
        print(stage, repeats, knobs, {k: round(v, 4) for k, v in point["scores"][tune.name][
            pick_split(tune)].items()}, flush=True)
        return point

    def best(stage: str) -> dict[str, Any]:
        return max((p for p in points if p["stage"] == stage),
                   key=lambda p: p["scores"][tune.name][pick_split(tune)]["ndcg@10"])

    run("baseline", candidate_policy="keyword", vector_weight=0.0)
    if stages == "D":
        dense_budget(run, {"fusion": "zscore", "vector_weight": 0.6})
        return points
    for fusion in ("minmax", "zscore"):
        for weight in WEIGHTS:
            run("A", candidate_policy="union", fusion=fusion, vector_weight=weight)
    run("A", candidate_policy="union", fusion="rrf")
    a = best("A")
    knobs = {"fusion": a["fusion"], "vector_weight": a.get("vector_weight", 0.7)}
    for policy in ("keyword", "guardrail", "union"):
        for c in (100, 300, 1000):
            run("B", candidate_policy=policy, candidates=c, **knobs)
    b = best("B")
    knobs.update(candidate_policy=b["candidate_policy"], candidates=b["candidates"])
    for repeats in (r for r in boosts if r > 1):
        run("C", repeats, **knobs)
    dense_budget(run, {"fusion": knobs["fusion"], "vector_weight": knobs["vector_weight"]})
    return points


def dense_budget(run: Callable[..., dict[str, Any]], knobs: dict[str, Any]) -> None:
    """D. How few dense rows buy union's recall: the dense leg's cost grows with C'."""
    for dense in DENSE_BUDGETS:
        run("D", candidate_policy="union", dense_candidates=dense, **knobs)
    for candidates in (200, 500):
        run("D", candidate_policy="union", dense_candidates=30, candidates=candidates, **knobs)
    run("D", candidate_policy="guardrail", **knobs)


def report(points: list[dict[str, Any]], dense: dict[str, Any], names: list[str]) -> str:
    knobs = ("stage", "title_repeats", "candidate_policy", "fusion", "vector_weight",
             "candidates", "dense_candidates")
    headers = [*knobs, *(f"{n} {s}" for n in names for s in ("train", "test")
                         if s in points[0]["scores"][n])]
    rows = []
    for p in [*points, dense]:
        cells = [p.get(k, "") for k in knobs]
        for n in names:
            for s in ("train", "test"):
                if s in points[0]["scores"][n]:
                    m = p["scores"][n][s]
                    cells.append(f"{m['ndcg@10']:.4f} / {m['recall@100']:.3f}"
                                 + (f" ({m['ndcg@10 (k=10)']:.4f})" if "ndcg@10 (k=10)" in m
                                    else ""))
        rows.append(cells)
    return ("nDCG@10 / recall@100 of k=100 runs (nDCG@10 of k=10 runs) per collection and "
            f"qrels split; the default is picked on {names[0]} train only.\n\n"
            + markdown_table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "cisi"])
    parser.add_argument("--title-repeats", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--stages", choices=("ABCD", "D"), default="ABCD",
                        help="D: only the dense budget (C') stage, at z-score 0.6")
    args = parser.parse_args()
    from indexes.encoders import SentenceTransformerEncoder

    encoder = SentenceTransformerEncoder()
    boosts = (1, *args.title_repeats) if args.stages != "D" else (1,)
    collections = [load_collection(n, encoder, boosts) for n in args.collections]
    points = sweep(collections, encoder, boosts, args.stages)
    dense = {"stage": "dense-only (exact)",
             "scores": {c.name: dense_scores(c, encoder) for c in collections}}
    markdown = report(points, dense, args.collections)
    print(markdown)
    json_path, _ = write_results("tune", {"environment": environment(), "points": points,
                                          "dense": dense}, markdown)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
