"""The offline build pipeline: documents in, one checksummed, published build out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexes import rebuild
from indexes.analysis import CollectionPostings, analyze
from indexes.analyzer import AnalyzerConfig
from indexes.ann import AnnKind, make_dense
from indexes.ann_built import DenseBuild, dense_beside
from indexes.bm25 import BM25Index, BM25Params, PostingsFormat
from indexes.build_write import DenseLeg, write_components, write_sharded
from indexes.cpu import peak_rss_bytes
from indexes.docstore import Document
from indexes.encoders import Encoder, default_model_path
from indexes.errors import CorpusError, RetrievalError
from indexes.going_live import go_live
from indexes.long_documents import (
    WindowReport,
    split_documents,
    token_counter_for,
    window_report,
)
from indexes.manifest import (
    BuildSettings,
    EncoderInfo,
    LiveWrites,
    LiveWritesInfo,
    check_new_root,
    current_build_dir,
    discard,
    new_build_id,
    place,
    read_manifest,
    staging_dir,
)
from indexes.metadata import MetadataIndex, refuse_surrogates
from indexes.passages import PassageConfig, PassageInfo, PassageMap, TokenCounter
from indexes.sharding.layout import shard_ranges, stored_vectors
from indexes.storage import tree_size
from indexes.typos import TypoIndex
from indexes.vectors import (
    FLOAT16_MAX,
    Bounds,
    VectorDtype,
    VectorStore,
    content_hashes,
    non_finite_row,
    out_of_range_row,
    widened_grid,
)
from indexes.wal.seal import unpin

log = logging.getLogger(__name__)


class BuildConfig(BaseModel):
    """How an index is built. Defaults are the measured SciFact choices (see README)."""

    model_config = ConfigDict(extra="forbid")

    analyzer: AnalyzerConfig = Field(default_factory=AnalyzerConfig)
    typo_tolerance: bool = Field(True, description="write the corpus words' deletion "
                                 "dictionary (indexes.typos) the keyword leg corrects with")
    bm25: BM25Params = Field(default_factory=BM25Params)
    postings: PostingsFormat = Field(
        "plain", description="the BM25 postings' format: plain (int32 row and float32 impact, "
        "8 bytes a posting, read in place) or compact (varint row gaps, a byte of term "
        "frequency and per-row norms, ~2.5 bytes a posting, each query's postings decoded "
        "when it reads them; the same scores: indexes.compact_postings)")
    analysis_workers: int | None = Field(
        None, ge=1, description="threads the analysis and postings stages run in, over "
        "contiguous parts of the corpus (default: one per core); any number gives the same "
        "index, byte for byte")
    vector_dtype: VectorDtype = "float32"
    batch_size: int = Field(64, ge=1)
    reuse_vectors: bool = True
    ann: AnnKind = Field("ivf", description="the dense leg's index: ivf (faiss IVF-Flat) or "
                         "hnsw (faiss HNSW-Flat); benchmarks/README.md compares them")
    reuse_from: str | None = Field(
        None, description="index root whose live build's vectors are reused by content hash "
        "(default: the output root, i.e. the previous nightly build)")
    passages: PassageConfig | None = Field(
        None, description="split documents into passages that fit the encoder's window "
        "(default: one row and one vector per document)")
    allow_new_fields: bool = Field(
        False, description="let live upserts add metadata fields the build does not have "
        "(default: such an upsert is refused, so a typo in a field name cannot change the "
        "schema)")


@dataclass
class BuildReport:
    """What a build did. Every document's vector was reused from the previous build, encoded
    now, or given precomputed by the caller: the three counts add up to ``n_docs``."""

    build_id: str
    path: Path
    n_docs: int
    vectors_reused: int
    vectors_encoded: int
    seconds: dict[str, float] = field(default_factory=dict)
    vectors_given: int = 0
    published: bool = True  # False: staged in builds/, CURRENT untouched
    window: WindowReport | None = None  # documents longer than the encoder's window
    passages: PassageInfo | None = None  # passage builds: rows are passages
    live_writes: LiveWritesInfo | None = None  # the rebuild contract (``indexes.rebuild``)
    segments_retired: int = 0  # log segments this build folded, deleted once it was live
    size_bytes: int = 0  # the build directory on disk
    peak_rss_bytes: int = 0  # the building process's peak resident memory, as of the build's end
    # A streamed build's (``indexes.shard_build``): each shard task's seconds and peak memory
    part_seconds: list[float] = field(default_factory=list)
    part_peak_rss_bytes: list[int] = field(default_factory=list)

    def describe_resources(self) -> str:
        return (f"index {self.size_bytes / 2**20:,.1f} MiB on disk; peak RSS of the building "
                f"process {self.peak_rss_bytes / 2**20:,.0f} MiB")

    def describe_vectors(self) -> str:
        if self.vectors_given:
            return f"{self.vectors_given} vectors given precomputed"
        return f"{self.vectors_reused} vectors reused, {self.vectors_encoded} encoded"


def _previous_vectors(root: Path, encoder_id: str) -> tuple[dict[bytes, int], VectorStore] | None:
    """Content hash -> row of the live build's vectors, when made by the same encoder."""
    previous = current_build_dir(root)
    if previous is None:
        return None
    try:
        manifest = read_manifest(previous)
        # Only exact float32 vectors are reused: re-quantizing dequantized codes would drift.
        if manifest.encoder.encoder_id != encoder_id or manifest.encoder.vector_dtype != "float32":
            return None
        hashes, store = stored_vectors(previous)
    except RetrievalError as exc:
        log.warning("previous build %s not reusable, re-encoding everything: %s", previous, exc)
        return None
    return {bytes(h): row for row, h in enumerate(hashes)}, store


