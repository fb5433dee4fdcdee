"""``build_sharded_index``: S shard builds of one logical index, published by one flip.

Global statistics travel with the data: the BM25 impacts are computed once over the whole
collection (its N, df per term, avgdl; okapi's idf floor from the mean over the whole
vocabulary) and each shard stores the impacts of its rows, so a document's BM25 score in its
shard equals its score in the unsharded index, bit for bit. Vectors are computed (or reused by
content hash) once for the collection and split by the same row ranges.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from indexes.analyzer import Analyzer
from indexes.bm25 import BM25Index
from indexes.build import (
    BuildConfig,
    BuildReport,
    _check_ids,
    _Stopwatch,
    _vectors_for,
    content_hashes,
    refuse_passages,
    stage_and_place,
    write_components,
)
from indexes.docstore import Document
from indexes.encoders import Encoder
from indexes.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    EncoderInfo,
    Manifest,
    new_build_id,
    sha256_file,
    write_manifest,
)
from indexes.metadata import MetadataIndex
from indexes.sharding.layout import SHARDS_DIR, SHARDS_FILE, ShardEntry, ShardLayout, shard_ranges
from indexes.sharding.slices import slice_bm25, slice_metadata
from indexes.storage import write_json

DenseLeg = Literal["ivf", "exact"]


def build_sharded_index(
    documents: Iterable[Document],
    root: str | Path,
    shards: int,
    *,
    encoder: Encoder | None = None,
    vectors: np.ndarray | None = None,
    encoder_info: EncoderInfo | None = None,
    config: BuildConfig | None = None,
    progress: bool = True,
    publish: bool = True,
    dense: DenseLeg = "ivf",
) -> BuildReport:
    """Build ``shards`` shard builds of ``documents`` (contiguous row ranges, in input order)
    into one build directory under ``root``, verified, then published atomically.

    Arguments as ``indexes.build.build_index``. ``dense``: each shard's dense leg, ``ivf``
    (faiss IVF trained on the shard's vectors, sized and calibrated as a whole build's) or
    ``exact`` (exact inner products: the merged dense top rows are then exactly the global
    ones, and sharded results equal an exact unsharded index's; costs a scan of the shard's
    vectors when the guardrail calls the dense leg). Raises ``ShardCountError`` for a shard count
    below 1 or above the number of documents.
    """
    config = config or BuildConfig()
    refuse_passages(config, "sharded")
    root = Path(root)
    docs = list(documents)
    _check_ids(docs)
    ranges = shard_ranges(len(docs), shards)
    timer = _Stopwatch()
    analyzer = Analyzer(config.analyzer)
    texts = [d.content for d in docs]
    tokens = [analyzer(t) for t in texts]
    bm25 = BM25Index.build(tokens, config.bm25)
    avgdl = float(np.mean([len(t) for t in tokens]))
    metadata = MetadataIndex.build([d.metadata for d in docs], [d.id for d in docs])
    timer.lap("bm25+metadata")
    hashes = content_hashes(texts)
    matrix, info, reused = _vectors_for(texts, hashes, root, encoder, vectors, encoder_info,
                                        config, progress)
    timer.lap("vectors")
    build_id = new_build_id()

    def write(staging: Path) -> None:
        write_sharded(staging, build_id, docs, bm25, metadata, matrix, hashes, info, config,
                      ranges, avgdl, 0 if dense == "exact" else None)

    final = stage_and_place(root, build_id, write, publish)
    timer.lap("write+publish")
    given = len(docs) if vectors is not None else 0
    return BuildReport(build_id, final, len(docs), vectors_reused=reused,
                       vectors_encoded=len(docs) - reused - given, seconds=timer.laps,
                       vectors_given=given, published=publish)


def write_sharded(
    staging: Path, build_id: str, docs: list[Document], bm25: BM25Index,
    metadata: MetadataIndex, matrix: np.ndarray, hashes: np.ndarray, info: EncoderInfo,
    config: BuildConfig, ranges: list[tuple[int, int]], avgdl: float,
    ann_nlist: int | None = None,
) -> None:
    """Write every shard, shards.json and the top manifest naming their checksums."""
    entries = []
    for i, (start, stop) in enumerate(ranges):
        name = f"shard-{i:03d}"
        directory = staging / SHARDS_DIR / name
        directory.mkdir(parents=True)
        shard_id = f"{build_id}-{name}"
        write_components(directory, shard_id, docs[start:stop], slice_bm25(bm25, start, stop),
                         slice_metadata(metadata, start, stop), matrix[start:stop],
                         hashes[start:stop], info, config, ann_nlist)
        entries.append(ShardEntry(name=name, start=start, stop=stop, build_id=shard_id,
                                  manifest_sha256=sha256_file(directory / MANIFEST)))
    layout = ShardLayout(n_docs=len(docs), avgdl=avgdl, n_terms=len(bm25.vocab_list),
                         shards=entries)
    write_json(staging / SHARDS_FILE, layout.model_dump(mode="json"))
    files = {SHARDS_FILE: sha256_file(staging / SHARDS_FILE)}
    files.update({f"{SHARDS_DIR}/{e.name}/{MANIFEST}": e.manifest_sha256 for e in entries})
    write_manifest(staging, Manifest(
        format_version=FORMAT_VERSION, build_id=build_id,
        created_at=datetime.now(UTC).isoformat(), n_docs=len(docs),
        analyzer=config.analyzer.model_dump(mode="json"),
        analyzer_fingerprint=Analyzer(config.analyzer).fingerprint, encoder=info,
        bm25=config.bm25.model_dump(mode="json"), metadata_fields=dict(metadata.kinds),
        files=files,
    ))

