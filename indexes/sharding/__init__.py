"""Shard builds of one logical index that share its global BM25 statistics."""

from indexes.sharding.build import build_sharded_index
from indexes.sharding.layout import (
    SHARDS_FILE,
    ShardCountError,
    ShardEntry,
    ShardLayout,
    is_sharded,
    read_layout,
    shard_ranges,
)
from indexes.sharding.slices import slice_bm25, slice_metadata

__all__ = [
    "SHARDS_FILE",
    "ShardCountError",
    "ShardEntry",
    "ShardLayout",
    "build_sharded_index",
    "is_sharded",
    "read_layout",
    "shard_ranges",
    "slice_bm25",
    "slice_metadata",
]
