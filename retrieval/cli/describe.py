"""``retrieval describe``: what an index holds and what its filters can name."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from indexes.manifest import read_manifest, resolve_build_dir
from indexes.metadata import MetadataIndex
from indexes.passages import describe as describe_passages
from retrieval.cli.common import Subparsers, add_parser

TOP_VALUES = 5


def register(subparsers: Subparsers) -> None:
    describe = add_parser(subparsers, "describe",
                          "list an index's metadata fields, their types and common values")
    describe.add_argument("index", help="index root or build directory")
    describe.add_argument("--top", type=int, default=TOP_VALUES,
                          help="values shown per keyword field")
    describe.set_defaults(func=run_describe)


def run_describe(args: argparse.Namespace) -> int:
    directory = resolve_build_dir(Path(args.index))
    manifest = read_manifest(directory)
    metadata = MetadataIndex.load(directory / "metadata", prefault=False)
    print(f"build {manifest.build_id} at {directory}: {manifest.n_docs} documents, "
          f"encoder {manifest.encoder.encoder_id}, {manifest.encoder.vector_dtype} vectors")
    if manifest.passages is not None:
        print(f"rows are passages: {describe_passages(manifest.passages)}")
    if manifest.window is not None:
        print(manifest.window.describe())
    if not metadata.kinds:
        print("no metadata fields: filters cannot be used on this index")
    for field, kind in sorted(metadata.kinds.items()):
        print(describe_field(metadata, field, kind, args.top))
    return 0


def describe_field(metadata: MetadataIndex, field: str, kind: str, top: int) -> str:
    """One line per field: kind, how many documents have it, common values or the range."""
    if kind == "keyword":
        counts = metadata.value_counts(field)
        shown = ", ".join(f"{value!r} ({n})" for value, n in counts[:top])
        more = f", ... {len(counts) - top} more" if len(counts) > top else ""
        return f"{field} (keyword, {len(counts)} distinct values): {shown}{more}"
    column = metadata.numeric_column(field)
    present = column[~np.isnan(column)]
    if not present.size:
        return f"{field} ({kind}): no values"
    low, high = float(present.min()), float(present.max())
    show = _date if kind == "date" else _number
    return (f"{field} ({kind}, {present.size} of {column.size} documents): "
            f"{show(low)} .. {show(high)}")


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _date(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")
