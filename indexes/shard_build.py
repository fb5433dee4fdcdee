"""The sharded build, streamed: each shard's rows are read, analyzed and written by one task,
so no process ever holds the whole collection (``build_index(shards=S)`` holds it all).

Each shard has its own source: a picklable callable returning its documents and their
vectors (``ShardRows``), read twice, so it must return the same rows each time:

1. Survey, one task per shard: the shard's terms in first-occurrence order with their document
   frequencies, its total row length, its words (for the typo dictionary), its metadata
   fields' kinds and keyword values, and a hash of each document id.
2. Reduce, once, in the calling process: the collection's terms numbered as
   ``indexes.analysis.merge_parts`` numbers them (shard by shard), N, df per term, avgdl and
   the idf over the whole vocabulary, the typo dictionary, each field's kind and every keyword
   value; duplicate ids across shards and fields of two kinds are refused here.
3. Write, one task per shard: the shard analyzed again, its postings numbered by the
   collection's terms and scored with the collection's statistics, its metadata with the
   collection's fields, its vectors, dense leg and document store: a complete shard build,
   written straight into the staging build. Then shards.json and the top manifest, and one
   flip of ``CURRENT``.

Every shard's files equal those of ``build_index(documents, shards=S)`` over the same rows,
byte for byte, BM25 arrays included (tests/test_shard_build.py). Tasks run where ``run``
puts them: in this process one at a time (``run_here``, the least memory), in worker
processes (``run_in_processes``) or on Ray (``indexes.ray_build.ray_runner``); their
directory must be reachable from every worker (one machine, or a shared filesystem). The
writes can have a runner of their own (``run_writes``): a write holds its shard's whole index
(12 GB at 1.25M rows), a survey a fraction of that (1.6 GB), so where one write at a time fits
the surveys can still run side by side.

A streamed build indexes whole documents with vectors given by the sources; live writes
logged before it starts are superseded by the sources (the export), as in ``build_index``.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from indexes import rebuild
from indexes.analysis import analyze
from indexes.bm25 import BM25Index, CollectionStatistics, doc_freqs_of
from indexes.build import (
    BuildConfig,
    BuildReport,
    check_documents,
    recorded_settings,
    stage_and_place,
)
from indexes.build_write import DenseLeg, write_components, write_layout
from indexes.cpu import peak_rss_bytes
from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.manifest import (
    MANIFEST,
    EncoderInfo,
    check_new_root,
    new_build_id,
    sha256_file,
)
from indexes.metadata import (
    CollectionFields,
    FieldKind,
    MetadataIndex,
    field_columns,
    keyword_pairs,
    kinds_of,
    listed_only,
    merge_kinds,
)
from indexes.sharding.layout import SHARDS_DIR, ShardEntry
from indexes.storage import tree_size
from indexes.typos import TypoIndex
from indexes.vectors import (
    Bounds,
    content_hashes,
    joined_bounds,
    non_finite_row,
    vector_bounds,
)
from indexes.wal.seal import unpin

ShardRows = tuple[list[Document], np.ndarray]  # documents, float32 (n, dim) vectors
ShardSource = Callable[[], ShardRows]
Job = TypeVar("Job")
Out = TypeVar("Out")
Runner = Callable[[Callable[[Job], Out], Sequence[Job]], list[Out]]


def run_here(task: Callable[[Job], Out], jobs: Sequence[Job]) -> list[Out]:
    """One task after another in this process: one shard in memory at a time."""
    return [task(job) for job in jobs]


def run_in_processes(workers: int) -> Runner:
    """Tasks in ``workers`` fresh processes (spawned: forking a process that runs numba and
    BLAS threads is unsafe; one task per process, so each reports its own peak memory)."""
    def run(task: Callable[[Job], Out], jobs: Sequence[Job]) -> list[Out]:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1) as pool:
            return list(pool.map(task, jobs))
    return run  # type: ignore[return-value]


@dataclass
class GivenRows:
    """A shard source holding its rows already (picklable: worker processes and Ray take it).
    """

    documents: list[Document]
    vectors: np.ndarray

    def __call__(self) -> ShardRows:
        return self.documents, self.vectors


@dataclass
class Survey:
    """What the reduce needs of one shard."""

    n_rows: int
    length_sum: int
    terms: list[str]  # first-occurrence order
    doc_freq: np.ndarray  # int64, aligned with terms
    words: dict[str, str]
    id_hashes: np.ndarray  # uint64 per row
    kinds: dict[str, FieldKind]
    values: dict[str, list[str]]  # sorted indexed values of the shard's keyword fields
    bounds: Bounds  # its vectors' per-dimension (min, max)
    listed: list[str]  # fields of no kind holding an empty list here (``listed_only``)


@dataclass
class Collection:
    """The reduce's result: what every shard is written with."""

    vocab: list[str]
    statistics: CollectionStatistics
    typos: TypoIndex | None
    fields: CollectionFields
    bounds: Bounds  # every shard's vectors' (min, max): the int8 codes' common scale


