"""The benchmark suite: quality, latency, throughput, load and build, ours against peers.

    python -m benchmarks.suite                         # SciFact (../shared/data/scifact)
    python -m benchmarks.suite --tiny                  # smoke run on a SciFact subset
    python -m benchmarks.suite --index ROOT --queries-log queries.jsonl
    python -m benchmarks.suite --synthetic 100000      # latency only, random vectors

Query-log lines: {"query": "...", "filters": {...} (optional), "relevant": ["doc id", ...]
(optional: with it, quality is reported)}.

Side by side in one run, on the same queries and query vectors, warm-up discarded:

- quality (nDCG@10, recall@10/100/1000, MRR@10 via ranx) and search-path latency (query
  vector given, k=10) of our configurations and of the peers (``benchmarks.peers``);
- ours end to end (the query encoded inside the call): cache miss and hit, each encoder
  backend available; cold = the first query of a fresh process after ``Retriever.load``;
- throughput and p95 with 1/4/16 threads sharing one Retriever;
- load time and memory; build time and artifact size per component.

Writes ``benchmarks/results/suite-<timestamp>.{json,md}`` and PNG plots beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from benchmarks import plots
from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    environment,
    measure_concurrency,
    measure_in_chunks,
    measure_side_by_side,
    memory_mb,
    package_version,
    single_thread,
    write_results,
)
from benchmarks.peers import PEERS, PeerData, System, make_peers
from benchmarks.quality import SUITE_METRICS, evaluate_run, run_from_outputs
from benchmarks.search import rank_bm25_budget
from benchmarks.workloads import Workload, load_workload
from retrieval import Retriever, RetrieverConfig
from retrieval.latency import by_stage, summarize

K, QUALITY_K, CONCURRENCY = 10, 1000, (1, 4, 16)
EXTRA_PACKAGES = ("ranx", "onnxruntime", "lancedb", "txtai", "matplotlib", "tqdm")
HIT, MISS = ("hit", "skipped"), ("miss", "miss")


# -- our configurations ------------------------------------------------------------------------


def ours_runner(retriever: Retriever, w: Workload, vectors: np.ndarray | None
                ) -> Callable[[int], Callable[[int], Any]]:
    """Search with the query vector given (``vectors``) or encoded in the call (None)."""
    def runner(k: int) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            r = retriever.search(w.queries[i], w.filters[i], k=k,
                                 query_vector=None if vectors is None else vectors[i])
            return (r.timings, [h.doc_id for h in r.hits], [h.score for h in r.hits],
                    (r.cache.result, r.cache.embedding))
        return run
    return runner


def int8_encoder() -> tuple[Any, str | None]:
    """The ONNX INT8 query encoder, or None and why (another team finishes that module)."""
    try:
        from indexes.onnx_encoder import make_encoder
    except ImportError as exc:
        return None, f"indexes.onnx_encoder.make_encoder not importable ({exc})"
    try:
        return make_encoder("onnx-int8"), None
    except Exception as exc:  # export or runtime failure: report the knob as skipped, go on
        return None, f"onnx-int8 encoder failed: {exc}"


def base_config(args: argparse.Namespace, cache: str = "none") -> dict[str, Any]:
    return {"candidates": args.candidates, "vector_weight": args.weight,
            "cache": {"backend": cache}}


def our_systems(w: Workload, args: argparse.Namespace, notes: dict[str, str]
                ) -> tuple[list[System], dict[str, tuple[Retriever, tuple[str, str]]], Retriever]:
    """Search-path systems (vector given), end-to-end runners (encoder in the call), and the
    default configuration's retriever."""
    policy = RetrieverConfig().candidate_policy
    default = f"ours (C={args.candidates}, zscore {args.weight}, {policy})"
    variants: dict[str, dict[str, Any]] = {
        default: {}, "ours, BM25 only (weight 0)": {"vector_weight": 0.0,
                                                     "candidate_policy": "keyword"},
        "ours, RRF k=60": {"fusion": "rrf"},
        "ours, keyword policy": {"candidate_policy": "keyword"},
        "ours, guardrail policy": {"candidate_policy": "guardrail"}}
    systems, loaded = [], {}
    for label, extra in variants.items():
        loaded[label] = Retriever.load(w.root, {**base_config(args), **extra}, encoder=w.encoder)
        systems.append(System(label, ours_runner(loaded[label], w, w.query_vectors), "ours"))
    e2e: dict[str, tuple[Retriever, tuple[str, str]]] = {}
    if w.encoder is None:
        notes["end to end"] = "no query encoder (synthetic vectors): search path only"
        return systems, e2e, loaded[default]
    repeats = len(w.queries) - len(set(w.queries))
    if repeats:
        notes["repeated queries"] = (f"{repeats} query texts occur twice: the second occurrence "
                                     "is a cache hit in the cache-miss rows")
    torch = Retriever.load(w.root, base_config(args, "memory"), encoder=w.encoder)
    e2e["ours e2e, cache miss (torch)"] = (torch, MISS)
    encoder, why = int8_encoder()
    if encoder is None:
        notes["onnx-int8"] = str(why)
    else:
        vectors = np.vstack([encoder.encode([q]) for q in tqdm(w.queries, desc="onnx-int8")])
        systems.append(System("ours, onnx-int8 query vectors",
                              ours_runner(loaded[default], w, vectors), "ours"))
        config = {**base_config(args, "memory"), "encoder_backend": "onnx-int8"}
        e2e["ours e2e, cache miss (onnx-int8)"] = (
            Retriever.load(w.root, config, encoder=encoder), MISS)
    e2e["ours e2e, cache hit (memory)"] = (torch, HIT)  # runs right after torch's misses
    return systems, e2e, loaded[default]