def embed_documents(
    texts: Sequence[str], hashes: np.ndarray, encoder: Encoder, root: Path,
    config: BuildConfig, progress: bool,
) -> tuple[np.ndarray, int]:
    """Vectors for ``texts``, reusing the live build's where the content hash matches."""
    vectors = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    source = Path(config.reuse_from) if config.reuse_from else root
    previous = _previous_vectors(source, encoder.encoder_id) if config.reuse_vectors else None
    todo = list(range(len(texts)))
    if previous is not None:
        row_of, store = previous
        found = [(i, row_of[bytes(h)]) for i, h in enumerate(hashes) if bytes(h) in row_of]
        if found:
            mine, theirs = (np.array(x) for x in zip(*found, strict=True))
            vectors[mine] = store.reconstruct_rows(theirs)
        done = {i for i, _ in found}
        todo = [i for i in todo if i not in done]
    if todo:
        encoded = np.asarray(encoder.encode([texts[i] for i in todo],
                                            batch_size=config.batch_size, progress=progress))
        if encoded.shape != (len(todo), encoder.dim):
            raise CorpusError(f"the encoder {encoder.encoder_id} returned vectors of shape "
                              f"{encoded.shape} for {len(todo)} texts; it says it makes "
                              f"{encoder.dim}-dimensional ones")
        if (row := non_finite_row(encoded)) is not None:  # every search would rank it first
            raise CorpusError(f"the encoder {encoder.encoder_id} returned NaN or infinity for "
                              f"row {todo[row]} ({texts[todo[row]][:60]!r}); nothing was "
                              "built")
        vectors[todo] = encoded
    return vectors, len(texts) - len(todo)


# Each document part's type, as a live write checks it: a build met an int id or a None text
# as an AttributeError or TypeError deep in the analysis.
PART_TYPES = (("id", str), ("text", str), ("title", str), ("metadata", dict))


def check_documents(documents: Sequence[Document]) -> None:
    """Refuse what a live write refuses (``indexes.wal.checks``), naming the document: an
    empty corpus, a part of the wrong type (types are read column by column, in C), an empty
    or blank id (a write could never update or delete it), a repeated id."""
    if not documents:
        raise CorpusError("the corpus is empty: give at least one document")
    for part, wanted in PART_TYPES:
        if not all(issubclass(t, wanted) for t in set(map(type, map(attrgetter(part),
                                                                      documents)))):
            row = next(i for i, d in enumerate(documents)
                       if not isinstance(getattr(d, part), wanted))
            value = getattr(documents[row], part)
            raise CorpusError(f"document {row} ({documents[row].id!r}): its {part} is a "
                              f"{type(value).__name__} ({value!r:.60}); give a "
                              f"{wanted.__name__}")
    ids = [d.id for d in documents]
    refuse_surrogates(ids, "a document id")
    refuse_surrogates([d.title for d in documents], "a title")  # texts: content_hashes
    # Values are checked as the metadata index is built; a name only when its schema is
    # saved, after the whole corpus was encoded.
    names = {name for d in documents for name in d.metadata if isinstance(name, str)}
    refuse_surrogates(sorted(names), "a metadata field name")
    distinct = set(ids)
    if "" in distinct or any(map(str.isspace, distinct)):
        row = next(i for i, doc_id in enumerate(ids) if not doc_id.strip())
        raise CorpusError(f"document {row} has a blank id ({ids[row]!r}): give every "
                          "document a non-empty id")
    if len(distinct) < len(ids):
        seen: set[str] = set()
        for doc_id in ids:
            if doc_id in seen:
                raise CorpusError(f"duplicate document id {doc_id!r}: ids must be unique")
            seen.add(doc_id)


