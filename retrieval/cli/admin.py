"""``retrieval verify`` and ``retrieval gc``: check a build (and an index root's write-ahead
log), remove old builds."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.history import check_history
from indexes.manifest import (
    CURRENT,
    collect_garbage,
    read_manifest,
    resolve_build_dir,
    verify_build,
)
from indexes.wal.log import check_log
from retrieval.cli.common import Subparsers, add_parser


def register_verify(subparsers: Subparsers) -> None:
    verify = add_parser(subparsers, "verify", "check every file of a build against its manifest")
    verify.add_argument("index", help="index root or build directory")
    verify.set_defaults(func=run_verify)


def register_gc(subparsers: Subparsers) -> None:
    gc = add_parser(subparsers, "gc", "remove old builds from an index root")
    gc.add_argument("index", help="index root")
    gc.add_argument("--keep", type=int, default=3, help="newest builds to keep (live one always)")
    gc.set_defaults(func=run_gc)


def run_verify(args: argparse.Namespace) -> int:
    directory = resolve_build_dir(Path(args.index))
    manifest = read_manifest(directory)
    verify_build(directory, manifest)
    print(f"ok: build {manifest.build_id}, {manifest.n_docs} documents, "
          f"{len(manifest.files)} files verified")
    if (Path(args.index) / CURRENT).is_file():  # an index root: its history and log too
        check_history(Path(args.index))  # CorruptArtifactError: exit 2, the line named
        live = read_manifest(resolve_build_dir(Path(args.index)))  # now: builds may have
        records, torn = check_log(Path(args.index), live.log_seq)  # gone live meanwhile
        tail = f"; a torn tail of {torn} bytes (an unacknowledged write)" if torn else ""
        print(f"ok: write-ahead log, {records} whole records{tail}")
    return 0


def run_gc(args: argparse.Namespace) -> int:
    removed = collect_garbage(Path(args.index), args.keep)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} removed; kept the newest {args.keep} builds and the live one")
    return 0