# -- measurements ----------------------------------------------------------------------------


def metric_depth(metric: str) -> int:
    """The cut-off of a ranx metric name (``ndcg@10`` -> 10)."""
    return int(metric.rsplit("@", 1)[1])


def quality(systems: Sequence[System], w: Workload) -> dict[str, dict[str, float]]:
    """Metrics down to k=K from k=K runs, the configuration whose latency is reported; deeper
    recall from k=QUALITY_K runs. One deep run would not do: ours raises its candidates to k
    and its dense leg's rows to max(C', k), so its top 10 at k=1000 is another configuration's."""
    if not w.qrels:
        return {}
    rows = [i for i, q in enumerate(w.query_ids) if q in w.qrels]
    ids = [w.query_ids[i] for i in rows]
    shallow = tuple(m for m in SUITE_METRICS if metric_depth(m) <= K)
    deep = tuple(m for m in SUITE_METRICS if metric_depth(m) > K)
    scores = {}
    for system in tqdm(systems, desc=f"quality (k={K}, recall from k={QUALITY_K})"):
        found: dict[str, float] = {}
        for depth, metrics in ((K, shallow), (QUALITY_K, deep)):
            run = system.runner(depth)
            found.update(evaluate_run(w.qrels, run_from_outputs(ids, [run(i) for i in rows]),
                                      metrics))
        scores[system.name] = {m: found[m] for m in SUITE_METRICS}
    return scores


