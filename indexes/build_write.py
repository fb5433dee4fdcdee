"""The writers of a build's files: one build's components, or S shard builds of one logical
index under one manifest (``indexes.sharding.layout``).

Global statistics travel with the data: the BM25 impacts are computed once over the whole
collection (its N, df per term, avgdl; okapi's idf floor from the mean over the whole
vocabulary) and each shard stores the impacts of its rows, so a document's BM25 score in its
shard equals its score in the unsharded index, bit for bit. Vectors are computed (or reused by
content hash) once for the collection and split by the same row ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from indexes.analyzer import Analyzer
from indexes.ann import ANN_DIR, make_dense
from indexes.ann_built import DenseBuild
from indexes.bm25 import BM25Index
from indexes.docstore import DocStore, Document
from indexes.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    EncoderInfo,
    Manifest,
    checksum_tree,
    sha256_file,
    write_manifest,
)
from indexes.metadata import MetadataIndex
from indexes.passages import PassageMap
from indexes.sharding.layout import SHARDS_DIR, SHARDS_FILE, ShardEntry, ShardLayout
from indexes.sharding.slices import slice_bm25, slice_metadata
from indexes.storage import save_array, write_json
from indexes.vectors import Bounds, VectorStore, vector_bounds

if TYPE_CHECKING:
    from indexes.build import BuildConfig

DenseLeg = Literal["ivf", "exact"]  # a shard's dense leg (``indexes.build.build_index``)

def write_components(
    directory: Path, build_id: str, docs: Sequence[Document], bm25: BM25Index,
    metadata: MetadataIndex, matrix: np.ndarray, hashes: np.ndarray, info: EncoderInfo,
    config: BuildConfig, ann_nlist: int | None = None, passage_map: PassageMap | None = None,
    dense: DenseBuild | None = None, vector_bounds: Bounds | None = None,
    **manifest_fields: Any,
) -> None:
    """Write every component of one build and its manifest into ``directory`` (a whole build,
    or one shard of a sharded build: ``indexes.sharding``). ``ann_nlist``: IVF lists of the
    dense leg (None = by corpus size, 0 = exact search); ``dense``: the dense leg already
    being built (``indexes.ann_built.dense_beside``), waited for once the other files are
    written; ``vector_bounds``: a shard's int8 codes scaled by the whole collection's bounds
    (``indexes.vectors.quantize_int8``); ``manifest_fields``: the manifest's optional fields
    (``log_seq``, ``window``, ``passages``)."""
    bm25.save(directory / "bm25", config.postings)
    metadata.save(directory / "metadata")
    VectorStore.build(matrix, config.vector_dtype, vector_bounds).save(directory / "vectors")
    save_array(directory / "vectors" / "content_hashes.npy", hashes)
    DocStore.build(docs).save(directory / "docstore")
    if passage_map is not None:
        passage_map.save(directory / "passages")
    built = dense() if dense is not None else make_dense(matrix, kind=config.ann,
                                                         nlist=ann_nlist)
    built.save(directory / ANN_DIR)
    analyzer = Analyzer(config.analyzer)
    write_manifest(directory, Manifest(
        format_version=FORMAT_VERSION, build_id=build_id,
        created_at=datetime.now(UTC).isoformat(), n_docs=len(docs),
        analyzer=config.analyzer.model_dump(mode="json"),
        analyzer_fingerprint=analyzer.fingerprint, encoder=info,
        bm25=config.bm25.model_dump(mode="json"),
        metadata_fields=dict(metadata.kinds), files=checksum_tree(directory), **manifest_fields,
    ))


def write_sharded(
    staging: Path, build_id: str, docs: list[Document], bm25: BM25Index,
    metadata: MetadataIndex, matrix: np.ndarray, hashes: np.ndarray, info: EncoderInfo,
    config: BuildConfig, ranges: list[tuple[int, int]], avgdl: float,
    ann_nlist: int | None = None, passage_map: PassageMap | None = None,
    grid: Bounds | None = None, **manifest_fields: Any,
) -> None:
    """Write every shard, shards.json and the top manifest naming their checksums;
    ``manifest_fields`` as ``write_components`` (on the top manifest). In a passage build
    every range holds whole documents, and each shard is a passage build of its own.
    ``grid``: the int8 bounds to quantize on (default: the whole matrix's)."""
    entries = []
    # int8 shards share the whole matrix's scale, so their codes and cosines are the whole
    # build's (a shard's own bounds ranked its rows by other rounding).
    bounds = (grid or vector_bounds(matrix)) if config.vector_dtype == "int8" else None
    for i, (start, stop) in enumerate(ranges):
        name = f"shard-{i:03d}"
        directory = staging / SHARDS_DIR / name
        directory.mkdir(parents=True)
        shard_id = f"{build_id}-{name}"
        part = None if passage_map is None else passage_map.sliced(start, stop)
        shard_fields: dict[str, Any] = {} if part is None else {
            "passages": part.info_like(manifest_fields["passages"])}
        write_components(directory, shard_id, docs[start:stop], slice_bm25(bm25, start, stop),
                         slice_metadata(metadata, start, stop), matrix[start:stop],
                         hashes[start:stop], info, config, ann_nlist, passage_map=part,
                         vector_bounds=bounds, **shard_fields)
        entries.append(ShardEntry(name=name, start=start, stop=stop, build_id=shard_id,
                                  manifest_sha256=sha256_file(directory / MANIFEST)))
    write_layout(staging, build_id, entries, avgdl, len(bm25.vocab_list), info, config,
                 dict(metadata.kinds), **manifest_fields)


def write_layout(
    staging: Path, build_id: str, entries: list[ShardEntry], avgdl: float, n_terms: int,
    info: EncoderInfo, config: BuildConfig, kinds: dict[str, Any], **manifest_fields: Any,
) -> None:
    """shards.json and the top manifest naming the written shards' checksums."""
    n_docs = sum(e.stop - e.start for e in entries)
    layout = ShardLayout(n_docs=n_docs, avgdl=avgdl, n_terms=n_terms, shards=entries)
    write_json(staging / SHARDS_FILE, layout.model_dump(mode="json"))
    files = {SHARDS_FILE: sha256_file(staging / SHARDS_FILE)}
    files.update({f"{SHARDS_DIR}/{e.name}/{MANIFEST}": e.manifest_sha256 for e in entries})
    write_manifest(staging, Manifest(
        format_version=FORMAT_VERSION, build_id=build_id,
        created_at=datetime.now(UTC).isoformat(), n_docs=n_docs,
        analyzer=config.analyzer.model_dump(mode="json"),
        analyzer_fingerprint=Analyzer(config.analyzer).fingerprint, encoder=info,
        bm25=config.bm25.model_dump(mode="json"), metadata_fields=kinds,
        files=files, **manifest_fields,
    ))
