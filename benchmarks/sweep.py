"""Parameter sweep: quality and p95 per point, and the Pareto front (max nDCG@10, min p95).

    python -m benchmarks.sweep                  # SciFact (../shared/data/scifact)
    python -m benchmarks.sweep --tiny           # smoke run on a SciFact subset

Knobs: BM25 candidates C in {100, 300, 1000}; min-max weight of the cosine in {0.5, 0.7, 0.9};
query encoder backend (torch, onnx, onnx-int8: the ONNX ones when
``indexes.onnx_encoder.make_encoder`` works); stored vector dtype (float32, int8: the int8 copy
is built with ``BuildConfig(reuse_from=...)``, so no document is re-encoded).

Per point: nDCG@10 and recall@100 on the judged queries, queried with that backend's
single-query vectors; search-path latency (vector given, k=10) of every point side by side on
all queries, warm-up discarded. The backend changes latency only through encoding, which does
not depend on C, the weight or the dtype, so end-to-end latency (the query encoded in the call)
is measured per backend x dtype at the default C and weight, side by side. Pareto fronts are
given for both latencies.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from benchmarks import plots
from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    artifact_sizes,
    environment,
    fmt_ms,
    markdown_table,
    measure_in_chunks,
    pareto_front,
    single_thread,
    write_results,
)
from benchmarks.quality import evaluate_run, retriever_run
from benchmarks.suite import DEFAULT_DATA, Workload, load_workload
from indexes import BuildConfig, build_index
from retrieval import Retriever

CANDIDATES, WEIGHTS, DTYPES = (100, 300, 1000), (0.5, 0.7, 0.9), ("float32", "int8")
BACKENDS = ("torch", "onnx", "onnx-int8")
DEFAULT_C, DEFAULT_WEIGHT, K = 300, 0.7, 10


def encoders(w: Workload, wanted: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Query encoders per backend (torch is the workload's); unavailable ones with the reason."""
    found, skipped = {"torch": w.encoder}, {}
    for backend in (b for b in wanted if b != "torch"):
        try:
            from indexes.onnx_encoder import make_encoder

            found[backend] = make_encoder(backend)
        except Exception as exc:  # missing module or failed export: skip the knob, say why
            skipped[backend] = f"{type(exc).__name__}: {exc}"
    return {b: e for b, e in found.items() if b in wanted}, skipped


def single_query_vectors(encoder: Any, queries: Sequence[str], backend: str) -> np.ndarray:
    """One ``encode([query])`` per query, as the retriever embeds a query on a cache miss."""
    return np.vstack([encoder.encode([q]) for q in tqdm(queries, desc=f"encode ({backend})")])