def latency(systems: Sequence[System], e2e: dict[str, tuple[Retriever, tuple[str, str]]],
            w: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Every system and end-to-end runner, interleaved in chunks; slow peers on a prefix."""
    fast = {s.name: s.runner(K) for s in systems if s.max_queries is None}
    first = {n: ours_runner(r, w, None)(K) for n, (r, want) in e2e.items() if want == MISS}
    after = {n: ours_runner(r, w, None)(K) for n, (r, want) in e2e.items() if want == HIT}
    retrievers = {id(r): r for r, _ in e2e.values()}.values()

    def flush() -> None:
        for retriever in retrievers:
            retriever.flush_cache_writes(timeout=30)

    with single_thread():
        samples = measure_in_chunks({**fast, **first}, w.measured, w.warm, args.chunk, after,
                                    flush, "latency")
        for s in systems:
            if s.max_queries is not None:
                prefix = w.measured[:s.max_queries]
                samples[s.name] = measure_side_by_side({s.name: s.runner(K)}, prefix,
                                                       w.warm[:5])[s.name]
    return samples


def concurrency(w: Workload, default: Retriever, e2e: dict[str, tuple[Retriever, Any]],
                args: argparse.Namespace) -> dict[str, dict[int, Any]]:
    """Closed-loop threads sharing one Retriever: search path, and end to end when encoding."""
    modes = {"search path (vector given)": ours_runner(default, w, w.query_vectors)(K)}
    if w.encoder is not None:
        uncached = Retriever.load(w.root, base_config(args), encoder=w.encoder)
        modes["end to end, cache off (torch encodes every query)"] = ours_runner(
            uncached, w, None)(K)
        hits = [r for r, want in e2e.values() if want == HIT]
        modes["end to end, cache hit (memory)"] = ours_runner(hits[0], w, None)(K)
    items = w.measured[:args.concurrency_queries]
    results: dict[str, dict[int, Any]] = {mode: {} for mode in modes}
    steps = [(m, c) for m in modes for c in args.concurrency]
    with single_thread():  # as in the latency run: parallelism comes from the threads only
        for mode, threads in tqdm(steps, desc="concurrency"):
            results[mode][threads] = measure_concurrency(modes[mode], items, threads,
                                                         w.warm[:20])
    return results


def cold_probes(w: Workload, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Fresh processes: ``Retriever.load`` (index + encoder), memory, the first queries."""
    probes = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in tqdm(range(args.cold_runs), desc="cold processes"):
            picks = [w.measured[(run * 21 + j) % len(w.measured)] for j in range(21)]
            spec = {"root": str(w.root), "config": base_config(args),
                    "queries": [w.queries[i] for i in picks],
                    "filters": [w.filters[i] for i in picks], "vectors": None}
            if w.encoder is None:
                vectors_path = Path(tmp) / f"q{run}.npy"
                spec["vectors"] = str(vectors_path)
                np.save(vectors_path, w.query_vectors[picks])
            started = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "benchmarks.suite", "--probe",
                                  json.dumps(spec)], capture_output=True, text=True, check=True,
                                 cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            probe = json.loads(out.stdout.strip().splitlines()[-1])
            probe["process_seconds"] = time.perf_counter() - started
            probes.append(probe)
    return probes


def probe(spec: dict[str, Any]) -> int:
    """Child side of ``cold_probes``: prints one JSON line."""
    before = memory_mb()
    started = time.perf_counter()
    retriever = Retriever.load(spec["root"], spec["config"])
    load_seconds = time.perf_counter() - started
    loaded = memory_mb()
    vectors = np.load(spec["vectors"]) if spec["vectors"] else None
    walls, stages = [], []
    for j, (query, filters) in enumerate(zip(spec["queries"], spec["filters"], strict=True)):
        began = time.perf_counter()
        result = retriever.search(query, filters, k=K,
                                  query_vector=None if vectors is None else vectors[j])
        walls.append((time.perf_counter() - began) * 1e3)
        stages.append(result.timings)
    print(json.dumps({"load_seconds": load_seconds, "memory_before_load_mb": before,
                      "memory_after_load_mb": loaded, "memory_after_queries_mb": memory_mb(),
                      "first_query_ms": walls[0], "first_query_stages": stages[0],
                      "next_queries": summarize(walls[1:]),
                      "encoder": retriever.encoder.encoder_id if retriever.encoder else None}))
    retriever.close()
    return 0


# -- assembling ------------------------------------------------------------------------------