def build_index(
    documents: Iterable[Document],
    root: str | Path,
    *,
    encoder: Encoder | None = None,
    vectors: np.ndarray | None = None,
    encoder_info: EncoderInfo | None = None,
    config: BuildConfig | None = None,
    progress: bool = True,
    publish: bool = True,
    log_seq: int | None = None,
    export_seq: int | None = None,
    exported_at: str | None = None,
    shards: int | None = None,
    dense: DenseLeg = "ivf",
    live_writes: LiveWrites = "superseded",
    analysis: Callable[[list[str]], CollectionPostings] | None = None,
    sealed: rebuild.Sealed | None = None,
    field_kinds: Mapping[str, str] | None = None,
    vector_grid: Bounds | None = None,
) -> BuildReport:
    """Build every component, then publish atomically under ``root``.

    ``shards``: write S shard builds of contiguous row ranges (in input order) sharing the
    collection's BM25 statistics, published by one flip (``indexes.sharding``); the same
    stages run for any S. ``dense``: each shard's dense leg, ``ivf`` (trained on the shard's
    vectors, sized and calibrated as a whole build's) or ``exact`` (the merged dense top rows
    are then exactly the global ones); recorded with the config's ``postings``,
    ``typo_tolerance`` and ``ann`` in the manifest, which compactions build with again.
    Raises ``ShardCountError`` for a shard count below 1 or above the number of documents.

    With ``publish=False`` the written build is staged in ``builds/`` without flipping
    ``CURRENT``: the live build keeps serving until ``indexes.publish.publish_build`` (or the
    gated ``retrieval.publishing.publish``) makes the staged one live.

    ``log_seq``: the write-ahead log position folded into these documents, and
    ``export_seq`` the one its base's corpus export accounted for, read at ``exported_at``
    (compaction sets all three). By
    default the build seals the root's log where it starts and ``live_writes`` says
    what happens to the writes logged before that (``indexes.rebuild``): ``superseded`` by
    ``documents`` (the export), or ``replayed`` onto them (needs an ``encoder``); writes
    logged later are applied on top by serving processes. Once the build is live the folded
    log segments are deleted.

    Give either an ``encoder`` (documents are embedded, reusing the live build's vectors by
    content hash) or precomputed ``vectors`` (n, dim) with ``encoder_info`` naming their encoder.

    ``sealed``: where a caller that read ``documents`` long before this call (encoding them
    first) sealed the log when it read them (``indexes.rebuild.start``), so the writes
    acknowledged since are applied on top of this build, not superseded by it.

    ``analysis``: what turns the rows' texts into postings (default: ``indexes.analysis``'s
    threads; ``indexes.ray_build`` passes its Ray tasks). It must give what ``analyze`` gives.

    ``field_kinds``: metadata field kinds kept whatever the documents' values imply alone (a
    compaction keeps the schema served: a field whose values are all deleted stays, and a
    keyword field stays one when its last non-date string goes).

    ``vector_grid``: the int8 codes' bounds to keep, widened only where a vector lies outside
    them (``widened_grid``; a compaction's base grid, ``VectorStore.grid``: the rows it keeps
    are dequantized codes, and quantized on bounds of their own again they drifted a little
    at every compaction).
    """
    config = config or BuildConfig()
    root = Path(root)
    check_new_root(root)
    parents = list(documents)
    check_documents(parents)
    ranges = shard_ranges(len(parents), shards) if shards is not None else None
    contract = None
    own_pin = None  # the pin of the log this build seals itself, dropped when it ends
    try:
        if sealed is None and log_seq is None:
            sealed = rebuild.start(root, live_writes)
            own_pin, changes = sealed.pin, sealed.changes
            if live_writes == "replayed" and (changes.upserts or changes.deleted):
                if vectors is not None:
                    raise CorpusError("live_writes='replayed' embeds the logged documents with "
                                      "the build's encoder: give an encoder instead of vectors, "
                                      "or fold the log first (IndexWriter.compact)")
                parents = rebuild.replay(parents, changes)
                ranges = shard_ranges(len(parents), shards) if shards is not None else None
        if sealed is not None:
            log_seq, contract, exported_at = sealed.log_seq, sealed.contract, sealed.exported_at
            export_seq = log_seq
        timer = _Stopwatch()
        docs, passage_map, passage_info, window = _rows_for(parents, encoder, config)
        timer.lap("split" if passage_map is not None else "window")
        texts = [d.content for d in docs]
        precomputed = _given_vectors(vectors, encoder_info, len(texts), config)
        # Given vectors: the dense leg starts now, beside the keyword side and the writers. Encoded
        # ones come after the keyword side, and beside the writers alone (~11 s at 1M) a leg on
        # one core (~30 s) would gain nothing: it is built with faiss on every core, as before.
        beside = (_dense_beside(precomputed[0], config)
                  if precomputed is not None and ranges is None else None)
        postings = (analysis(texts) if analysis is not None
                    else analyze(texts, config.analyzer, config.analysis_workers))
        bm25 = BM25Index.from_postings(postings.terms, postings.post_terms, postings.post_rows,
                                       postings.post_tfs, postings.lengths, config.bm25)
        timer.lap("bm25")
        if config.typo_tolerance:
            bm25.typos = TypoIndex.build(postings.words, _stems_of(postings.words), bm25.doc_freqs)
        avgdl = float(postings.lengths.mean()) if len(docs) else 0.0
        del postings  # every posting is in bm25 now: 0.9 GB at 1M passages, not held while writing
        metadata = MetadataIndex.build([d.metadata for d in docs], [d.id for d in docs],
                                       kept=field_kinds)
        timer.lap("typos+metadata")
        hashes = content_hashes(texts)
        if precomputed is not None:
            (matrix, info), reused = precomputed, 0
        else:
            matrix, info, reused = _encoded_vectors(texts, hashes, root, encoder, config, progress)
        del texts  # ~0.6 GB at 1M passages; the doc store writes the documents themselves
        timer.lap("vectors")
        build_id = new_build_id()
        grid = widened_grid(vector_grid, matrix) \
            if vector_grid is not None and config.vector_dtype == "int8" else None
        settings = recorded_settings(config, dense)

        def write(staging: Path) -> None:
            if ranges is not None:
                write_sharded(staging, build_id, docs, bm25, metadata, matrix, hashes, info,
                              config, row_ranges(ranges, passage_map),
                              avgdl, 0 if dense == "exact" else None, passage_map=passage_map,
                              grid=grid,
                              log_seq=log_seq, window=window, passages=passage_info,
                              allow_new_fields=config.allow_new_fields, live_writes=contract,
                              export_seq=export_seq, exported_at=exported_at,
                              settings=settings)
                return
            write_components(staging, build_id, docs, bm25, metadata, matrix, hashes, info, config,
                             passage_map=passage_map, dense=beside, vector_bounds=grid,
                             log_seq=log_seq, window=window,
                             passages=passage_info, allow_new_fields=config.allow_new_fields,
                             live_writes=contract, export_seq=export_seq,
                             exported_at=exported_at, settings=settings)

        final, retired = stage_and_place(root, build_id, write, publish)
        timer.lap("write+publish")
        given = len(docs) if vectors is not None else 0
        return BuildReport(build_id, final, len(docs), vectors_reused=reused,
                           vectors_encoded=len(docs) - reused - given, seconds=timer.laps,
                           vectors_given=given, published=publish, window=window,
                           passages=passage_info, live_writes=contract,
                           segments_retired=retired, size_bytes=tree_size(final),
                           peak_rss_bytes=peak_rss_bytes())
    finally:
        unpin(own_pin)