def int8_copy(w: Workload, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The same corpus with int8 vectors, reusing the float32 build's vectors by content hash."""
    root = w.root.with_name(w.root.name + "-int8")
    started = time.perf_counter()
    report = build_index(w.docs or [], root, encoder=w.encoder, progress=False,
                         config=BuildConfig(vector_dtype="int8", reuse_from=str(w.root)))
    return root, {"seconds": round(time.perf_counter() - started, 2),
                  "vectors_reused": report.vectors_reused,
                  "vectors_encoded": report.vectors_encoded,
                  "sizes": artifact_sizes(report.path)}


def grid(args: argparse.Namespace, backends: Sequence[str]) -> list[dict[str, Any]]:
    return [{"dtype": d, "weight": wt, "candidates": c, "backend": b,
             "label": f"{b} {d} C={c} w={wt}"}
            for d in args.dtypes for wt in args.weights for c in args.candidates for b in backends]


def search_runner(retriever: Retriever, w: Workload, vectors: np.ndarray, c: int
                  ) -> Callable[[int], Any]:
    def run(i: int) -> Any:
        return retriever.search(w.queries[i], k=K, candidates=c, query_vector=vectors[i])
    return run


def e2e_runner(retriever: Retriever, w: Workload) -> Callable[[int], Any]:
    def run(i: int) -> Any:
        return retriever.search(w.queries[i], k=K)
    return run


def sweep(w: Workload, args: argparse.Namespace) -> dict[str, Any]:
    enc, skipped = encoders(w, args.backends)
    vectors = {b: single_query_vectors(e, w.queries, b) for b, e in enc.items()}
    roots, builds = {"float32": w.root}, {"float32": {"sizes": w.build["sizes"]}}
    if "int8" in args.dtypes:
        roots["int8"], builds["int8"] = int8_copy(w, args)
    points = grid(args, list(enc))
    retrievers = {(d, wt): Retriever.load(roots[d], {"vector_weight": wt,
                                                     "cache": {"backend": "none"}},
                                          encoder=w.encoder)
                  for d in args.dtypes for wt in args.weights}
    judged = [i for i, q in enumerate(w.query_ids) if q in (w.qrels or {})]
    judged_queries = {w.query_ids[i]: w.queries[i] for i in judged}
    for p in tqdm(points, desc="quality"):
        run = retriever_run(retrievers[p["dtype"], p["weight"]], judged_queries, k=100,
                            query_vectors=vectors[p["backend"]][judged],
                            candidates=p["candidates"])
        p.update(evaluate_run(w.qrels or {}, run, ("ndcg@10", "recall@100")))
    runners = {p["label"]: search_runner(retrievers[p["dtype"], p["weight"]], w,
                                         vectors[p["backend"]], p["candidates"]) for p in points}
    with single_thread():
        samples = measure_in_chunks(runners, w.measured, w.warm, args.chunk, desc="search path")
    for p in points:
        p["search"] = samples[p["label"]].summary()
        p["p95_search"] = p["search"]["p95"]
    e2e = measure_e2e(w, args, roots, enc, points) if args.e2e else []
    return {"points": points, "e2e": e2e, "skipped": skipped, "builds": builds}


def measure_e2e(w: Workload, args: argparse.Namespace, roots: dict[str, Path],
                enc: dict[str, Any], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Backend x dtype at the default C and weight, the query encoded inside each call."""
    rows, runners = [], {}
    for d in args.dtypes:
        for backend, encoder in enc.items():
            config = {"candidates": DEFAULT_C, "vector_weight": DEFAULT_WEIGHT,
                      "encoder_backend": backend, "cache": {"backend": "none"}}
            label = f"{backend} {d} C={DEFAULT_C} w={DEFAULT_WEIGHT}"
            runners[label] = e2e_runner(Retriever.load(roots[d], config, encoder=encoder), w)
            quality = next((p for p in points if p["label"] == label), {})
            rows.append({"label": label, "backend": backend, "dtype": d,
                         "ndcg@10": quality.get("ndcg@10"),
                         "recall@100": quality.get("recall@100")})
    with single_thread():
        samples = measure_in_chunks(runners, w.measured, w.warm, args.chunk, desc="end to end")
    for row in rows:
        row["e2e"] = samples[row["label"]].summary()
        row["p95_e2e"] = row["e2e"]["p95"]
    return rows


def render(result: dict[str, Any], w: Workload, env: dict[str, Any], args: argparse.Namespace,
           seconds: float) -> str:
    points, e2e = result["points"], result["e2e"]
    front = pareto_front(points, "ndcg@10", "p95_search")
    on_front = {p["label"] for p in front}
    rows = [[p["backend"], p["dtype"], p["candidates"], p["weight"], f"{p['ndcg@10']:.4f}",
             f"{p['recall@100']:.4f}", fmt_ms(p["search"]["p50"]), fmt_ms(p["p95_search"]),
             "**front**" if p["label"] in on_front else ""] for p in points]
    lines = [
        f"# Sweep: {w.name} (git {env['git_sha']}, sources {env['source_digest']})", "",
        f"{w.n_docs:,} documents; quality on {len(w.qrels or {})} judged queries; latency on "
        f"{len(w.measured)} queries after {w.warmup} warm-up, k={K}, one thread, every point "
        f"interleaved in chunks of {args.chunk}. Load average {env['load_average']}; "
        f"run took {seconds / 60:.1f} min.", "",
        "## Every point (search path: query vector given)", "",
        markdown_table(["backend", "dtype", "C", "weight", "nDCG@10", "R@100", "p50 ms",
                        "p95 ms", "Pareto"], rows), "",
        "## Pareto front: max nDCG@10, min search-path p95", "",
        front_table(front, "p95_search"), ""]
    if e2e:
        e2e_front = e2e_pareto(e2e)
        lines += ["## End to end (query encoded in the call), default C and weight", "",
                  markdown_table(["backend", "dtype", "nDCG@10", "p50 ms", "p95 ms", "p99 ms"],
                                 [[r["backend"], r["dtype"], _score(r["ndcg@10"]),
                                   fmt_ms(r["e2e"]["p50"]), fmt_ms(r["p95_e2e"]),
                                   fmt_ms(r["e2e"]["p99"])] for r in e2e]), "",
                  "## Pareto front: max nDCG@10, min end-to-end p95", "",
                  front_table(e2e_front, "p95_e2e"), ""]
    lines += [f"- skipped: {b} ({why})" for b, why in result["skipped"].items()]
    lines += [f"- {d} vectors/: {b['sizes']['vectors'] / 2**20:.2f} MB (whole build "
              f"{b['sizes']['total'] / 2**20:.2f} MB)" + (
                  f"; built in {b['seconds']} s, {b['vectors_reused']} vectors reused, "
                  f"{b['vectors_encoded']} encoded" if "seconds" in b else "")
              for d, b in result["builds"].items()]
    return "\n".join(lines)


def e2e_pareto(rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Rows without quality (default C or weight left out of the grid) cannot be placed."""
    return pareto_front([r for r in rows if r["ndcg@10"] is not None], "ndcg@10", "p95_e2e")


def _score(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def front_table(front: Sequence[Mapping[str, Any]], key: str) -> str:
    return markdown_table(["point", "nDCG@10", "p95 ms"],
                          [[p["label"], f"{p['ndcg@10']:.4f}", fmt_ms(p[key])] for p in front])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="BEIR folder")
    p.add_argument("--tiny", action="store_true", help="smoke run: SciFact subset, few queries")
    p.add_argument("--queries", type=int, default=None, help="cap on queries (default all)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--candidates", type=int, nargs="+", default=list(CANDIDATES))
    p.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--no-e2e", dest="e2e", action="store_false",
                   help="skip the end-to-end (encoder in the call) measurement")
    p.add_argument("--chunk", type=int, default=100)
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    # What beir_workload reads besides the above: the float32 build, reusing vectors.
    args.vector_dtype, args.fresh_build, args.index, args.synthetic = "float32", False, None, None
    if args.tiny:
        args.queries, args.warmup, args.chunk = args.queries or 60, min(args.warmup, 10), 25
    return args


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    started, env = time.perf_counter(), environment()
    w = load_workload(args)
    result = sweep(w, args)
    seconds = time.perf_counter() - started
    markdown = render(result, w, env, args, seconds)
    payload = {"benchmark": "sweep", "environment": env, "seconds": round(seconds, 1),
               "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "workload": w.describe(), **result,
               "front_search": pareto_front(result["points"], "ndcg@10", "p95_search"),
               "front_e2e": e2e_pareto(result["e2e"])}
    json_path, md_path = write_results("sweep", payload, markdown, args.out)
    png = plot(result["points"], payload["front_search"], json_path, w.name)
    print(markdown)
    print(f"\nwrote {json_path}, {md_path}" + (f", {png}" if png else ""))
    return 0


def plot(points: list[dict[str, Any]], front: Sequence[dict[str, Any]], json_path: Path,
         name: str) -> Path | None:
    on_front = {p["label"] for p in front}
    shown = [{"label": p["label"] if p["label"] in on_front else "", "p95": p["p95_search"],
              "ndcg@10": p["ndcg@10"]} for p in points]
    line = [{"p95": p["p95_search"], "ndcg@10": p["ndcg@10"]} for p in front]
    return plots.quality_latency(shown, json_path.with_suffix(".png"),
                                 f"{name}: sweep, nDCG@10 vs search-path p95", front=line)


if __name__ == "__main__":
    raise SystemExit(main())