@dataclass
class SurveyJob:
    shard: int
    source: ShardSource
    config: BuildConfig


@dataclass
class WriteJob:
    shard: int
    source: ShardSource
    directory: Path
    build_id: str
    collection: Collection
    config: BuildConfig
    info: EncoderInfo
    dense: DenseLeg
    survey: tuple[int, int]  # (rows, hash of the ids) the survey read


@dataclass
class Written:
    entry_name: str
    n_rows: int
    manifest_sha256: str
    seconds: float
    peak_rss_bytes: int


def read_shard(shard: int, source: ShardSource, dim: int | None = None) -> ShardRows:
    """The shard's rows, checked: documents, and one float32 vector per document."""
    documents, vectors = source()
    if not documents:
        raise CorpusError(f"shard {shard}'s source gave no documents: every shard needs at "
                          "least one; give fewer shards")
    try:  # as a whole build checks them (ids repeated across shards are found later)
        check_documents(documents)
    except CorpusError as exc:
        raise CorpusError(f"shard {shard}: {exc}") from exc
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or len(matrix) != len(documents) or (dim and matrix.shape[1] != dim):
        raise CorpusError(f"shard {shard}'s source gave vectors of shape {matrix.shape} for "
                          f"{len(documents)} documents; give one row of the encoder's "
                          f"dimension{f' ({dim})' if dim else ''} per document")
    if (row := non_finite_row(matrix)) is not None:
        raise CorpusError(f"shard {shard}'s source gave a vector holding NaN or infinity "
                          f"(row {row}, document {documents[row].id!r}): give finite vectors")
    return documents, matrix


def shard_documents(shard: int, source: ShardSource) -> list[Document]:
    """The shard's documents, checked with its vectors, which are dropped at once: a survey
    analysing 2.5M documents held their 3.8 GB of vectors to the end otherwise."""
    return read_shard(shard, source)[0]


def id_hashes(documents: Sequence[Document]) -> np.ndarray:
    """uint64 (n,): an 8-byte hash of each document id (duplicates are found by these, then
    confirmed on the ids themselves)."""
    digests = b"".join(hashlib.blake2b(d.id.encode("utf-8"), digest_size=8).digest()
                       for d in documents)
    return np.frombuffer(digests, dtype=np.uint64)


def survey_shard(job: SurveyJob) -> Survey:
    documents, matrix = read_shard(job.shard, job.source)
    bounds = vector_bounds(matrix)
    del matrix  # as shard_documents: not held through the analysis
    postings = analyze([d.content for d in documents], job.config.analyzer,
                       job.config.analysis_workers)
    records = [d.metadata for d in documents]
    ids = [d.id for d in documents]
    columns = field_columns(records)
    kinds = kinds_of(columns, records, ids)  # a field of two kinds within the shard
    values = {f: sorted(set(keyword_pairs(columns[f])[1]))
              for f, k in kinds.items() if k == "keyword"}
    doc_freq = np.bincount(postings.post_terms, minlength=len(postings.terms)).astype(np.int64)
    return Survey(len(documents), int(postings.lengths.sum(dtype=np.int64)), postings.terms,
                  doc_freq, postings.words, id_hashes(documents), kinds, values, bounds,
                  listed_only(columns, kinds))


def field_values(job: tuple[int, ShardSource, list[str]]) -> dict[str, list[str]]:
    """The sorted indexed values of ``fields`` in one shard (fields that are keyword fields
    in the collection but held only dates in this shard)."""
    shard, source, fields = job
    documents = shard_documents(shard, source)
    columns = field_columns([d.metadata for d in documents])
    return {f: sorted(set(keyword_pairs(columns.get(f, []))[1])) for f in fields}


def ids_of(job: tuple[int, ShardSource, np.ndarray]) -> list[str]:
    """The ids of one shard's documents whose hash is among ``hashes``."""
    shard, source, hashes = job
    documents = shard_documents(shard, source)
    hit = np.isin(id_hashes(documents), hashes)
    return [d.id for d, h in zip(documents, hit, strict=True) if h]