def recorded_settings(config: BuildConfig, dense: DenseLeg) -> BuildSettings:
    """The settings the manifest records, that a compaction builds with again: a compaction
    with defaults turned compact postings plain and added a typo dictionary, and read an exact
    shard leg as asked when the shard's size had chosen it (``BuildSettings``)."""
    return BuildSettings(postings=config.postings, typo_tolerance=config.typo_tolerance,
                         ann=config.ann, dense=dense)


def _stems_of(terms: dict[str, str]) -> Callable[[list[str]], list[str]]:
    """The stemmer of words whose terms the analysis already found."""
    return lambda words: [terms[w] for w in words]


def _rows_for(
    docs: list[Document], encoder: Encoder | None, config: BuildConfig,
) -> tuple[list[Document], PassageMap | None, PassageInfo | None, WindowReport | None]:
    """The rows to index (documents, or their passages) and the window report.

    Without an encoder naming its tokenizer (precomputed vectors) nothing is measured, unless
    passages are asked for: they are cut with ``passages.tokenizer`` (default: the packaged
    model's)."""
    counter = token_counter_for(encoder) if encoder is not None else None
    if config.passages is None:
        window = window_report(docs, counter) if counter is not None else None
        rows, passage_map, info = docs, None, None
    else:
        rows, passage_map, info, window = split_documents(
            docs, counter or passage_counter(config.passages), config.passages)
        tokenizer = config.passages.tokenizer
        if counter is None and tokenizer and \
                Path(tokenizer).resolve() != default_model_path().resolve():
            # Recorded: live writes and compaction must cut as this build did.
            info = info.model_copy(update={"tokenizer": str(Path(tokenizer).resolve())})
    if window is not None:  # once, in the log (the CLI also prints it in its summary)
        (log.warning if window.rows_over_window else log.info)("%s", window.describe())
    return rows, passage_map, info, window