def summarize_samples(samples: dict[str, Any], e2e: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, s in samples.items():
        stages = by_stage(o[0] for o in s.outputs if o[0] is not None)
        row: dict[str, Any] = {"queries": len(s.wall_ms), "e2e": s.summary(), "stages": stages}
        if name in e2e:
            want = e2e[name][1]
            row["expected_cache_status"] = list(want)
            row["share_as_expected"] = sum(tuple(o[3]) == want for o in s.outputs) / max(
                len(s.outputs), 1)
        out[name] = row
    return out


def write_plots(stem: Path, samples: dict[str, Any], payload: dict[str, Any]
                ) -> dict[str, str]:
    points = [{"label": n, "kind": s["kind"], "p95": s["latency"]["e2e"]["p95"],
               "ndcg@10": s["quality"]["ndcg@10"]}
              for n, s in payload["systems"].items() if s["quality"]]
    made = {
        "latency_cdf": plots.stage_cdfs(plots.stage_panels(samples),
                                        Path(f"{stem}-latency-cdf.png")),
        "quality_vs_p95": plots.quality_latency(
            points, Path(f"{stem}-quality-p95.png"),
            f"{payload['workload']['name']}: nDCG@10 vs search-path p95 (k={K})"),
        "throughput": plots.throughput(payload["concurrency"], Path(f"{stem}-throughput.png")),
    }
    return {name: str(path) for name, path in made.items() if path is not None}


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    started, notes = time.perf_counter(), dict[str, str]()
    env = environment()
    w = load_workload(args)
    probes = cold_probes(w, args) if args.cold_runs else []
    systems, e2e, default = our_systems(w, args, notes)
    everything = [*systems, *peer_systems(w, args, notes)]
    scores = quality(everything, w)
    samples = latency(everything, e2e, w, args)
    conc = concurrency(w, default, e2e, args)
    summary = summarize_samples(samples, e2e)
    payload = {
        "benchmark": "suite", "schema": 1, "environment": env,
        "versions": {p: package_version(p) for p in EXTRA_PACKAGES},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "workload": w.describe(), "build": w.build, "load": w.load_report(probes),
        "systems": {s.name: {"kind": s.kind, "notes": s.notes, "setup_seconds": s.setup_seconds,
                             "quality": scores.get(s.name), "latency": summary[s.name]}
                    for s in everything},
        "end_to_end": {n: summary[n] for n in e2e},
        "cold": probes, "concurrency": conc, "notes": notes,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return {"payload": payload, "samples": samples}


def peer_systems(w: Workload, args: argparse.Namespace, notes: dict[str, str]) -> list[System]:
    if not args.peers:
        return []
    # Synthetic queries were drawn from the tokenized corpus: the peers reuse it.
    data = PeerData.from_snapshot(w.snapshot, w.queries, w.query_vectors, w.tokens)
    peers, skipped = make_peers(args.peers, data, w.snapshot, args.candidates, args.weight,
                                args.work / "peers")
    notes.update({f"peer {k}": v for k, v in skipped.items()})
    if w.filters_used and peers:
        notes["peers and filters"] = "peers search without the log's filters"
    budget = rank_bm25_budget(w.n_docs, len(w.measured), None)  # seconds per query at 1M
    for peer in peers:
        if peer.name.startswith("rank-bm25") and budget < len(w.measured):
            peer.max_queries = budget
    return peers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--data", type=Path, default=None, help="BEIR folder (default SciFact)")
    source.add_argument("--index", type=Path, help="a built index root (with --queries-log)")
    source.add_argument("--synthetic", type=int, metavar="N", help="N generated documents")
    p.add_argument("--queries-log", type=Path, help="JSONL: query, filters?, relevant?")
    p.add_argument("--tiny", action="store_true", help="smoke run: small subset, few queries")
    p.add_argument("--queries", type=int, default=None, help="cap on queries (default all)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--candidates", type=int, default=300)
    p.add_argument("--weight", type=float, default=0.6, help="weight of the cosine")
    p.add_argument("--vector-dtype", choices=["float32", "float16", "int8"], default="float32")
    p.add_argument("--fresh-build", action="store_true", help="re-encode every document")
    p.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS))
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--concurrency-queries", type=int, default=None)
    p.add_argument("--cold-runs", type=int, default=3, help="fresh processes for cold figures")
    p.add_argument("--chunk", type=int, default=100, help="queries per interleaving turn")
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    if args.index is not None and args.queries_log is None:
        p.error("--index needs --queries-log")
    if args.index is None and args.synthetic is None and args.data is None:
        args.data = DEFAULT_DATA
    if args.tiny:
        args.queries, args.warmup = args.queries or 60, min(args.warmup, 10)
        args.cold_runs, args.concurrency_queries = min(args.cold_runs, 1), 40
        args.chunk = min(args.chunk, 25)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if argv[:1] == ["--probe"]:
        return probe(json.loads(argv[1]))
    args = parse_args(argv)
    result = run_suite(args)
    payload = result["payload"]
    json_path, md_path = write_results("suite", payload, "", args.out)
    payload["plots"] = write_plots(json_path.with_suffix(""), result["samples"], payload)
    markdown = plots.suite_markdown(payload)
    payload["markdown"] = str(md_path)
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md_path.write_text(markdown + "\n")
    print(markdown)
    print(f"\nwrote {json_path}, {md_path}, {', '.join(payload['plots'].values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
