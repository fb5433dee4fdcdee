"""Candidate policies side by side: quality and search-path latency at SciFact, 100k and 1M.

    python -m benchmarks.policies                       # SciFact, 100k and 1M generated docs
    python -m benchmarks.policies --synthetic 100000    # fewer sizes

Per workload and policy (keyword, guardrail, union): nDCG@10 / recall@100 on SciFact's test
qrels (clean queries and the misspelled set), the share of empty results, and search-path
p50/p95/p99 (query vector given, k=10, BLAS on one thread) for the clean queries and the
misspelled ones (one character edited in each word of >= 5 letters), all policies measured
side by side in one process, warm-up discarded. Generated corpora (``benchmarks.synthetic``'s
Zipfian terms) have no judgments: latency only. Their vectors are clustered
(``clustered_unit_vectors``; nobody can encode 1M documents on this machine): uniform random
vectors have no neighbours, so every ANN index degrades to a full scan on them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    REPO,
    environment,
    fmt_ms,
    markdown_table,
    measure_side_by_side,
    single_thread,
    summarize,
    write_results,
)
from benchmarks.quality import evaluate_run, retriever_run, run_from_outputs
from benchmarks.workloads import Workload, load_workload
from retrieval import Retriever, RetrieverConfig

# Named candidate policies measured side by side (config keys over the defaults); "default"
# is RetrieverConfig() unchanged, whatever policy it names.
POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "keyword": {"candidate_policy": "keyword"},
    "guardrail": {"candidate_policy": "guardrail"},
    "union C'=30": {"candidate_policy": "union", "dense_candidates": 30},
}
K = 10


def misspell(text: str) -> str:
    """One character edited in every word of >= 5 letters: the middle letter moved one step
    along the alphabet (z wraps to a), so the word never stays the same."""
    words = []
    for word in text.split():
        if sum(c.isalpha() for c in word) >= 5:
            at = len(word) // 2
            while not word[at].isalpha():
                at = (at + 1) % len(word)
            low = word[at].lower()
            edited = "a" if low == "z" else chr(ord(low) + 1)
            word = word[:at] + (edited.upper() if word[at].isupper() else edited) + word[at + 1:]
        words.append(word)
    return " ".join(words)


def workload_args(args: argparse.Namespace, **source: Any) -> argparse.Namespace:
    base: dict[str, Any] = {
        "data": None, "index": None, "synthetic": None, "queries_log": None, "tiny": False,
        "queries": args.queries, "warmup": args.warmup, "work": args.work,
        "vector_dtype": "float32", "fresh_build": False}
    return argparse.Namespace(**{**base, **source})


def runner(retriever: Retriever, texts: Sequence[str], vectors: np.ndarray
           ) -> Callable[[int], Any]:
    def run(i: int) -> Any:
        r = retriever.search(texts[i], k=K, query_vector=vectors[i])
        return (r.timings, [h.doc_id for h in r.hits], [h.score for h in r.hits])
    return run


def measure_workload(w: Workload, encoder: Any) -> dict[str, Any]:
    typo_texts = [misspell(t) for t in w.queries]
    if w.encoder is not None:
        typo_vectors = encoder.encode(typo_texts, batch_size=64)
    else:  # random vectors: the text changes, the vector stays (no model for generated text)
        typo_vectors = w.query_vectors
    sets = {"clean": (w.queries, w.query_vectors), "misspelled": (typo_texts, typo_vectors)}
    retrievers = {p: Retriever.load(w.root, RetrieverConfig(**knobs, cache={"backend": "none"}),
                                    encoder=w.encoder) for p, knobs in POLICIES.items()}
    default = RetrieverConfig()
    out: dict[str, Any] = {
        "n_docs": w.n_docs, "dense_leg": retrievers["keyword"].snapshot.dense.describe(),
        "default": {k: getattr(default, k) for k in ("candidate_policy", "dense_candidates",
                                                     "candidates", "fusion", "vector_weight")},
        "policies": {p: {} for p in POLICIES}}
    warm, measured = w.warmup, list(range(w.warmup, len(w.queries)))
    for label, (texts, vectors) in sets.items():
        runners = {p: runner(r, texts, vectors) for p, r in retrievers.items()}
        with single_thread():
            samples = measure_side_by_side(runners, measured, list(range(warm)))
            cpu = {p: cpu_ms(run, measured) for p, run in runners.items()}
        for policy, s in samples.items():
            ids = [w.query_ids[i] for i in measured]
            row: dict[str, Any] = {"latency_ms": s.summary(), "cpu_ms": cpu[policy],
                   "empty": sum(not o[1] for o in s.outputs) / len(s.outputs)}
            if w.qrels:
                outputs = [(o[0], o[1], o[2]) for o in s.outputs]
                row["quality"] = {**evaluate_run(w.qrels, run_from_outputs(ids, outputs),
                                                 ("ndcg@10", "recall@10")),
                                  **recall_at_100(retrievers[policy], w, measured, texts, vectors)}
            out["policies"][policy][label] = row
    for r in retrievers.values():
        r.close()
    return out


def cpu_ms(run: Callable[[int], Any], items: list[int]) -> dict[str, float]:
    """Per-search CPU time of this thread (ms): unlike wall time, a search descheduled by the
    machine's other jobs (a 4 ms time slice here) is not charged for the wait, so the p95 of
    two policies compares their work, not how often each was preempted."""
    times = []
    for i in items:
        began = time.thread_time()
        run(i)
        times.append((time.thread_time() - began) * 1e3)
    return summarize(times)


def recall_at_100(retriever: Retriever, w: Workload, measured: list[int], texts: Sequence[str],
                  vectors: np.ndarray) -> dict[str, float]:
    """recall@100 from a k=100 run of the same queries (latency is measured at k=10)."""
    queries = {w.query_ids[i]: texts[i] for i in measured}
    run = retriever_run(retriever, queries, k=100, query_vectors=vectors[measured])
    return evaluate_run(w.qrels or {}, run, ("recall@100",))


def report(results: dict[str, dict[str, Any]]) -> str:
    headers = ["workload", "policy", "clean p50 / p95 / p99 ms", "clean CPU p50 / p95 / p99 ms",
               "misspelled p50 / p95 / p99 ms",
               "empty (clean / misspelled)", "nDCG@10 clean / misspelled",
               "recall@100 clean / misspelled"]
    rows = []
    for name, r in results.items():
        for policy, sets in r["policies"].items():
            cells = [" / ".join(fmt_ms(sets[s][key][p]) for p in ("p50", "p95", "p99"))
                     for s, key in (("clean", "latency_ms"), ("clean", "cpu_ms"),
                                    ("misspelled", "latency_ms"))]
            empty = " / ".join(f"{sets[s]['empty']:.1%}" for s in ("clean", "misspelled"))
            quality = [" / ".join(f"{sets[s]['quality'][m]:.4f}" for s in ("clean", "misspelled"))
                       if "quality" in sets["clean"] else "n/a (no judgments)"
                       for m in ("ndcg@10", "recall@100")]
            rows.append([f"{name} ({r['n_docs']} docs)", policy, *cells, empty, *quality])
    dense = "; ".join(f"{n}: {r['dense_leg']}" for n, r in results.items())
    default = next(iter(results.values()))["default"]
    return (markdown_table(headers, rows) + f"\n\nDefault: {default}. Dense leg per workload: "
            f"{dense}.\n"
            "Search path (vector given), k=10, BLAS on one thread; shared 2-core machine, other "
            "jobs running at the same time.")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--synthetic", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--synthetic-queries", type=int, default=1000,
                        help="queries per generated corpus (union scans a lot at 1M)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--ann", choices=("ivf", "hnsw"), default=None,
                        help="dense leg of the generated corpora' builds (default: the build "
                        "default)")
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    args = parser.parse_args(argv)
    workloads = [load_workload(workload_args(args, data=args.data))]
    encoder = workloads[0].encoder
    for n in args.synthetic:
        synthetic_args = workload_args(args, synthetic=n, clustered_vectors=True, ann=args.ann)
        synthetic_args.queries = args.synthetic_queries
        workloads.append(load_workload(synthetic_args))
    results = {w.name: measure_workload(w, encoder) for w in workloads}
    markdown = report(results)
    print(markdown)
    json_path, _ = write_results("policies", {"environment": environment(), "results": results},
                                 markdown)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
