"""Time of a publish-gate check: ``python -m benchmarks.gate``.

One gate check of a nightly candidate against the live build: the diff (document count,
added / removed / changed by content hash, metadata fields, encoder, analyzer), 50 canary
queries (overlap@10 and expected-id recall) and 300 labeled queries (nDCG@10), both builds
loaded with ``Retriever.load`` (checksums verified) and searched with the real query encoder.
At SciFact (5,183 documents) and at SciFact grown to 100,000 documents with generated
distractors (``benchmarks.throughput.grown_index``). The candidate is the live corpus with 1% of
its documents dropped and 1% with a changed title, built from the live build's vectors (no
encoding). Side by side: the diff alone (no searches) and the whole gate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from benchmarks.throughput import grown_index
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.encoders import SentenceTransformerEncoder
from indexes.manifest import current_build_dir
from indexes.publish import list_builds, publish_build
from retrieval.latency import summarize
from retrieval.loaded_build import LoadedBuild
from retrieval.publishing import GateConfig, GateReport, check


def gate_root(source: Path, work: Path) -> tuple[Path, str]:
    """A root of its own whose live build is a copy of ``source``'s, plus a staged nightly
    candidate (built once, reused by later runs)."""
    live_dir = current_build_dir(source)
    assert live_dir is not None, f"{source} has no live build"
    root = work / f"gate-{source.name}"
    if not (root / "builds" / live_dir.name).is_dir():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(live_dir, root / "builds" / live_dir.name)
        publish_build(root, live_dir.name)
    staged = [b.build_id for b in list_builds(root) if b.status == "staged"]
    return root, staged[0] if staged else nightly_candidate(root, live_dir)


def nightly_candidate(root: Path, live_dir: Path) -> str:
    snapshot = LoadedBuild.load(live_dir)
    n = len(snapshot.docs)
    rows = np.random.default_rng(3).permutation(n)
    dropped, retitled = set(rows[: n // 100].tolist()), set(rows[n // 100: n // 50].tolist())
    kept = [r for r in range(n) if r not in dropped]
    docs = []
    for row in kept:
        doc = snapshot.docs.get(row)
        if row in retitled:
            doc = Document(doc.id, doc.text, f"{doc.title} (revised)", doc.metadata)
        docs.append(doc)
    vectors = snapshot.vectors.reconstruct_rows(np.array(kept))
    return build_index(docs, root, vectors=vectors, encoder_info=snapshot.manifest.encoder,
                       progress=False, publish=False).build_id


def gate_files(data: Path, work: Path) -> GateConfig:
    """50 canaries with their relevant ids as expected, 300 labeled queries (SciFact test)."""
    qrels = read_qrels(data / "qrels" / "test.tsv")
    queries = read_queries(data / "queries.jsonl")
    ids = sorted(q for q in qrels if q in queries)[:300]
    work.mkdir(parents=True, exist_ok=True)
    canaries, labeled = work / "gate-canaries.jsonl", work / "gate-labeled.jsonl"
    canaries.write_text("".join(json.dumps({"query": queries[q], "expected": sorted(qrels[q])})
                                + "\n" for q in ids[:50]))
    labeled.write_text("".join(json.dumps({"query": queries[q], "relevant": qrels[q]}) + "\n"
                               for q in ids))
    return GateConfig(canaries=str(canaries), labeled_log=str(labeled), min_expected_recall=0.0)


def size_runs(root: Path, candidate: str, gate: GateConfig, encoder: Any,
              runs: int) -> dict[str, Any]:
    reports: list[GateReport] = []

    def full(_: int) -> None:
        reports.append(check(root, candidate, gate, encoder=encoder))

    runners = {"diff only": lambda _: check(root, candidate, GateConfig(), encoder=encoder),
               "diff + 50 canaries + 300 labeled": full}
    samples = measure_side_by_side(runners, list(range(runs)), warmup=[0], chunk=1)
    last = reports[-1]
    phases = {name: summarize([r.timings.get(name, 0.0) * 1e3 for r in reports[1:]])
              for name in ("diff", "load", "encode", "search")}
    return {"docs": last.check("document count").figures["live_docs"], "phases": phases,
            "latency": {name: s.summary() for name, s in samples.items()},
            "report": last.as_dict(),
            "full_runs_ms": summarize(samples["diff + 50 canaries + 300 labeled"].wall_ms)}


def seed_base(args: argparse.Namespace, encoder: Any) -> None:
    """Build the SciFact index the grown ones start from, reusing vectors when possible."""
    base = args.work / args.data.name
    if (base / "CURRENT").is_file():
        return
    reuse = str(args.reuse_from) if (args.reuse_from / "CURRENT").is_file() else None
    build_index(with_demo_metadata(read_corpus(args.data)), base, encoder=encoder,
                config=BuildConfig(reuse_from=reuse), progress=False)


def render(results: dict[str, Any], runs: int) -> str:
    lines = ["# Publish gate: time of one check", "",
             f"{runs} timed checks per size after one warm-up, the two kinds taking turns.", ""]
    rows = [[f"{size['docs']:,}", name, percentile_cells(summary)]
            for size in results["sizes"] for name, summary in size["latency"].items()]
    lines += [markdown_table(["documents", "check", "p50 / p95 / p99 ms"], rows), ""]
    rows = [[f"{size['docs']:,}", *(f"{size['phases'][name]['p50']:.0f}"
                                    for name in ("diff", "load", "encode", "search"))]
            for size in results["sizes"]]
    lines += ["Phases of the whole gate, p50 ms (load: both builds with checksums verified; "
              "encode: 300 distinct query texts once; search: 350 queries on each build):", "",
              markdown_table(["documents", "diff", "load", "encode", "search"], rows), ""]
    for size in results["sizes"]:
        report = size["report"]
        lines.append(f"Verdict at {size['docs']:,} documents: "
                     f"{'passed' if report['passed'] else 'refused'}; " + "; ".join(
                         f"{c['name']}: {c['summary']}" for c in report["checks"]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gate", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--sizes", type=int, nargs="*", default=[0, 100_000],
                        help="0: SciFact alone; else grown to that many documents")
    parser.add_argument("--runs", type=int, default=5, help="timed checks per size")
    parser.add_argument("--reuse-from", type=Path, default=REPO / "build" / "test-indexes" /
                        "scifact", help="index root whose vectors seed the SciFact build")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encoder = SentenceTransformerEncoder()
    gate = gate_files(args.data, args.work)
    seed_base(args, encoder)
    sizes = []
    for n in args.sizes:
        root, candidate = gate_root(grown_index(args.data, args.work, n, encoder), args.work)
        sizes.append(size_runs(root, candidate, gate, encoder, args.runs))
    results = {"sizes": sizes}
    publish_report("gate", args, results, render(results, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
