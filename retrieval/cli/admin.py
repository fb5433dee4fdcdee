"""``retrieval verify`` and ``retrieval gc``: check a build, remove old builds."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.manifest import collect_garbage, read_manifest, resolve_build_dir, verify_build
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
    return 0


def run_gc(args: argparse.Namespace) -> int:
    removed = collect_garbage(Path(args.index), args.keep)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} removed; kept the newest {args.keep} builds and the live one")
    return 0