def reduce_surveys(surveys: Sequence[Survey], config: BuildConfig) -> Collection:
    """The collection's terms, statistics, typo dictionary and fields from its shards'."""
    ids: dict[str, int] = {}
    words: dict[str, str] = {}
    for survey in surveys:  # merge_parts' numbering: shard by shard, new terms in order
        for term in survey.terms:
            ids.setdefault(term, len(ids))
        words.update(survey.words)
    doc_freq = np.zeros(len(ids), dtype=np.int64)
    for survey in surveys:
        doc_freq[[ids[t] for t in survey.terms]] += survey.doc_freq
    statistics = CollectionStatistics.of(doc_freq, sum(s.n_rows for s in surveys),
                                         sum(s.length_sum for s in surveys), config.bm25)
    typos = None
    if config.typo_tolerance:
        typos = TypoIndex.build(words, lambda ws: [words[w] for w in ws],
                                lambda stems: doc_freqs_of(ids, doc_freq, stems))
    return Collection(list(ids), statistics, typos, collection_fields(surveys),
                      joined_bounds([s.bounds for s in surveys]))


def collection_fields(surveys: Sequence[Survey]) -> CollectionFields:
    """Each field's kind over every shard (a CorpusError naming the shards of a field of two
    kinds) and the union of its keyword values (those of shards still to read are added by
    ``complete_values``)."""
    seen: dict[str, dict[FieldKind, int]] = {}
    for shard, survey in enumerate(surveys):
        for field, kind in survey.kinds.items():
            seen.setdefault(field, {}).setdefault(kind, shard)
    kinds: dict[str, FieldKind] = {}
    for field in sorted(seen):
        merged = merge_kinds(set(seen[field]))
        if merged is None:
            where = ", ".join(f"{k} values in shard {s}" for k, s in sorted(seen[field].items()))
            raise CorpusError(f"metadata field {field!r} holds {where}; give every document "
                              "the same type for this field (or leave it out)")
        kinds[field] = merged
    for field in sorted(set().union(*(s.listed for s in surveys)) - set(kinds)):
        kinds[field] = "keyword"  # as a whole build: no shard gave it another kind
    values = {f: sorted(set().union(*(s.values.get(f, ()) for s in surveys)))
              for f, k in kinds.items() if k == "keyword"}
    return CollectionFields(kinds, values)


def complete_values(fields: CollectionFields, surveys: Sequence[Survey],
                    sources: Sequence[ShardSource], run: Runner) -> CollectionFields:
    """Add the values of keyword fields that a shard surveyed as dates (its strings all
    looked like dates, others' did not): those shards are read once more for them."""
    missing = {shard: [f for f, k in s.kinds.items()
                       if k == "date" and fields.kinds[f] == "keyword"]
               for shard, s in enumerate(surveys)}
    jobs = [(shard, sources[shard], names) for shard, names in missing.items() if names]
    if not jobs:
        return fields
    values = {f: set(v) for f, v in fields.values.items()}
    for found in run(field_values, jobs):
        for field, extra in found.items():
            values[field].update(extra)
    return CollectionFields(fields.kinds, {f: sorted(v) for f, v in values.items()})


def check_unique_ids(surveys: Sequence[Survey], sources: Sequence[ShardSource],
                     run: Runner) -> None:
    """A CorpusError naming a document id held twice (in one shard or two)."""
    hashes = np.concatenate([s.id_hashes for s in surveys])
    unique, counts = np.unique(hashes, return_counts=True)
    repeated = unique[counts > 1]
    if not repeated.size:
        return
    shards = [i for i, s in enumerate(surveys) if np.isin(s.id_hashes, repeated).any()]
    found = run(ids_of, [(i, sources[i], repeated) for i in shards])
    held: dict[str, list[int]] = {}
    for shard, ids in zip(shards, found, strict=True):
        for doc_id in ids:
            held.setdefault(doc_id, []).append(shard)
    for doc_id, where in held.items():
        if len(where) > 1:
            raise CorpusError(f"duplicate document id {doc_id!r} (in shards "
                              f"{sorted(set(where))}): ids must be unique")
    # else: distinct ids whose 8-byte hashes collide


def write_shard(job: WriteJob) -> Written:
    """Read, analyze and write one shard build into ``job.directory``."""
    began = time.perf_counter()
    documents, matrix = read_shard(job.shard, job.source, job.info.dim)
    if (len(documents), hash_of(id_hashes(documents))) != job.survey:
        raise CorpusError(f"shard {job.shard}'s source gave other documents on its second "
                          "read: a streamed build reads each source twice, so it must return "
                          "the same rows each time")
    texts = [d.content for d in documents]
    hashes = content_hashes(texts)
    config = job.config
    postings = analyze(texts, config.analyzer, config.analysis_workers)
    del texts  # as build_index: neither the strings nor the postings are held while writing
    number = {term: i for i, term in enumerate(job.collection.vocab)}
    renumber = np.fromiter((number[t] for t in postings.terms), dtype=np.int32,
                           count=len(postings.terms))
    bm25 = BM25Index.from_postings(job.collection.vocab, renumber[postings.post_terms],
                                   postings.post_rows, postings.post_tfs, postings.lengths,
                                   config.bm25, job.collection.statistics)
    del postings
    bm25.typos = job.collection.typos
    metadata = MetadataIndex.build([d.metadata for d in documents], [d.id for d in documents],
                                   job.collection.fields)
    if job.directory.exists():  # a retried task (its worker was killed): start it over
        shutil.rmtree(job.directory)
    job.directory.mkdir(parents=True)
    write_components(job.directory, f"{job.build_id}-{job.directory.name}", documents, bm25,
                     metadata, matrix, hashes, job.info, config,
                     0 if job.dense == "exact" else None,
                     vector_bounds=job.collection.bounds)
    return Written(job.directory.name, len(documents),
                   sha256_file(job.directory / MANIFEST), time.perf_counter() - began,
                   peak_rss_bytes())


