"""The build on Ray: Ray Data reads the corpus and encodes documents on an actor pool (the
encoder loaded once per actor), the driver reduces the BM25 statistics over the whole
collection and writes the same verified artifact as ``indexes.build``, published atomically.

Needs the ``ray`` extra and a connected cluster (``ray.init()`` or ``ray.init(ADDRESS)``).

Sources: a BEIR folder (its corpus.jsonl), JSONL files, Parquet files, or a directory of either
(many files). Rows are read in file order (Ray Data's ``preserve_order``), so row i of the build
is the i-th document of the sources, as in a local build. A JSONL file is first checked line by
line as the local reader checks it: a key repeated in one object is a ``CorpusError`` naming
the file and the line (Ray Data's reader keeps the last value); a Parquet file's footer is
first checked for a column named twice, as the local reader checks it (refused, naming the
file and the column, unless the mapping leaves that name out). Vectors are reused from the
live build by content hash first; only the remaining documents travel to the encoder actors.

What runs where: reading and parsing (and the JSONL check: one Ray task per 64 MB of a file,
a second parse of it), encoding and the analysis (``indexes.analysis``: one Ray task per
contiguous part, ``BuildConfig.analysis_workers`` of them, default ``workers``) run on the
cluster; merging the parts' postings, the global BM25 reduce (N, df per term, avgdl, the okapi
idf floor over the whole vocabulary) and writing run on the driver, which also holds every
document once. The BM25 arrays are those of a local build, byte for byte.

A collection too large for one process is built with ``indexes.shard_build.build_streamed``
and ``ray_runner()``: each shard is read, analyzed and written by its own Ray task, and the
driver holds only the collection's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexes import rebuild
from indexes.analysis import CollectionPostings, analyze_part, merge_parts, part_ranges
from indexes.analyzer import AnalyzerConfig
from indexes.build import (
    BuildConfig,
    BuildReport,
    _previous_vectors,
    build_index,
    check_documents,
    content_hashes,
    passage_counter,
)
from indexes.corpus import check_lines
from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.long_documents import split_documents
from indexes.manifest import EncoderInfo, check_new_root
from indexes.shard_build import Runner
from indexes.sharding.layout import shard_ranges
from indexes.sources import FieldMapping, cell_value, check_struct_names
from indexes.wal.seal import unpin

Backend = Literal["torch", "onnx"]
# The bytes of a JSONL file one Ray task checks (a few seconds of parsing): a 10 GB file is
# checked by 150 tasks side by side, where one task per file checked it in one serial pass.
CHECK_PART_BYTES = 64 << 20


def source_files(source: str | Path) -> tuple[Literal["json", "parquet"], list[str]]:
    """The files a source names and their format; a CorpusError for anything else."""
    path = Path(source)
    if not path.exists():
        raise CorpusError(f"corpus {path} does not exist; give a BEIR folder, JSONL or Parquet "
                          "files, or a directory of them")
    if path.is_dir() and (path / "corpus.jsonl").is_file():
        return "json", [str(path / "corpus.jsonl")]
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    kinds = {p.suffix for p in files}
    if not files:
        raise CorpusError(f"corpus {path} has no files; give a BEIR folder, JSONL or Parquet "
                          "files, or a directory of them")
    if kinds <= {".jsonl", ".json"}:
        return "json", [str(p) for p in files]
    if kinds <= {".parquet"}:
        return "parquet", [str(p) for p in files]
    raise CorpusError(f"corpus {path} mixes or holds unknown file types {sorted(kinds)}; give "
                      ".jsonl or .parquet files")


def read_documents(source: str | Path, mapping: FieldMapping | None = None) -> list[Document]:
    """Every document of ``source`` read by Ray Data, in file order; ``mapping``: which fields
    hold the id, text and title, and which are metadata (``indexes.sources.FieldMapping``,
    checked against the sources' schema as the local reader checks it)."""
    import ray.data

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    mapping = mapping or FieldMapping()
    kind, files = source_files(source)
    left_out: list[str] = []  # Parquet columns of a name given twice, which it leaves out
    if kind == "json":
        _check_json_files(files)
        dataset = ray.data.read_json(files, lines=True)
    else:
        columns, left_out = _parquet_columns(files, mapping)
        dataset = ray.data.read_parquet(files, columns=columns)
    _check_mapping(mapping, dataset.schema(), str(source), left_out)
    documents = [mapping.document(_plain(row), f"{source}: row {number}")
                 for number, row in enumerate(dataset.iter_rows(), start=1)]
    if not documents:
        raise CorpusError(f"the corpus {source} is empty: give at least one document")
    return documents


def _check_json_files(files: Sequence[str], part_bytes: int = CHECK_PART_BYTES) -> None:
    """Each JSONL file parsed by the local reader's check (``indexes.corpus.check_lines``), one
    Ray task per ``part_bytes`` of a file: Ray Data reads JSON lines with pandas, which keeps
    the last value of a key repeated in one object, and its rows do not know their line. The
    first part refused is checked again here, numbering its lines in the whole file, and its
    refusal raised as the ``CorpusError`` it is, not wrapped in Ray's task error."""
    import ray

    check = ray.remote(num_cpus=1)(_check_part)
    parts = [(Path(file), start, start + part_bytes) for file in files
             for start in range(0, max(Path(file).stat().st_size, 1), part_bytes)]
    pending = [check.remote(path, start, end) for path, start, end in parts]
    for (path, start, end), ref in zip(parts, pending, strict=True):
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            if not isinstance(exc.cause, CorpusError):
                raise
            check_lines(path, start, end)  # raises it again, naming the line in the file
            raise CorpusError(f"{path} changed while it was checked; build from a file no "
                              "process is writing") from None


def _check_part(path: Path, start: int, end: int) -> None:
    check_lines(path, start, end, numbered=False)  # a refusal is checked again, numbered


def _parquet_columns(files: Sequence[str], mapping: FieldMapping
                     ) -> tuple[list[str] | None, list[str]]:
    """(the columns to read, None for all; the names left out), as the local reader chooses
    them (``FieldMapping.columns_to_read``: a name given twice is refused unless the mapping
    leaves it out, when neither column is read). Only each file's footer is read, here on the
    driver, before Ray reads any row: Ray Data's reader refused a repeated name in a Ray task
    with pyarrow's untyped "Multiple matches for FieldRef", wrapped in Ray's task error. A
    struct column naming a field twice is refused here too, as the local reader refuses it
    (``indexes.sources.check_struct_names``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kept: list[str] | None = None
    left_out: list[str] = []
    for file in files:
        try:
            schema = pq.read_schema(file)
        except (pa.ArrowException, OSError) as exc:
            raise CorpusError(f"cannot read {file}: {exc}") from exc
        names = schema.names
        columns = mapping.columns_to_read(names, file)
        check_struct_names(schema, columns, file)
        if columns != names:
            if kept is not None and columns != kept:
                raise CorpusError(f"{file}: its columns {columns} differ from another file's "
                                  f"{kept}; give every file of the corpus the same columns")
            kept = columns
            left_out = [name for name in names if name not in columns]
    return kept, left_out


def _check_mapping(mapping: FieldMapping, schema: Any, where: str,
                   left_out: Sequence[str] = ()) -> None:
    """A mapping naming fields the sources lack is an error listing the ones they have, before
    any row is mapped, as the local reader does (``FieldMapping.check``); the fields of a
    ``metadata`` object are those of its struct column. ``left_out``: Parquet columns there
    but not read (a name given twice that the mapping leaves out)."""
    import pyarrow as pa

    names = list(schema.names) if schema is not None else []
    nested: list[str] = []
    if "metadata" in names:
        kind = schema.types[names.index("metadata")]
        if isinstance(kind, pa.StructType):  # a pandas block's column types are numpy's
            nested = [kind.field(i).name for i in range(kind.num_fields)]
    mapping.check([*names, *left_out], where, nested)


def _plain(row: Any) -> dict[str, Any]:
    """A row as plain Python values (Arrow scalars and numpy values converted), nulls dropped:
    a column absent from some files is null in their rows."""
    def plain(value: Any) -> Any:
        if isinstance(value, np.datetime64):  # a pandas batch's date column
            return str(np.datetime_as_string(value))
        value = cell_value(value)
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return [plain(v) for v in value.tolist()]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if v is not None}
        return value
    return {k: plain(v) for k, v in dict(row).items() if v is not None}


class EncodeActor:
    """A Ray Data actor: the encoder is loaded once, then encodes batches of texts."""

    def __init__(self, backend: Backend, model: str | None, batch_size: int) -> None:
        from indexes.onnx_encoder import make_encoder

        self.encoder = make_encoder(backend, model)
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        return {"row": batch["row"],
                "vector": self.encoder.encode(texts, batch_size=self.batch_size)}


def encode_on_ray(texts: Sequence[str], rows: Sequence[int], backend: Backend,
                  model: str | None, workers: int, batch_size: int, dim: int,
                  cpus_per_worker: float = 1.0) -> np.ndarray:
    """float32 (len(texts), dim): the vectors of ``rows`` encoded by ``workers`` actors."""
    import ray.data

    vectors = np.zeros((len(texts), dim), dtype=np.float32)
    if not rows:
        return vectors
    items = [{"row": int(r), "text": texts[r]} for r in rows]
    blocks = max(1, min(len(items) // batch_size, workers * 8))
    dataset = ray.data.from_items(items, override_num_blocks=blocks).map_batches(
        EncodeActor, fn_constructor_kwargs={"backend": backend, "model": model,
                                            "batch_size": batch_size},
        batch_size=batch_size * 4, concurrency=workers, num_cpus=cpus_per_worker)
    for batch in dataset.iter_batches(batch_format="numpy", batch_size=None):
        vectors[batch["row"]] = batch["vector"]
    return vectors


def encoder_info(backend: Backend, model: str | None) -> EncoderInfo:
    from indexes.onnx_encoder import make_encoder

    probe = make_encoder(backend, model)  # the id names model, backend and dimension
    return EncoderInfo(encoder_id=probe.encoder_id, model=probe.model, dim=probe.dim,
                       vector_dtype="float32")


def build_on_ray(source: str | Path, root: str | Path, *, backend: Backend = "torch",
                 model: str | None = None, workers: int = 2, cpus_per_worker: float = 1.0,
                 config: BuildConfig | None = None, publish: bool = True,
                 shards: int | None = None, mapping: FieldMapping | None = None,
                 **shard_options: Any) -> BuildReport:
    """Build ``source`` into ``root`` on the connected Ray cluster (see the module docstring);
    ``shards`` as ``indexes.build.build_index``, ``mapping`` as ``read_documents``."""
    config = cut_with(config or BuildConfig(), model)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CorpusError(f"workers must be a whole number of at least 1, not {workers!r}")
    if shard_options.pop("live_writes", "superseded") != "superseded":
        raise CorpusError("a Ray build supersedes the live writes (its vectors come from the "
                          "Ray encoders): fold the log first (`retrieval compact`), or build "
                          "without Ray to replay them")
    check_new_root(Path(root))
    documents = read_documents(source, mapping)
    # What build_index refuses, refused before the encoding (hours at scale), not after it.
    check_documents(documents)
    if shards is not None:
        shard_ranges(len(documents), shards)
    # The corpus just read supersedes the writes logged until now; those acknowledged while
    # it is encoded are applied on top of the build.
    sealed = rebuild.start(Path(root), "superseded")
    try:
        return _encode_and_build(documents, root, sealed, backend, model, workers,
                                 cpus_per_worker, config, publish, shards, shard_options)
    finally:
        unpin(sealed.pin)


def _encode_and_build(documents: list[Document], root: str | Path, sealed: rebuild.Sealed,
                      backend: Backend, model: str | None, workers: int,
                      cpus_per_worker: float, config: BuildConfig, publish: bool,
                      shards: int | None, shard_options: dict[str, Any]) -> BuildReport:
    texts = [d.content for d in index_rows(documents, config)]
    info = encoder_info(backend, model)
    reused, todo = _reuse(texts, Path(config.reuse_from or root), info, config)
    encoded = encode_on_ray(texts, todo, backend, model, workers, config.batch_size, info.dim,
                            cpus_per_worker)
    vectors = np.where(np.isin(np.arange(len(texts)), todo)[:, None], encoded, reused)
    parts = config.analysis_workers or workers
    report = build_index(documents, root, vectors=vectors, encoder_info=info, config=config,
                         progress=False, publish=publish, shards=shards,
                         analysis=lambda rows: analyze_on_ray(rows, config.analyzer, parts),
                         sealed=sealed, **shard_options)
    report.vectors_given = 0
    report.vectors_encoded = len(todo)
    report.vectors_reused = len(texts) - len(todo)
    return report


def ray_runner(cpus_per_task: float = 1.0) -> Runner:
    """``indexes.shard_build``'s tasks as Ray tasks (``cpus_per_task`` each), each in a fresh
    worker process (``max_calls=1``: its peak memory is its own shard's)."""
    def run(task: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        import ray

        remote = ray.remote(num_cpus=cpus_per_task, max_calls=1)(task)
        return ray.get([remote.remote(job) for job in jobs])
    return run


def analyze_on_ray(texts: Sequence[str], config: AnalyzerConfig, parts: int
                   ) -> CollectionPostings:
    """``indexes.analysis.analyze`` with its parts as Ray tasks (one CPU each)."""
    import ray

    task = ray.remote(num_cpus=1)(analyze_part)
    refs = [task.remote(texts[start:stop], config)
            for start, stop in part_ranges(len(texts), parts)]
    return merge_parts(ray.get(refs))


def cut_with(config: BuildConfig, model: str | None) -> BuildConfig:
    """A passage build's config naming the tokenizer passages are cut with: the encoder
    model's unless one is named (the driver and ``build_index`` then cut the same rows)."""
    if config.passages is None or config.passages.tokenizer is not None or model is None:
        return config
    passages = config.passages.model_copy(update={"tokenizer": model})
    return config.model_copy(update={"passages": passages})


def index_rows(documents: list[Document], config: BuildConfig) -> list[Document]:
    """The rows the build will index: the documents, or in a passage build their passages,
    cut as ``build_index`` cuts them."""
    if config.passages is None:
        return documents
    return split_documents(documents, passage_counter(config.passages), config.passages)[0]


def _reuse(texts: Sequence[str], source: Path, info: EncoderInfo, config: BuildConfig
           ) -> tuple[np.ndarray, list[int]]:
    """(vectors found in the live build by content hash, rows still to encode)."""
    vectors = np.zeros((len(texts), info.dim), dtype=np.float32)
    previous = _previous_vectors(source, info.encoder_id) if config.reuse_vectors else None
    if previous is None:
        return vectors, list(range(len(texts)))
    row_of, store = previous
    todo = []
    for i, digest in enumerate(content_hashes(texts)):
        row = row_of.get(bytes(digest))
        if row is None:
            todo.append(i)
        else:
            vectors[i] = store.reconstruct_rows(np.array([row]))[0]
    return vectors, todo
