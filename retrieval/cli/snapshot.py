"""``retrieval snapshot ROOT FILE`` and ``retrieval restore FILE ROOT``: one file holding an
index root's live build, its write-ahead log since that build and its flip history
(``indexes.snapshot``)."""

from __future__ import annotations

import argparse

from indexes.restore import restore_snapshot
from indexes.snapshot import take_snapshot
from retrieval.cli.common import Subparsers, add_parser


def register_snapshot(subparsers: Subparsers) -> None:
    snapshot = add_parser(subparsers, "snapshot", "write a snapshot of an index root to a file",
                          "Safe while writes and compactions go on: the snapshot holds every "
                          "record acknowledged before it read the log, and says up to which "
                          "seq. The file is an uncompressed tar; restore it with "
                          "`retrieval restore FILE ROOT`.")
    snapshot.add_argument("index", help="index root")
    snapshot.add_argument("file", help="snapshot file to write (replaced if it exists)")
    snapshot.set_defaults(func=run_snapshot)


def register_restore(subparsers: Subparsers) -> None:
    restore = add_parser(subparsers, "restore", "restore a snapshot file into a new index root",
                         "ROOT must be absent or empty. Every file is checked against the "
                         "snapshot's checksums, then the root is verified as `retrieval "
                         "verify` does, before anything appears at ROOT.")
    restore.add_argument("file", help="snapshot file (from `retrieval snapshot`)")
    restore.add_argument("index", help="index root to create")
    restore.set_defaults(func=run_restore)


def run_snapshot(args: argparse.Namespace) -> int:
    report = take_snapshot(args.index, args.file)
    print(f"snapshot of build {report.build_id} up to seq {report.last_seq}: {report.files} "
          f"files, {report.bytes} bytes written to {report.file}")
    return 0


def run_restore(args: argparse.Namespace) -> int:
    report = restore_snapshot(args.file, args.index)
    print(f"restored build {report.build_id} up to seq {report.last_seq}: {report.files} "
          f"files, {report.bytes} bytes verified into {report.root}")
    return 0
