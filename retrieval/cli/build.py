"""``retrieval build``: a corpus in, a published index out; prints the fields it inferred."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from indexes.analyzer import AnalyzerConfig
from indexes.bm25 import BM25Params
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.errors import CorpusError
from indexes.manifest import check_new_root, read_manifest
from indexes.onnx_encoder import make_encoder
from indexes.passages import PassageConfig
from indexes.passages import describe as describe_passages
from retrieval.cli.common import (
    Subparsers,
    add_mapping_flags,
    add_parser,
    flag_problems,
    mapping_of,
)
from retrieval.cli.formats import CORPUS_FORMAT
from retrieval.cli.publish import add_gate_flags, after_build
from retrieval.errors import ConfigError


def register(subparsers: Subparsers) -> None:
    build = add_parser(subparsers, "build", "build and publish an index from a corpus",
                       epilog=CORPUS_FORMAT)
    build.add_argument("--corpus", required=True, help="BEIR folder, JSONL, CSV or Parquet file, "
                       "or a folder of .md/.txt/.html files (formats below)")
    add_mapping_flags(build)
    build.add_argument("--out", required=True, help="index root (builds/ and CURRENT)")
    build.add_argument("--model", default=None, help="sentence-transformers model directory")
    build.add_argument("--doc-encoder", choices=["torch", "onnx"], default="torch",
                       help="document encoder: sentence-transformers (torch), or its fp32 ONNX "
                       "export (cosine 1.0000 to torch; ~2x the docs/s on CPU, batches cut "
                       "by length)")
    build.add_argument("--bm25", choices=["okapi", "lucene"], default="okapi")
    build.add_argument("--k1", type=float, default=1.5)
    build.add_argument("--b", type=float, default=0.75)
    build.add_argument("--no-stem", action="store_true", help="disable Snowball stemming")
    build.add_argument("--vector-dtype", choices=["float32", "float16", "int8"], default="float32")
    build.add_argument("--batch-size", type=int, default=64)
    build.add_argument("--passages", action="store_true",
                       help="split long documents into passages that fit the encoder's window "
                       "(search then returns passages; --group-by document in search)")
    build.add_argument("--passage-tokens", type=int, default=None,
                       help="passage length in the model's tokens (default 256, the window)")
    build.add_argument("--passage-overlap", type=int, default=None,
                       help="tokens repeated between passages cut inside a paragraph "
                       "(default 32)")
    build.add_argument("--ann", choices=["ivf", "hnsw"], default="ivf",
                       help="the dense leg's index (benchmarks/README.md compares them)")
    build.add_argument("--postings", choices=["plain", "compact"], default="plain",
                       help="BM25 postings: plain (8 bytes each) or compact (~2.5, decoded per "
                       "query; the same scores)")
    build.add_argument("--analysis-workers", type=int, default=None, metavar="N",
                       help="parts the analysis runs in (threads; Ray tasks with --ray); "
                       "default: one per core (--ray: --ray-workers)")
    build.add_argument("--demo-metadata", action="store_true",
                       help="add generated department/doc_type/year fields (filter demos)")
    build.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                       help="read and encode on a Ray cluster (Ray Data; the ray extra): "
                       "ADDRESS of a running cluster, or none to start a local one")
    build.add_argument("--ray-workers", type=int, default=2, help="encoder actors on Ray")
    build.add_argument("--shards", type=int, default=None, metavar="S",
                       help="write S shard builds sharing the collection's BM25 statistics "
                       "(opened by Retriever.load like any build); published by one flip")
    build.add_argument("--shard-dense", choices=["ivf", "exact"], default="ivf",
                       help="each shard's dense leg: IVF, or exact (sharded results then equal "
                       "an exact unsharded index's)")
    build.add_argument("--live-writes", choices=["superseded", "replayed"],
                       default="superseded",
                       help="writes logged live on --out before this build started: "
                       "superseded by the corpus export (default: it is the newer truth), or "
                       "replayed onto it; writes logged after it started are applied on top "
                       "either way, and the folded log is deleted once the build is live")
    build.add_argument("--allow-new-fields", action="store_true",
                       help="let live upserts add metadata fields this build does not have "
                       "(default: refused, so a misspelt field cannot change the schema)")
    add_gate_flags(build, staging=True)
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    config = BuildConfig(
        analyzer=AnalyzerConfig(stemmer=None if args.no_stem else "english"),
        bm25=BM25Params(variant=args.bm25, k1=args.k1, b=args.b),
        vector_dtype=args.vector_dtype,
        batch_size=args.batch_size,
        passages=passage_config(args),
        ann=args.ann,
        postings=args.postings,
        analysis_workers=args.analysis_workers,
        allow_new_fields=args.allow_new_fields,
    )
    check_new_root(Path(args.out))  # before the corpus is read and the model loads
    if args.no_publish and args.gate:
        raise CorpusError("--no-publish stages the build and --gate publishes it if it "
                          "passes: give one (`retrieval publish ROOT BUILD --gate FILE` "
                          "gates a staged build later)")
    if args.ray is not None:
        return run_ray_build(args, config)
    # The whole corpus is read and checked before the model loads: input errors come first.
    documents = list(read_corpus(Path(args.corpus), mapping_of(args)))
    if args.demo_metadata:
        documents = list(with_demo_metadata(documents))
    encoder = make_encoder(args.doc_encoder, args.model)
    publish = not (args.no_publish or args.gate)
    report = build_index(documents, args.out, encoder=encoder, config=config, publish=publish,
                         shards=args.shards, dense=args.shard_dense,
                         live_writes=args.live_writes)
    said = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the JSON alone
    if report.live_writes is not None:
        print(report.live_writes.describe(), file=said)
    print(report.describe_resources(), file=said)
    if not report.published:
        return after_build(args, report, encoder)
    rows = "passages" if report.passages is not None else "documents"
    print(f"published build {report.build_id} at {report.path}: {report.n_docs} {rows}, "
          f"{report.describe_vectors()}; seconds {report.seconds}")
    print(describe_fields(read_manifest(report.path).metadata_fields))
    if report.window is not None and not report.window.rows_over_window:
        print(report.window.describe())  # else the build logged it as a warning
    if report.passages is not None:
        print(describe_passages(report.passages))
    if report.segments_retired:
        print(f"deleted {report.segments_retired} folded log segments")
    return 0


def passage_config(args: argparse.Namespace) -> PassageConfig | None:
    """``--passages`` with its lengths; a length without ``--passages`` is an error."""
    lengths = {"max_tokens": args.passage_tokens, "overlap_tokens": args.passage_overlap}
    given = {name: value for name, value in lengths.items() if value is not None}
    if not args.passages:
        if given:
            raise CorpusError("--passage-tokens and --passage-overlap need --passages")
        return None
    try:
        return PassageConfig(**given)
    except ValidationError as exc:
        flags = {"max_tokens": "--passage-tokens", "overlap_tokens": "--passage-overlap"}
        raise CorpusError(f"invalid passage lengths: {flag_problems(exc, flags)}") from exc


def run_ray_build(args: argparse.Namespace, config: BuildConfig) -> int:
    """``retrieval build --ray``: the same build with reading and encoding on Ray."""
    if args.live_writes == "replayed":
        raise ConfigError("--ray builds supersede the live writes (their vectors come from "
                          "the Ray encoders): fold the log first with `retrieval compact`, "
                          "or build without --ray", "live_writes")
    if args.gate or args.demo_metadata:
        raise ConfigError("--ray builds take neither --gate nor --demo-metadata yet: build with "
                          "--no-publish, then `retrieval publish`", "ray")
    import ray

    from indexes.ray_build import build_on_ray

    ray.init(address=None if args.ray == "auto" else args.ray)
    try:
        options = {"shards": args.shards, "dense": args.shard_dense} if args.shards else {}
        report = build_on_ray(args.corpus, args.out, backend=args.doc_encoder, model=args.model,
                              workers=args.ray_workers, config=config,
                              publish=not args.no_publish, mapping=mapping_of(args), **options)
    finally:
        ray.shutdown()
    if report.live_writes is not None:
        print(report.live_writes.describe())
    verb = "published" if report.published else "staged"
    print(f"{verb} build {report.build_id} at {report.path}: {report.n_docs} documents, "
          f"{report.describe_vectors()} on Ray")
    return 0


def describe_fields(kinds: dict[str, str]) -> str:
    if not kinds:
        return "metadata fields: none (documents without metadata: no filters)"
    listed = ", ".join(f"{field} ({kind})" for field, kind in sorted(kinds.items()))
    return f"metadata fields inferred: {listed}"
