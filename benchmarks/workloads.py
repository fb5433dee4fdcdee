"""Workloads of the benchmark suite: a BEIR folder, an index plus a query log, or a synthetic
corpus, each with its queries (warm-up first), query vectors, qrels if any, and build report."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    artifact_sizes,
    memory_mb,
)
from benchmarks.peers import tokenize_corpus
from benchmarks.quality import qrels_from_relevant
from benchmarks.search import RANDOM_ENCODER, synthetic_queries
from benchmarks.synthetic import (
    clustered_unit_vectors,
    random_unit_vectors,
    synthetic_vocabulary_documents,
)
from indexes import Analyzer, AnalyzerConfig, BuildConfig, Document, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.manifest import current_build_dir, read_manifest, resolve_build_dir
from retrieval import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.query_encoder import default_encoder

TINY_DOCS = 1500


@dataclass
class Workload:
    """An index to search, the queries (warm-up first), their vectors, and qrels if any."""

    name: str
    mode: str  # "beir", "log" or "synthetic"
    root: Path
    query_ids: list[str]
    queries: list[str]
    filters: list[Any]
    query_vectors: np.ndarray
    qrels: dict[str, dict[str, int]] | None
    encoder: Any
    warmup: int
    build: dict[str, Any]
    docs: list[Document] | None = None
    tokens: tuple[list[str], list[list[int]]] | None = None
    snapshot: Any = None
    snapshot_seconds: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def n_docs(self) -> int:
        return int(self.snapshot.manifest.n_docs)

    @property
    def warm(self) -> list[int]:
        return list(range(self.warmup))

    @property
    def measured(self) -> list[int]:
        return list(range(self.warmup, len(self.queries)))

    @property
    def filters_used(self) -> bool:
        return any(f is not None for f in self.filters)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "root": str(self.root),
                "n_docs": self.n_docs, "queries": len(self.queries), "warmup": self.warmup,
                "measured": len(self.measured), "qrels_queries": len(self.qrels or {}),
                "filtered_queries": sum(f is not None for f in self.filters),
                "encoder": self.snapshot.manifest.encoder.encoder_id}

    def load_report(self, probes: list[dict[str, Any]]) -> dict[str, Any]:
        return {"snapshot_load_seconds": self.snapshot_seconds, "in_process_memory_mb":
                self.memory, "fresh_process": probes}


def reuse_source(args: argparse.Namespace) -> str | None:
    """The other benchmarks' build of the same data: its vectors are reused by content hash."""
    if args.fresh_build or args.data is None:
        return None
    other = args.work / args.data.name
    return str(other) if (other / "CURRENT").is_file() else None


def build_report(docs: list[Document], root: Path, args: argparse.Namespace, **source: Any
                 ) -> dict[str, Any]:
    config = BuildConfig(vector_dtype=args.vector_dtype, reuse_vectors=not args.fresh_build,
                         reuse_from=reuse_source(args),
                         **({"ann": args.ann} if getattr(args, "ann", None) else {}))
    started = time.perf_counter()
    report = build_index(docs, root, config=config, progress=not args.tiny, **source)
    return {"seconds": {**report.seconds, "total": round(time.perf_counter() - started, 3)},
            "vectors_encoded": report.vectors_encoded, "vectors_reused": report.vectors_reused,
            "vectors_given": "vectors" in source, "vector_dtype": args.vector_dtype,
            "build_id": report.build_id,
            "sizes": artifact_sizes(report.path)}