def hash_of(hashes: np.ndarray) -> int:
    return int.from_bytes(hashlib.blake2b(hashes.tobytes(), digest_size=8).digest(), "little")


def build_streamed(
    sources: Sequence[ShardSource], root: str | Path, *, encoder_info: EncoderInfo,
    config: BuildConfig | None = None, run: Runner = run_here,
    run_writes: Runner | None = None, publish: bool = True, dense: DenseLeg = "ivf",
) -> BuildReport:
    """Build one shard per source into a sharded build under ``root`` (module docstring);
    ``encoder_info`` names the encoder of the sources' vectors, ``dense`` as ``build_index``'s;
    ``run`` runs the surveys (and the writes unless ``run_writes`` is given)."""
    config = config or BuildConfig()
    if config.passages is not None:
        raise CorpusError("a streamed build indexes whole documents: give the sources passages "
                          "as documents, or build with build_index(shards=S, config=...) to "
                          "split them")
    if not sources:
        raise CorpusError("a streamed build needs at least one shard source")
    root = Path(root)
    check_new_root(root)  # before the surveys (hours at scale), as build_index and Ray's
    laps: dict[str, float] = {}
    began = time.perf_counter()
    # The sources are the export: a write acknowledged from now on is applied on top of the
    # build, not superseded by sources read before it (the surveys can take hours).
    sealed = rebuild.start(root, "superseded")
    log_seq, contract, exported_at = sealed.log_seq, sealed.contract, sealed.exported_at
    try:
        surveys = run(survey_shard, [SurveyJob(i, s, config) for i, s in enumerate(sources)])
        laps["survey"] = lap = round(time.perf_counter() - began, 3)
        check_unique_ids(surveys, sources, run)
        collection = reduce_surveys(surveys, config)
        collection.fields = complete_values(collection.fields, surveys, sources, run)
        laps["reduce"] = round(time.perf_counter() - began - lap, 3)
        info = encoder_info.model_copy(update={"vector_dtype": config.vector_dtype})
        build_id = new_build_id()
        written: list[Written] = []

        def write(staging: Path) -> None:
            jobs = [WriteJob(i, source, staging / SHARDS_DIR / f"shard-{i:03d}", build_id,
                             collection, config, info, dense,
                             (surveys[i].n_rows, hash_of(surveys[i].id_hashes)))
                    for i, source in enumerate(sources)]
            written.extend((run_writes or run)(write_shard, jobs))
            write_layout(staging, build_id, entries_of(written, build_id),
                         collection.statistics.avgdl, len(collection.vocab), info, config,
                         dict(collection.fields.kinds), log_seq=log_seq,
                         allow_new_fields=config.allow_new_fields, live_writes=contract,
                         exported_at=exported_at, settings=recorded_settings(config, dense))

        final, retired = stage_and_place(root, build_id, write, publish)
        laps["shards+publish"] = round(time.perf_counter() - began - sum(laps.values()), 3)
        n_docs = sum(s.n_rows for s in surveys)
        return BuildReport(build_id, final, n_docs, vectors_reused=0, vectors_encoded=0,
                           seconds=laps, vectors_given=n_docs, published=publish,
                           live_writes=contract, segments_retired=retired,
                           size_bytes=tree_size(final),
                           peak_rss_bytes=peak_rss_bytes(),  # this process's; the tasks':
                           part_seconds=[round(w.seconds, 3) for w in written],
                           part_peak_rss_bytes=[w.peak_rss_bytes for w in written])
    finally:
        unpin(sealed.pin)


def entries_of(written: Sequence[Written], build_id: str) -> list[ShardEntry]:
    """The shards in row order, each starting where the one before stops."""
    entries, start = [], 0
    for w in written:
        entries.append(ShardEntry(name=w.entry_name, start=start, stop=start + w.n_rows,
                                  build_id=f"{build_id}-{w.entry_name}",
                                  manifest_sha256=w.manifest_sha256))
        start += w.n_rows
    return entries
