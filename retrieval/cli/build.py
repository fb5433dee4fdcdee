"""``retrieval build``: a corpus in, a published index out; prints the fields it inferred."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.analyzer import AnalyzerConfig
from indexes.bm25 import BM25Params
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.encoders import SentenceTransformerEncoder
from indexes.manifest import read_manifest
from indexes.synthetic import with_demo_metadata
from retrieval.cli.common import Subparsers, add_parser
from retrieval.cli.formats import CORPUS_FORMAT
from retrieval.cli.publish import add_gate_flags, after_build


def register(subparsers: Subparsers) -> None:
    build = add_parser(subparsers, "build", "build and publish an index from a corpus",
                       epilog=CORPUS_FORMAT)
    build.add_argument("--corpus", required=True, help="BEIR folder or JSONL file (format below)")
    build.add_argument("--out", required=True, help="index root (builds/ and CURRENT)")
    build.add_argument("--model", default=None, help="sentence-transformers model directory")
    build.add_argument("--bm25", choices=["okapi", "lucene"], default="okapi")
    build.add_argument("--k1", type=float, default=1.5)
    build.add_argument("--b", type=float, default=0.75)
    build.add_argument("--no-stem", action="store_true", help="disable Snowball stemming")
    build.add_argument("--vector-dtype", choices=["float32", "float16", "int8"], default="float32")
    build.add_argument("--batch-size", type=int, default=64)
    build.add_argument("--ann", choices=["ivf", "hnsw"], default="ivf",
                       help="the dense leg's index (benchmarks/README.md compares them)")
    build.add_argument("--demo-metadata", action="store_true",
                       help="add generated department/doc_type/year fields (filter demos)")
    add_gate_flags(build, staging=True)
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    config = BuildConfig(
        analyzer=AnalyzerConfig(stemmer=None if args.no_stem else "english"),
        bm25=BM25Params(variant=args.bm25, k1=args.k1, b=args.b),
        vector_dtype=args.vector_dtype,
        batch_size=args.batch_size,
        ann=args.ann,
    )
    # The whole corpus is read and checked before the model loads: input errors come first.
    documents = list(read_corpus(Path(args.corpus)))
    if args.demo_metadata:
        documents = list(with_demo_metadata(documents))
    encoder = SentenceTransformerEncoder(args.model)
    report = build_index(documents, args.out, encoder=encoder, config=config,
                         publish=not (args.no_publish or args.gate))
    if not report.published:
        return after_build(args, report, encoder)
    print(f"published build {report.build_id} at {report.path}: {report.n_docs} documents, "
          f"{report.describe_vectors()}; seconds {report.seconds}")
    print(describe_fields(read_manifest(report.path).metadata_fields))
    return 0


def describe_fields(kinds: dict[str, str]) -> str:
    if not kinds:
        return "metadata fields: none (documents without metadata: no filters)"
    listed = ", ".join(f"{field} ({kind})" for field, kind in sorted(kinds.items()))
    return f"metadata fields inferred: {listed}"
