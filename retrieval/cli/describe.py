"""``retrieval describe``: what an index holds and what its filters can name."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.field_summary import summarize_fields
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.metadata import MetadataIndex
from indexes.passages import describe as describe_passages
from indexes.sharding import is_sharded, read_layout
from retrieval.cli.common import Subparsers, add_parser, positive_int
from retrieval.sharding.whole import joined_metadata

TOP_VALUES = 5


def register(subparsers: Subparsers) -> None:
    describe = add_parser(subparsers, "describe",
                          "list an index's metadata fields, their types and common values")
    describe.add_argument("index", help="index root or build directory")
    describe.add_argument("--top", type=positive_int, default=TOP_VALUES,
                          help="values shown per keyword field")
    describe.set_defaults(func=run_describe)


def run_describe(args: argparse.Namespace) -> int:
    directory = resolve_build_dir(Path(args.index))
    manifest = read_manifest(directory)
    metadata, shards = _metadata(directory)
    print(f"build {manifest.build_id} at {directory}: {manifest.n_docs} documents"
          f"{f' in {shards} shards' if shards > 1 else ''}, "
          f"encoder {manifest.encoder.encoder_id}, {manifest.encoder.vector_dtype} vectors")
    if manifest.passages is not None:
        print(f"rows are passages: {describe_passages(manifest.passages)}")
    if manifest.window is not None:
        print(manifest.window.describe())
    if not metadata.kinds:
        print("no metadata fields: filters cannot be used on this index")
    for summary in summarize_fields(metadata, args.top):
        print(summary.text())
    return 0


def _metadata(directory: Path) -> tuple[MetadataIndex, int]:
    """The build's metadata over all its rows (a sharded build's joined from its shards, not
    prefaulted: a description reads little of it) and its shard count."""
    if not is_sharded(directory):
        return MetadataIndex.load(directory / "metadata", prefault=False), 1
    directory, layout = read_layout(directory, verify=False)
    parts = [MetadataIndex.load(layout.shard_dir(directory, i) / "metadata", prefault=False)
             for i in range(len(layout.shards))]
    starts = [entry.start for entry in layout.shards]
    return joined_metadata(parts, starts, layout.n_docs), len(parts)
