"""``retrieval demo``: build an index, print its quality and per-stage latency."""

from __future__ import annotations

import argparse
from pathlib import Path

from retrieval.cli.common import Subparsers, add_parser, positive_int


def register(subparsers: Subparsers) -> None:
    demo = add_parser(subparsers, "demo",
                      "build an index, print nDCG@10 and per-stage p50/p95/p99")
    demo.add_argument("--data", default=None,
                      help="BEIR folder (default: ../shared/data/scifact when present, else the "
                      "shipped examples/data/cranfield)")
    demo.add_argument("--out", default="build/demo")
    demo.add_argument("--queries", type=positive_int, default=1000)
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from retrieval.demo import run_demo  # the demo's imports load the model: only when run

    return run_demo(data=args.data, out=Path(args.out), n_queries=args.queries)
