"""A sharded build seen as one build: the parts the request path reads, over global rows.

``open_build`` loads any build directory or index root: a whole build as ``LoadedBuild``, a
sharded one as ``ShardedBuild``, which is a ``LoadedBuild`` whose parts fan out to the shards
in this process. The request path (``retrieval.request_path.pipeline``) therefore runs
unchanged on S = 1 (a direct call, nothing added) and on S shards: the fan-out is inside the
parts it calls.

- BM25 top-C: each shard's top-C inside its slice of the filter mask, merged by score, ties to
  the lower global row, exactly as one index breaks them (global N, df and avgdl travel with
  the shards: ``indexes.sharding.slices``).
- Re-rank, dense-leg BM25 scores, hydration: each global row asked of the shard that owns it,
  so only the merged candidates are scored (S shards' top-C would cost S times the gathers).
- Dense leg: each shard's top rows inside its mask slice, merged by score.
- Metadata: one global ``MetadataIndex`` joined from the shards' postings at load (every shard
  holds every field and value), so filters, named filters, value counts and suggestions are
  the unsharded code over the whole collection; a mask is sliced per shard (views, no copy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.ann import ExactDense
from indexes.bm25 import BM25Index
from indexes.bm25_strategy import Kernel
from indexes.docstore import DocStore, Document
from indexes.fan_out import THREADS_FROM_POSTINGS, each_part
from indexes.manifest import Manifest, read_manifest, resolve_build_dir
from indexes.mask_memo import MaskMemo
from indexes.metadata import MetadataIndex
from indexes.passages import PassageMap
from indexes.sharding import read_layout
from indexes.sharding.layout import SHARDS_FILE, joined_passages
from indexes.topk import best_first
from indexes.vectors import VectorStore
from indexes.warmup import warm_bm25, warm_vectors
from retrieval.loaded_build import LoadedBuild


def open_build(path: str | Path, *, verify: bool = True, mmap: bool = True) -> LoadedBuild:
    """The build under ``path`` (a build directory or an index root), whole or sharded."""
    directory = resolve_build_dir(Path(path))
    if (directory / SHARDS_FILE).is_file():
        return ShardedBuild.load(directory, verify=verify, mmap=mmap)
    return LoadedBuild.load(directory, verify=verify, mmap=mmap)


def warm_up_build(snapshot: LoadedBuild) -> None:
    """Load the BM25 and re-rank kernels of every shard in this process
    (``indexes.warmup``) before the first request (remote shards warm themselves)."""
    for part in snapshot.local_builds():
        warm_bm25(part.bm25)
        warm_vectors(part.vectors)


class RowOwners:
    """Which shard owns each global row: shard k holds rows [starts[k], starts[k + 1])."""

    def __init__(self, starts: Sequence[int], n_docs: int) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.bounds = [*(int(s) for s in starts), n_docs]

    def split(self, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(shard, positions into ``rows``, the shard's own rows) for each shard owning some."""
        rows = np.asarray(rows, dtype=np.int64)
        owners = np.searchsorted(self.starts, rows, side="right") - 1
        by_owner = np.argsort(owners, kind="stable")  # each shard's rows, one slice each
        cuts = np.searchsorted(owners[by_owner], np.arange(self.starts.size + 1)).tolist()
        return [(k, by_owner[lo:hi], rows[by_owner[lo:hi]] - self.starts[k])
                for k, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)) if hi > lo]

    def owner(self, row: int) -> tuple[int, int]:
        """(shard, the shard's own row) of global ``row``."""
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return k, int(row) - self.bounds[k]

    def per_owner(self, rows: np.ndarray, dtype: Any,
                  score: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """``score(shard, its rows)`` of global ``rows``, in the order of ``rows``."""
        out: np.ndarray = np.empty(np.asarray(rows).size, dtype=dtype)
        for k, at, local in self.split(rows):
            out[at] = score(k, local)
        return out


class MaskSlices:
    """Each shard's view of a global filter mask. A read-only mask (the mask cache's) keeps the
    same views, so each shard's BM25 memos (keyed by mask identity: restricted postings,
    allowed rows) find them again; at most ``size`` masks, each kept alive by its views."""

    def __init__(self, bounds: Sequence[int], size: int = 16) -> None:
        self._ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._memo: MaskMemo[list[np.ndarray]] = MaskMemo(size)

    def __call__(self, mask: np.ndarray | None) -> Sequence[np.ndarray | None]:
        if mask is None:
            return [None] * len(self._ranges)
        views = self._memo.get(mask)
        if views is None:
            views = [mask[a:b] for a, b in self._ranges]
            self._memo.put(mask, views)
        return views


def merged_top(answers: Sequence[tuple[np.ndarray, np.ndarray]], starts: np.ndarray, n: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """The best ``n`` of the shards' (own rows, scores) answers, as (global rows int64,
    scores), best first, ties to the lower global row."""
    rows = np.concatenate([np.asarray(r, dtype=np.int64) + s
                           for (r, _), s in zip(answers, starts.tolist(), strict=True)])
    scores = np.concatenate([s for _, s in answers])
    keep = best_first(rows, scores, n)
    return rows[keep], scores[keep]


class ShardedBM25(BM25Index):
    """BM25 over the shards; every shard holds the global vocabulary and statistics."""

    def __init__(self, parts: Sequence[BM25Index], owners: RowOwners, slices: MaskSlices,
                 n_docs: int) -> None:  # noqa: D107 - the parts hold the postings
        first = parts[0]
        self.parts = list(parts)
        self.owners = owners
        self.slices = slices
        self.vocab_list, self.vocab = first.vocab_list, first.vocab
        self.typos = first.typos
        self.n_docs = self.stats_docs = n_docs
        self.params = first.params
        self.idf_floor = None

    def doc_freq(self, term: str) -> int:
        return sum(part.doc_freq(term) for part in self.parts)

    def vocabulary_doc_freqs(self) -> np.ndarray:
        return sum((part.vocabulary_doc_freqs() for part in self.parts[1:]),
                   self.parts[0].vocabulary_doc_freqs())

    def top_candidates(self, tokens: Sequence[str], n: int, mask: np.ndarray | None = None,
                       kernel: Kernel | str | None = None) -> tuple[np.ndarray, np.ndarray]:
        calls = [functools.partial(p.top_candidates, tokens, n, v, kernel)
                 for p, v in zip(self.parts, self.slices(mask), strict=True)]
        return merged_top(each_part(calls, self.postings(tokens) >= THREADS_FROM_POSTINGS),
                          self.owners.starts, max(int(n), 0))

    def postings(self, tokens: Sequence[str]) -> int:
        """How many postings the query terms have over all shards (the fan-out's work)."""
        ids, _ = self.parts[0].query_terms(tokens)
        return sum(int((p.indptr[ids + 1] - p.indptr[ids]).sum()) for p in self.parts)

    def score_touched(self, tokens: Sequence[str], mask: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        answers = [p.score_touched(tokens, v)
                   for p, v in zip(self.parts, self.slices(mask), strict=True)]
        return (np.concatenate([r.astype(np.int64) + s for (r, _), s in
                                zip(answers, self.owners.starts.tolist(), strict=True)]),
                np.concatenate([s for _, s in answers]))

    def score_rows(self, tokens: Sequence[str], rows: np.ndarray) -> np.ndarray:
        return self.owners.per_owner(rows, np.float64,
                                     lambda k, local: self.parts[k].score_rows(tokens, local))


class ShardedVectors(VectorStore):
    """The shards' stored vectors over global rows."""

    def __init__(self, parts: Sequence[VectorStore], owners: RowOwners) -> None:
        first = parts[0]
        self.parts = list(parts)
        self.owners = owners
        self.dtype, self.scale, self.low = first.dtype, first.scale, first.low
        self._dense_index = None

    @property
    def n_docs(self) -> int:
        return sum(p.n_docs for p in self.parts)

    @property
    def dim(self) -> int:
        return self.parts[0].dim

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def scores(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        query = self.check_query(query)
        return self.owners.per_owner(rows, np.float32,
                                     lambda k, local: self.parts[k].scores(query, local))

    def reconstruct_all(self) -> np.ndarray:
        return np.concatenate([p.reconstruct_all() for p in self.parts])

    def reconstruct_rows(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((np.asarray(rows).size, self.dim), dtype=np.float32)
        for k, at, local in self.owners.split(rows):
            out[at] = self.parts[k].reconstruct_rows(local)
        return out


class ShardedDense(ExactDense):
    """Each shard's dense leg inside its mask slice, merged by score (ties to the lower row)."""

    def __init__(self, parts: Sequence[ExactDense], vectors: ShardedVectors,
                 slices: MaskSlices) -> None:
        super().__init__(vectors)
        self.parts = list(parts)
        self.kind = parts[0].kind
        self.slices = slices

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "shards": [p.describe() for p in self.parts]}

    def search(self, query: np.ndarray, k: int, mask: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        owners = self.vectors.owners  # type: ignore[attr-defined]
        rows, scores = merged_top([p.search(query, k, v) for p, v in
                                   zip(self.parts, self.slices(mask), strict=True)],
                                  owners.starts, k)
        return rows, scores.astype(np.float32, copy=False)


class ShardedDocs(DocStore):
    """The shards' doc stores over global rows."""

    def __init__(self, parts: Sequence[DocStore], owners: RowOwners) -> None:
        self.parts = list(parts)
        self.owners = owners
        self._n = sum(len(p) for p in self.parts)

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        """A hit list: one lookup of the owners, then each shard's documents."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._n):
            raise IndexError(f"doc store rows out of range (0..{self._n - 1})")
        out: list[Document | None] = [None] * rows.size
        for k, at, local in self.owners.split(rows):
            for position, doc in zip(at.tolist(), self.parts[k].get_many(local), strict=True):
                out[position] = doc
        return out  # type: ignore[return-value]

    def __len__(self) -> int:
        return self._n

    def _check(self, row: int) -> int:
        row = int(row)
        if not 0 <= row < self._n:
            raise IndexError(f"doc store row {row} out of range (0..{self._n - 1})")
        return row

    def doc_id(self, row: int) -> str:
        k, local = self.owners.owner(self._check(row))
        return self.parts[k].doc_id(local)

    def get(self, row: int) -> Document:
        k, local = self.owners.owner(self._check(row))
        return self.parts[k].get(local)

    def row_of(self, doc_id: str) -> int | None:
        for part, start in zip(self.parts, self.owners.bounds, strict=False):
            row = part.row_of(doc_id)
            if row is not None:
                return start + row
        return None

    def all_ids(self) -> list[str]:
        return [doc_id for part in self.parts for doc_id in part.all_ids()]


def joined_metadata(parts: Sequence[MetadataIndex], starts: Sequence[int], n_docs: int
                    ) -> MetadataIndex:
    """One ``MetadataIndex`` over global rows from the shards' (row-sliced) indexes."""
    kinds = dict(parts[0].kinds)
    keywords, columns = {}, {}
    for field, kind in kinds.items():
        if kind != "keyword":
            columns[field] = np.concatenate([np.asarray(p.numeric_column(field)) for p in parts])
            continue
        keywords[field] = _joined_postings([p.keyword_postings(field) for p in parts], starts)
    return MetadataIndex(n_docs, kinds, keywords, columns)


def _joined_postings(postings: Sequence[tuple[list[str], np.ndarray, np.ndarray]],
                     starts: Sequence[int]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(sorted values, offsets, rows) of one keyword field over every shard: a value's rows
    are its rows in each shard in shard order, so ascending, as one index stores them."""
    values = sorted({v for vals, _, _ in postings for v in vals})
    index = {v: i for i, v in enumerate(values)}
    ids, rows = [], []
    for (vals, offsets, part_rows), start in zip(postings, starts, strict=True):
        local = np.fromiter((index[v] for v in vals), dtype=np.int64, count=len(vals))
        ids.append(np.repeat(local, np.diff(np.asarray(offsets))))
        rows.append(np.asarray(part_rows, dtype=np.int64) + start)
    all_ids, all_rows = np.concatenate(ids), np.concatenate(rows)
    order = np.argsort(all_ids, kind="stable")
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.bincount(all_ids, minlength=len(values)), out=offsets[1:])
    return values, offsets, all_rows[order].astype(np.int32)


@dataclass(frozen=True)
class ShardedBuild(LoadedBuild):
    """A sharded build as one ``LoadedBuild`` (its parts over global rows; see the module
    docstring); ``shards``: the shard builds, in row order."""

    shards: tuple[LoadedBuild, ...] = ()

    def local_builds(self) -> Sequence[LoadedBuild]:
        return self.shards

    @classmethod
    def load(cls, path: str | Path, *, verify: bool = True, mmap: bool = True) -> ShardedBuild:
        """Load a sharded build directory (or an index root whose live build is one), every
        shard verified against its own checksums and the layout's."""
        directory, layout = read_layout(Path(path), verify=verify)
        shards = tuple(LoadedBuild.load(layout.shard_dir(directory, i), verify=verify,
                                        mmap=mmap) for i in range(len(layout.shards)))
        starts = [entry.start for entry in layout.shards]
        return cls.of(directory, read_manifest(directory), shards, starts,
                      joined_passages(directory, layout))

    @classmethod
    def of(cls, directory: Path, manifest: Manifest, shards: Sequence[LoadedBuild],
           starts: Sequence[int], passages: PassageMap | None = None) -> ShardedBuild:
        """The shard builds ``shards`` (of rows from ``starts``) under one ``manifest``;
        ``passages``: a passage build's map over global rows."""
        owners = RowOwners(starts, manifest.n_docs)
        slices = MaskSlices(owners.bounds)
        vectors = ShardedVectors([s.vectors for s in shards], owners)
        return cls(
            path=directory, manifest=manifest, analyzer=shards[0].analyzer,
            bm25=ShardedBM25([s.bm25 for s in shards], owners, slices, manifest.n_docs),
            metadata=joined_metadata([s.metadata for s in shards], starts, manifest.n_docs),
            vectors=vectors, docs=ShardedDocs([s.docs for s in shards], owners),
            dense=ShardedDense([s.dense for s in shards], vectors, slices),
            passages=passages, shards=tuple(shards))
