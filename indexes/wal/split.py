"""Live writes on a passage build act on whole documents: the writer splits an upserted
document with the build's passage settings (``indexes.long_documents.split_documents``, the
encoder's tokenizer) and logs the whole document with its passage offsets and one vector per
passage; serving and compaction turn it back into passage rows with ``passage_rows``.

A passage build's docstore holds passages; ``whole_documents`` reassembles each document from
its consecutive rows (consecutive passages tile the text), so compaction can split the live
corpus again exactly as a fresh passage build does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.docstore import DocStore, Document
from indexes.encoders import default_model_path
from indexes.errors import InvalidWriteError, MissingArtifactError
from indexes.long_documents import split_documents
from indexes.manifest import Manifest
from indexes.passages import PassageConfig, PassageMap, TokenCounter
from indexes.sharding.layout import build_parts
from indexes.storage import load_array
from indexes.vectors import VectorStore, content_hashes
from indexes.wal.log import Record
from indexes.wal.state import Changes

Spans = tuple[tuple[int, int], ...]


def passage_config(manifest: Manifest) -> PassageConfig | None:
    """The passage settings a build was split with (None: rows are whole documents)."""
    info = manifest.passages
    if info is None:
        return None
    return PassageConfig(max_tokens=info.max_tokens, overlap_tokens=info.overlap_tokens,
                         tokenizer=info.tokenizer)


def tokenizer_dir(encoder: Any | None, config: PassageConfig | None = None) -> Path:
    """The model directory whose tokenizer cuts passages: the one the build recorded
    (``config.tokenizer``, a build given vectors and a tokenizer), else the encoder's own (as
    a build with that encoder cuts them), else the packaged model's (the build's default)."""
    if config is not None and config.tokenizer is not None:
        recorded = Path(config.tokenizer)
        if not (recorded / "tokenizer.json").is_file():
            raise MissingArtifactError(
                f"the live build's passages were cut with the tokenizer in {recorded}, which "
                "holds no tokenizer.json any more: put it back, or rebuild with another "
                "PassageConfig.tokenizer", recorded / "tokenizer.json")
        return recorded
    model_path = getattr(encoder, "model_path", None)
    if model_path is not None and (Path(model_path) / "tokenizer.json").is_file():
        return Path(model_path)
    return default_model_path()


def token_counter(encoder: Any | None) -> TokenCounter:
    return TokenCounter.for_model(tokenizer_dir(encoder))


def split(docs: Sequence[Document], counter: TokenCounter, config: PassageConfig
          ) -> tuple[list[Document], list[Spans]]:
    """Passage rows of ``docs`` (in order) and each document's passage offsets."""
    rows, passages, _, _ = split_documents(docs, counter, config)
    spans: list[list[tuple[int, int]]] = [[] for _ in docs]
    for parent, start, end in zip(passages.parent, passages.start, passages.end, strict=True):
        spans[int(parent)].append((int(start), int(end)))
    return rows, [tuple(s) for s in spans]


def passage_rows(doc: Document, spans: Spans) -> list[Document]:
    """The rows a passage build holds for ``doc`` (as ``split_documents`` makes them)."""
    return [Document(id=doc.id, text=doc.text[start:end], title=doc.title,
                     metadata=doc.metadata) for start, end in spans]


def whole_documents(store: DocStore, passages: PassageMap, rows: Sequence[int]
                    ) -> list[Document]:
    """The documents whose passages are ``rows`` (ascending, whole documents only)."""
    groups: list[list[int]] = []
    for row in rows:
        if groups and passages.parent[groups[-1][-1]] == passages.parent[row]:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [_reassemble(store, passages, group) for group in groups]


def _reassemble(store: DocStore, passages: PassageMap, rows: list[int]) -> Document:
    """One document's text from its passages (each starts at or before the previous end)."""
    first = store.get(rows[0])
    text, covered = first.text, int(passages.end[rows[0]])
    for row in rows[1:]:
        text += store.get(row).text[covered - int(passages.start[row]):]
        covered = int(passages.end[row])
    return Document(id=first.id, text=text, title=first.title, metadata=first.metadata)


def record_rows(record: Record) -> tuple[list[Document], np.ndarray]:
    """An upsert record's index rows (passages in a passage build) and their vectors."""
    if not record.passages:
        return list(record.documents), record.vectors
    rows = [row for doc, spans in zip(record.documents, record.passages, strict=True)
            for row in passage_rows(doc, spans)]
    return rows, record.vectors


def passage_corpus(build: Path, changes: Changes, counter: TokenCounter,
                   config: PassageConfig) -> tuple[list[Document], np.ndarray]:
    """The live documents of a passage build (survivors in row order, then the upserted
    ones) and the vectors of their passages as a fresh passage build splits them, taken by
    passage content hash from the build and the log (nothing is encoded again)."""
    replaced = changes.replaced()
    docs: list[Document] = []
    known: dict[bytes, np.ndarray] = {}
    for part in build_parts(build):  # each shard of a sharded build holds whole documents
        store = DocStore.load(part / "docstore")
        rows = [r for r in range(len(store)) if store.doc_id(r) not in replaced]
        known.update(_stored_vectors(part, rows))
        docs += whole_documents(store, PassageMap.load(part / "passages"), rows)
    for doc_id, (doc, vectors) in changes.upserts.items():
        for row, vector in zip(passage_rows(doc, changes.spans[doc_id]), vectors, strict=True):
            known[bytes(content_hashes([row.content])[0])] = vector
    docs += [d for d, _ in changes.upserts.values()]
    split_rows, _ = split(docs, counter, config)
    keys = [bytes(h) for h in content_hashes([r.content for r in split_rows])]
    missing = [r.id for r, key in zip(split_rows, keys, strict=True) if key not in known]
    if missing:  # a tokenizer other than the writer's would cut passages differently
        raise InvalidWriteError(
            f"{len(missing)} passages of the live corpus (first of {missing[0]!r}) have no "
            "logged or built vector: the passages were cut with another tokenizer; compact "
            "with the IndexWriter(encoder=...) the index was built with")
    if not keys:  # every document deleted: the build refuses an empty corpus
        return docs, np.zeros((0, 0), np.float32)
    return docs, np.stack([known[k] for k in keys]).astype(np.float32)


def _stored_vectors(build: Path, rows: list[int]) -> dict[bytes, np.ndarray]:
    """Content hash -> stored vector of the build's ``rows``."""
    hashes = load_array(build / "vectors" / "content_hashes.npy")[rows]
    vectors = VectorStore.load(build / "vectors").reconstruct_rows(np.asarray(rows, np.int64))
    return {bytes(h): v for h, v in zip(hashes, vectors, strict=True)}
