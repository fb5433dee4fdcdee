"""The ``retrieval`` command: build, verify, search, demo."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from indexes.analyzer import AnalyzerConfig
from indexes.bm25 import BM25Params
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.encoders import SentenceTransformerEncoder
from indexes.errors import RetrievalError
from indexes.manifest import collect_garbage, read_manifest, resolve_build_dir, verify_build
from indexes.synthetic import with_demo_metadata
from retrieval.config import RetrieverConfig
from retrieval.features.cli import add_features_parser
from retrieval.retriever import Retriever
from retrieval.service.cli import add_serve_parser


def _build(args: argparse.Namespace) -> int:
    config = BuildConfig(
        analyzer=AnalyzerConfig(stemmer=None if args.no_stem else "english"),
        bm25=BM25Params(variant=args.bm25, k1=args.k1, b=args.b),
        vector_dtype=args.vector_dtype,
        batch_size=args.batch_size,
    )
    documents = read_corpus(Path(args.corpus))
    if args.demo_metadata:
        documents = with_demo_metadata(documents)
    encoder = SentenceTransformerEncoder(args.model)
    report = build_index(documents, args.out, encoder=encoder, config=config)
    print(f"published build {report.build_id} at {report.path}: {report.n_docs} documents, "
          f"{report.vectors_reused} vectors reused, {report.vectors_encoded} encoded; "
          f"seconds {report.seconds}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    directory = resolve_build_dir(Path(args.index))
    manifest = read_manifest(directory)
    verify_build(directory, manifest)
    print(f"ok: build {manifest.build_id}, {manifest.n_docs} documents, "
          f"{len(manifest.files)} files verified")
    return 0


def _gc(args: argparse.Namespace) -> int:
    removed = collect_garbage(Path(args.index), args.keep)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} removed; kept the newest {args.keep} builds and the live one")
    return 0


def _parse_filter_arg(text: str | None) -> dict | str | None:
    """``--filter`` takes JSON (``{"year": {"gte": 2010}}``) or the DSL (``year >= 2010``)."""
    if not text:
        return None
    stripped = text.strip()
    return json.loads(stripped) if stripped.startswith("{") else stripped


def _search(args: argparse.Namespace) -> int:
    config = RetrieverConfig(candidates=args.candidates)
    retriever = Retriever.load(args.index, config)
    result = retriever.search(args.query, filters=_parse_filter_arg(args.filter), k=args.k)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    for rank, hit in enumerate(result.hits, start=1):
        print(f"{rank:>3}. {hit.doc_id}  score={hit.score:.4f}  bm25={hit.bm25_score:.3f}  "
              f"cos={hit.vector_score:.3f}  {hit.title[:70] or hit.text[:70]}")
    timings = "  ".join(f"{k}={v:.3f}" for k, v in result.timings.items())
    print(f"build {result.build_id}; allowed {result.allowed}; candidates {result.candidates}")
    print(f"timings ms: {timings}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    # Imported by name: the suite needs the dev extras (ranx, matplotlib), not the library.
    suite = importlib.import_module("benchmarks.suite")
    return int(suite.main(args.suite_args))


def _demo(args: argparse.Namespace) -> int:
    from retrieval.demo import run_demo

    return run_demo(data=args.data, out=Path(args.out), n_queries=args.queries)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="retrieval", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="build and publish an index from a corpus")
    build.add_argument("--corpus", required=True, help="BEIR folder or JSONL file")
    build.add_argument("--out", required=True, help="index root (builds/ and CURRENT)")
    build.add_argument("--model", default=None, help="sentence-transformers model directory")
    build.add_argument("--bm25", choices=["okapi", "lucene"], default="okapi")
    build.add_argument("--k1", type=float, default=1.5)
    build.add_argument("--b", type=float, default=0.75)
    build.add_argument("--no-stem", action="store_true", help="disable Snowball stemming")
    build.add_argument("--vector-dtype", choices=["float32", "float16", "int8"], default="float32")
    build.add_argument("--batch-size", type=int, default=64)
    build.add_argument("--demo-metadata", action="store_true",
                       help="add generated department/doc_type/year fields (filter demos)")
    build.set_defaults(func=_build)

    verify = sub.add_parser("verify", help="check every file of a build against its manifest")
    verify.add_argument("index")
    verify.set_defaults(func=_verify)

    gc = sub.add_parser("gc", help="remove old builds from an index root")
    gc.add_argument("index")
    gc.add_argument("--keep", type=int, default=3, help="newest builds to keep (live one always)")
    gc.set_defaults(func=_gc)

    search = sub.add_parser("search", help="search an index and print hits and timings")
    search.add_argument("index")
    search.add_argument("query")
    search.add_argument("--filter", default=None, help='JSON or DSL, e.g. "year >= 2010"')
    search.add_argument("--k", type=int, default=10)
    search.add_argument("--candidates", type=int, default=300)
    search.add_argument("--json", action="store_true")
    search.set_defaults(func=_search)

    add_features_parser(sub)
    add_serve_parser(sub)

    demo = sub.add_parser("demo", help="build an index, run queries, print p50/p95/p99")
    demo.add_argument("--data", default=None, help="BEIR folder (default: ../shared/data/scifact)")
    demo.add_argument("--out", default="build/demo")
    demo.add_argument("--queries", type=int, default=1000)
    demo.set_defaults(func=_demo)
    bench = sub.add_parser("bench", help="run the benchmark suite (python -m benchmarks.suite)",
                           add_help=False, prefix_chars="\0")  # every argument goes to the suite
    bench.add_argument("suite_args", nargs=argparse.REMAINDER,
                       help="benchmarks.suite arguments, e.g. --tiny; --help lists them")
    bench.set_defaults(func=_bench)
    return root


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (RetrievalError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
