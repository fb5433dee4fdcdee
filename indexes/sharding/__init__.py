"""The layout of shard builds of one logical index that share its global BM25 statistics
(written by ``indexes.build.build_index(..., shards=S)``)."""

from indexes.sharding.layout import (
    SHARDS_FILE,
    ShardCountError,
    ShardEntry,
    ShardLayout,
    build_parts,
    is_sharded,
    read_layout,
    shard_ranges,
    stored_vectors,
)
from indexes.sharding.slices import slice_bm25, slice_metadata

__all__ = [
    "SHARDS_FILE",
    "ShardCountError",
    "ShardEntry",
    "ShardLayout",
    "build_parts",
    "is_sharded",
    "read_layout",
    "shard_ranges",
    "slice_bm25",
    "slice_metadata",
    "stored_vectors",
]