def tiny_subset(docs: list[Document], queries: dict[str, str], qrels: dict[str, Any], n: int
                ) -> tuple[list[Document], dict[str, str], dict[str, Any]]:
    """Half the queries judged (with all their relevant documents kept), half not."""
    judged = [q for q in qrels if q in queries][: n // 2]
    others = [q for q in queries if q not in qrels][: n - len(judged)]
    keep = {d for q in judged for d in qrels[q]}
    subset = [d for i, d in enumerate(docs) if i < TINY_DOCS or d.id in keep]
    return subset, {q: queries[q] for q in others + judged}, {q: qrels[q] for q in judged}


def beir_workload(args: argparse.Namespace) -> Workload:
    from indexes.encoders import SentenceTransformerEncoder

    encoder = SentenceTransformerEncoder()
    docs = list(with_demo_metadata(read_corpus(args.data)))
    queries = read_queries(args.data / "queries.jsonl")
    qrels = read_qrels(args.data / "qrels" / "test.tsv")
    if args.tiny:
        docs, queries, qrels = tiny_subset(docs, queries, qrels, args.queries)
    ids = list(queries)[: args.queries]
    suffix = ("-tiny" if args.tiny else "") + ("" if args.vector_dtype == "float32"
                                               else f"-{args.vector_dtype}")
    root = args.work / f"suite-{args.data.name}{suffix}"
    build = build_report(docs, root, args, encoder=encoder)
    texts = [queries[q] for q in ids]
    return Workload(args.data.name + (" (tiny)" if args.tiny else ""), "beir", root, ids, texts,
                    [None] * len(ids), encoder.encode(texts, batch_size=64),
                    {q: r for q, r in qrels.items() if q in set(ids)}, encoder,
                    min(args.warmup, len(ids) // 4), build, docs)


def log_workload(args: argparse.Namespace) -> Workload:
    lines = [json.loads(line) for line in args.queries_log.read_text().splitlines() if line.strip()]
    lines = lines[: args.queries]
    snapshot = LoadedBuild.load(args.index)
    encoder = default_encoder(snapshot, RetrieverConfig())
    if encoder is None:
        raise SystemExit(f"{args.index} was built from external vectors: no query encoder to "
                         "embed the log's queries (use --synthetic for a latency-only run)")
    ids = [str(line.get("id", f"q{i}")) for i, line in enumerate(lines)]
    texts = [line["query"] for line in lines]
    qrels = qrels_from_relevant(ids, [line.get("relevant") for line in lines]) or None
    manifest = snapshot.manifest
    build = {"prebuilt": True, "build_id": manifest.build_id, "created_at": manifest.created_at,
             "vector_dtype": manifest.encoder.vector_dtype, "sizes": artifact_sizes(snapshot.path)}
    return Workload(args.queries_log.stem, "log", args.index, ids, texts,
                    [line.get("filters") for line in lines], encoder.encode(texts, batch_size=64),
                    qrels, encoder, min(args.warmup, len(ids) // 4), build)


def synthetic_workload(args: argparse.Namespace) -> Workload:

    n = args.synthetic
    docs = list(synthetic_vocabulary_documents(n))
    # Clustered vectors (benchmarks.policies) give the dense leg's ANN index neighbours to find.
    clustered, ann = getattr(args, "clustered_vectors", False), getattr(args, "ann", None)
    suffix = f"-clustered-{ann or BuildConfig().ann}" if clustered else ""
    root = args.work / f"synthetic-{n}{suffix}"  # shared with benchmarks.search: built once
    live = current_build_dir(root)
    manifest = read_manifest(live) if live is not None else None
    if (live is not None and manifest is not None and manifest.n_docs == n
            and manifest.encoder == RANDOM_ENCODER):
        build = {"cached": True, "build_id": manifest.build_id, "sizes": artifact_sizes(live)}
    else:
        vectors = (clustered_unit_vectors(n, RANDOM_ENCODER.dim) if clustered
                   else random_unit_vectors(n, RANDOM_ENCODER.dim))
        build = build_report(docs, root, args, vectors=vectors, encoder_info=RANDOM_ENCODER)
        manifest = read_manifest(resolve_build_dir(root))
    tokens = tokenize_corpus(Analyzer(AnalyzerConfig(**manifest.analyzer)),
                             [d.content for d in docs])
    count = args.queries or 1000 + args.warmup
    texts = synthetic_queries(*tokens, count)
    query_vectors = (clustered_unit_vectors(count, RANDOM_ENCODER.dim, seed=2, centers_of=n)
                     if clustered else random_unit_vectors(count, RANDOM_ENCODER.dim, seed=2))
    return Workload(f"synthetic-{n}", "synthetic", root, [f"s{i}" for i in range(count)], texts,
                    [None] * count, query_vectors, None,
                    None, min(args.warmup, count // 4), build, docs, tokens)


def load_workload(args: argparse.Namespace) -> Workload:
    make = (log_workload if args.index is not None else
            synthetic_workload if args.synthetic is not None else beir_workload)
    w = make(args)
    before = memory_mb()
    started = time.perf_counter()
    w.snapshot = LoadedBuild.load(w.root)
    w.snapshot_seconds = time.perf_counter() - started
    w.memory = {"before_snapshot_load": before, "after_snapshot_load": memory_mb()}
    return w
