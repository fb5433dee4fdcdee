"""One searchable snapshot of base build + applied log records: a ``LoadedBuild`` whose parts
present both as one collection (``parts``), so the one request pipeline runs over it unchanged.

Its ``build_id`` is ``<base build id>+<last applied seq>``: every cache key and every
per-build memo (filter masks, feature ids) therefore changes with each applied batch, and a
cached result never hides a write. In a restored root it is ``<base build id>+<log id>+<last
applied seq>`` (``indexes.restore.log_id``): the restored root and its source hold the same
build and number their own writes alike, and two roots sharing one cache must never serve
each other's results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexes.bm25 import BM25Params
from indexes.doc_ids import LiveIds
from indexes.docstore import Document
from indexes.restore import log_id
from indexes.sharding.layout import build_parts
from indexes.storage import load_array
from indexes.typos import LiveTypos, TypoIndex
from indexes.vectors import content_hashes
from indexes.wal import Changes
from indexes.wal.checks import check_records_fit
from retrieval.live.bm25_live import BaseTerms, live_bm25
from retrieval.live.parts import LiveDense, LiveDocs, LiveVectors, live_metadata
from retrieval.live.passages import delta_rows, live_passages, retire_documents
from retrieval.loaded_build import LiveBuild, LoadedBuild


@dataclass
class TokenMemo:
    """Analyzed delta texts, so a batch re-analyzes only documents it changed."""

    analyzed: dict[tuple[str, str], tuple[list[str], list[str]]] = field(default_factory=dict)

    def of(self, base: LoadedBuild, docs: list[Document]) -> list[list[str]]:
        """The delta rows' terms (their words before stemming are in ``words``)."""
        fresh: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        out = []
        for doc in docs:  # passages of one document share its id: one entry per row
            key = (doc.id, doc.content)
            pair = fresh.get(key) or self.analyzed.get(key)
            if pair is None:
                words = base.analyzer.words(doc.content)
                pair = (words, base.analyzer.stem(words))
            fresh[key] = pair
            out.append(pair[1])
        self.analyzed = fresh
        return out

    def words(self) -> set[str]:
        """The words of the delta rows last analyzed."""
        return {w for words, _ in self.analyzed.values() for w in words}


def alive_rows(base: LoadedBuild, changes: Changes) -> np.ndarray:
    """bool (n_base,): base rows neither deleted nor superseded by an upsert (in a passage
    build: no passage of such a document)."""
    return retire_documents(base, changes.replaced())


@dataclass(frozen=True)
class Folded:
    """The live documents' term frequencies, with their content hashes: if the next base
    build holds exactly these texts in this order (compaction's output), its ``BaseTerms``."""

    terms: BaseTerms
    hashes: np.ndarray  # S16 (n_live,)


def compose(base: LoadedBuild, terms: BaseTerms, changes: Changes, kinds: dict[str, str],
            base_hashes: np.ndarray, memo: TokenMemo) -> tuple[LoadedBuild, Folded | None]:
    """The snapshot serving ``base`` with ``changes`` applied (``base`` itself when the
    changes touch nothing), and what a compaction of it would need to re-analyze nothing.
    ``kinds``: the fields' kinds as the writer decided them (``merged_kinds``);
    ``base_hashes``: the base's content hashes, held since it was loaded."""
    check_records_fit(base.manifest, changes)
    alive = alive_rows(base, changes)
    if not changes.upserts and alive.all():
        return base, None
    docs, delta = delta_rows(base, changes)
    vectors = LiveVectors(base.vectors, delta)
    n_live = int(alive.sum()) + len(docs)
    passages = live_passages(base, alive, changes)
    manifest = base.manifest.model_copy(update={
        "build_id": view_id(base, changes.last_seq), "n_docs": n_live,
        **({"passages": passages[1]} if passages is not None else {})})
    bm25, folded = live_bm25(terms, alive, memo.of(base, docs), BM25Params(**base.manifest.bm25))
    typos = base.bm25.typos
    if isinstance(typos, TypoIndex):  # the base's words and the live documents'
        bm25.typos = LiveTypos(typos, memo.words(), base.analyzer.stem)
    hashes = np.concatenate([base_hashes[alive],
                             content_hashes([d.content for d in docs])])
    metadata = live_metadata(base.metadata, alive, [d.metadata for d in docs], kinds)
    assert base.metadata.ids is not None  # set by every LoadedBuild
    metadata.ids = LiveIds(base.metadata.ids, alive, [d.id for d in docs])
    snapshot = LiveBuild(
        path=base.path, manifest=manifest, analyzer=base.analyzer, bm25=bm25,
        metadata=metadata,
        vectors=vectors, docs=LiveDocs(base.docs, docs),
        dense=LiveDense(base.dense, vectors, None if alive.all() else alive),
        passages=passages[0] if passages is not None else None, base=base,
    )
    return snapshot, Folded(folded, hashes)


def view_id(base: LoadedBuild, last_seq: int) -> str:
    """The id of ``base`` with the log applied up to ``last_seq``, the restored root's log id
    between them where it has one. Read at each compose (one small file), never cached by
    path: a root removed and restored at the same path has a new one."""
    logged = log_id(root_of(base))
    return f"{base.build_id}+{logged}+{last_seq}" if logged else f"{base.build_id}+{last_seq}"


def root_of(base: LoadedBuild) -> Path:
    """The index root whose log is applied on ``base`` (``<root>/builds/<build id>``)."""
    return base.path.parent.parent


def content_hashes_of(build: LoadedBuild) -> np.ndarray:
    """S16 (n_docs,): the build's content hashes (written by every build and shard)."""
    return np.concatenate([load_array(part / "vectors" / "content_hashes.npy")
                           for part in build_parts(build.path)])
