"""Two revisions of the library side by side on one index: search path and full miss, rounds
alternated (old, new, old, new, ...) so both see the same machine load.

    python -m benchmarks.revisions --old 1d4226a --index build/test-indexes/scifact

Each round runs every query once per revision in a fresh process whose ``PYTHONPATH`` is a
worktree of that revision (``git worktree add``, removed afterwards): the search path (query
vectors given: validate, filter, BM25, re-rank, fuse, hydrate) and the full miss (the INT8
query encoder, no cache). The first ``--warmup`` queries of each process are discarded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, percentile_cells, publish_report

ROOT = Path(__file__).resolve().parents[1]

# Run in each revision's process: only the public API both revisions share.
MEASURE = """
import json, sys, time
import numpy as np
from retrieval import Retriever
index, texts, warmup = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
with Retriever.load(index, {"cache": {"backend": "none"}}) as retriever:
    vectors = retriever.encoder.encode(texts)
    for name, call in (
            ("search path", lambda i: retriever.search(texts[i], k=10, query_vector=vectors[i])),
            ("full miss", lambda i: retriever.search(texts[i], k=10))):
        times = []
        for i in range(len(texts)):
            began = time.perf_counter()
            call(i)
            times.append((time.perf_counter() - began) * 1e3)
        out[name] = times[warmup:]
print(json.dumps(out))
"""


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                   check=True, capture_output=True)
    return into


def run_once(tree: Path, index: Path, texts: list[str], warmup: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(index), json.dumps(texts),
                           str(warmup)], env=env, capture_output=True, text=True, check=True,
                          cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(times: list[float]) -> dict[str, float]:
    return {p: float(np.percentile(times, q)) for p, q in (("p50", 50), ("p95", 95),
                                                           ("p99", 99))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="git revision to compare with the work tree")
    p.add_argument("--index", type=Path, required=True, help="an index both revisions load")
    p.add_argument("--queries", type=Path, default=ROOT / "examples/data/scifact/queries.jsonl")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    texts = [json.loads(line)["text"] for line in args.queries.read_text().splitlines()
             ][:args.count]
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"old": worktree(args.old, Path(tmp) / "old"), "new": ROOT}
        try:
            for _ in range(args.rounds):
                for label in ("old", "new"):
                    got = run_once(trees[label], args.index.resolve(), texts, args.warmup)
                    for name, times in got.items():
                        samples[label].setdefault(name, []).extend(times)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(trees["old"])], capture_output=True)
    results = {label: {name: summary(t) for name, t in by.items()}
               for label, by in samples.items()}
    rows = []
    for name in results["new"]:
        old, new = results["old"][name], results["new"][name]
        change = 100.0 * (new["p50"] - old["p50"]) / old["p50"]
        rows.append([name, percentile_cells(old), percentile_cells(new), f"{change:+.1f}%"])
    markdown = "\n".join([
        f"## Revisions side by side: {args.old} against the work tree", "",
        f"{args.index.name}, {len(texts) - args.warmup} timed queries x {args.rounds} "
        "alternated rounds per revision, cache off", "",
        markdown_table(["path", "old p50 / p95 / p99 ms", "new p50 / p95 / p99 ms",
                        "p50 change"], rows)])
    publish_report("revisions", args, results, markdown)


if __name__ == "__main__":
    main()
