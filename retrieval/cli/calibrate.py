"""``retrieval calibrate``: fit the relevance score on an index's own judged queries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from indexes.errors import InvalidQueryError, MissingArtifactError
from indexes.manifest import CURRENT
from retrieval.calibrate import calibrate, reliability
from retrieval.cli.common import Subparsers, add_parser, positive_int
from retrieval.config import RetrieverConfig
from retrieval.retriever import Retriever


def register(subparsers: Subparsers) -> None:
    command = add_parser(subparsers, "calibrate",
                         "fit the relevance score (hit.relevance, min_score) on judged queries "
                         "and store it beside the index's builds",
                         epilog="FOLDER holds queries.jsonl and qrels/QRELS (BEIR format: "
                         "query-id, corpus-id, score; score > 0 is relevant).")
    command.add_argument("index", help="index root")
    command.add_argument("--data", type=Path, required=True, metavar="FOLDER")
    command.add_argument("--qrels", default="test.tsv", help="file under FOLDER/qrels/")
    command.add_argument("--k", type=positive_int, default=10,
                         help="top hits of each query used")
    command.add_argument("--min-queries", type=positive_int, default=MIN_QUERIES,
                         help="fewest judged queries a calibration is fitted on (default "
                         f"{MIN_QUERIES}): fewer give weights of chance, even of the wrong sign")
    command.set_defaults(func=run_calibrate)


MIN_QUERIES = 30
# The sign every fitted weight should have: more similar, more keyword evidence, a better
# rank each mean more likely relevant.
EXPECTED_SIGNS = {"vector": 1, "coverage": 1, "log_rank": -1}


def run_calibrate(args: argparse.Namespace) -> int:
    from indexes.corpus import read_qrels, read_queries

    if not (Path(args.index) / CURRENT).is_file():  # a build's own relevance.json: unread
        raise MissingArtifactError(f"{args.index} is no index root (no {CURRENT}); give the "
                                   "root the retriever loads", Path(args.index) / CURRENT)
    queries = read_queries(args.data / "queries.jsonl")
    qrels = read_qrels(args.data / "qrels" / args.qrels)
    with Retriever.load(args.index, RetrieverConfig(cache={"backend": "none"})) as retriever:
        calibration, judged = calibrate(retriever, queries, qrels, args.k, args.data.name)
        if judged.top.size < args.min_queries:
            raise InvalidQueryError(
                f"{judged.top.size} judged queries (with text and judgements in "
                f"{args.data}); a calibration needs at least {args.min_queries} "
                "(--min-queries): the index keeps its current one")
        path = calibration.save(Path(args.index))
    contrary = [name for name, sign in EXPECTED_SIGNS.items()
                if calibration.weights[name] * sign < 0]
    if contrary:
        print(f"warning: the {', '.join(contrary)} weight has the sign of chance, not of "
              "relevance: judge more queries", file=sys.stderr)
    weights = ", ".join(f"{name} {value:.3f}" for name, value in calibration.weights.items())
    print(f"fitted on {judged.top.size} judged queries: intercept {calibration.intercept:.3f}, "
          f"{weights}; wrote {path}")
    print("top hit's relevance in equal-count bins (the queries it was fitted on):")
    for row in reliability(calibration, judged):
        print(f"  {row['low']:.2f}-{row['high']:.2f}: {row['queries']} queries, estimate "
              f"{row['estimate']:.2f}, top hit relevant {row['relevant']:.2f}")
    return 0