def stage_and_place(root: Path, build_id: str, write: Callable[[Path], None],
                    publish: bool) -> tuple[Path, int]:
    """``write`` a build into a staging directory, then place it and, when ``publish``, make
    it live; returns its final directory and the log segments deleted as folded. A failure
    while writing leaves nothing behind; a refused publish (``LogGapError``) leaves the build
    placed, staged."""
    root.mkdir(parents=True, exist_ok=True)
    with staging_dir(root, build_id) as staging:
        try:
            write(staging)
            final = place(staging, root, build_id)
        except BaseException:
            discard(staging)
            raise
    return final, go_live(root, build_id, "plain")[1] if publish else 0


def passage_counter(passages: PassageConfig) -> TokenCounter:
    """The tokenizer a build without an encoder cuts passages with: ``passages.tokenizer``,
    else the packaged model's."""
    return TokenCounter.for_model(Path(passages.tokenizer) if passages.tokenizer
                                  else default_model_path())


def row_ranges(doc_ranges: list[tuple[int, int]], passage_map: PassageMap | None
               ) -> list[tuple[int, int]]:
    """Shard ranges of documents as ranges of index rows: in a passage build a document's
    passages stay in one shard."""
    if passage_map is None:
        return doc_ranges
    bounds = passage_map.rows_of_documents([start for start, _ in doc_ranges]
                                           + [doc_ranges[-1][1]])
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _given_vectors(vectors: np.ndarray | None, encoder_info: EncoderInfo | None, n_rows: int,
                   config: BuildConfig) -> tuple[np.ndarray, EncoderInfo] | None:
    """Precomputed vectors checked (one finite row per document) with their encoder info;
    None when the build encodes its own."""
    if vectors is None:
        return None
    if encoder_info is None:
        raise CorpusError("precomputed vectors need encoder_info naming their encoder")
    kind = np.asarray(vectors).dtype
    if kind.kind not in "fiu":  # strings were numpy's ValueError, complex numbers a warning
        raise CorpusError(f"precomputed vectors hold {kind} values; give real numbers "
                          "(float32 rows, one per document)")
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.shape != (n_rows, encoder_info.dim):
        raise CorpusError(f"vectors have shape {matrix.shape}; expected "
                          f"({n_rows}, {encoder_info.dim}), one row per document "
                          "(per passage in a passage build: indexes.split_documents "
                          "gives the passages)")
    if (row := non_finite_row(matrix)) is not None:
        raise CorpusError(f"precomputed vectors: row {row} holds NaN or infinity; "
                          "give finite vectors, one row per document")
    if (row := out_of_range_row(matrix, config.vector_dtype)) is not None:
        raise CorpusError(f"precomputed vectors: row {row} holds a value float16 cannot hold "
                          f"(past {FLOAT16_MAX:,.0f}); normalize the vectors or store them as "
                          "float32 (BuildConfig(vector_dtype='float32'))")
    return matrix, encoder_info.model_copy(update={"vector_dtype": config.vector_dtype})


def _encoded_vectors(
    texts: Sequence[str], hashes: np.ndarray, root: Path, encoder: Encoder | None,
    config: BuildConfig, progress: bool,
) -> tuple[np.ndarray, EncoderInfo, int]:
    """The documents' vectors from ``encoder`` (reused by content hash where they can be),
    their encoder info and how many were reused."""
    if encoder is None:
        raise CorpusError("give an encoder, or precomputed vectors with encoder_info")
    matrix, reused = embed_documents(texts, hashes, encoder, root, config, progress)
    info = EncoderInfo(encoder_id=encoder.encoder_id, model=encoder.model, dim=encoder.dim,
                       vector_dtype=config.vector_dtype)
    return matrix, info, reused


def _dense_beside(matrix: np.ndarray, config: BuildConfig) -> DenseBuild:
    """The whole build's dense leg, started beside the rest of the build."""
    return dense_beside(matrix, lambda m, rebalance: make_dense(m, kind=config.ann,
                                                               rebalance=rebalance))


class _Stopwatch:
    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now
