"""``retrieval compact``: fold the write-ahead log into a new published build."""

from __future__ import annotations

import argparse

from indexes.writer import IndexWriter
from retrieval.cli.common import Subparsers, add_parser


def register(subparsers: Subparsers) -> None:
    compact = add_parser(subparsers, "compact", "fold the write-ahead log into a new build",
                         "Writes acknowledged while it runs stay in the log for the next "
                         "compaction. Serving processes switch to the new build and drop the "
                         "folded records in one swap. It takes the root's writer lock.")
    compact.add_argument("index", help="index root")
    compact.set_defaults(func=run_compact)


def run_compact(args: argparse.Namespace) -> int:
    with IndexWriter(args.index) as writer:
        report = writer.compact()
    if not report.records_folded:
        print(f"nothing to fold: build {report.build_id} stays live (the log holds no write "
              f"after seq {report.log_seq}); {report.segments_retired} segments retired")
        return 0
    print(f"published build {report.build_id}: {report.n_docs} documents, "
          f"{report.records_folded} log records up to seq {report.log_seq} folded, "
          f"{report.segments_retired} segments retired in {report.seconds} s")
    return 0
