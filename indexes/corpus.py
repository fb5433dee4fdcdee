"""Document sources: BEIR folders and generic JSONL files.

Generic JSONL: one object per line with an id (``id`` or ``_id``), ``text``, optional ``title``,
optional ``metadata`` object; any other top-level keys are treated as metadata too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from indexes.docstore import Document
from indexes.errors import CorpusError

_RESERVED = {"_id", "id", "title", "text", "metadata"}


def read_jsonl(path: Path) -> Iterator[Document]:
    """Documents from a JSONL file; malformed lines are a CorpusError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield _document(_parse(line, path, number), path, number)


def _parse(line: str, path: Path, number: int) -> object:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise CorpusError(f"{path}:{number}: not valid JSON ({exc})") from exc


def _document(record: object, path: Path, line: int) -> Document:
    if not isinstance(record, dict):
        raise CorpusError(f"{path}:{line}: each line must be a JSON object")
    doc_id = record.get("_id", record.get("id"))
    text = record.get("text")
    if doc_id is None or not isinstance(text, str):
        raise CorpusError(
            f"{path}:{line}: a document needs an id (`_id` or `id`) and a `text` string"
        )
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise CorpusError(f"{path}:{line}: `metadata` must be an object")
    extra = {k: v for k, v in record.items() if k not in _RESERVED}
    title = record.get("title") or ""
    return Document(id=str(doc_id), text=text, title=str(title), metadata={**metadata, **extra})


def read_corpus(path: Path) -> Iterator[Document]:
    """A BEIR folder (``corpus.jsonl`` inside) or a JSONL file."""
    path = Path(path)
    if path.is_dir():
        return read_jsonl(path / "corpus.jsonl")
    return read_jsonl(path)


def read_queries(path: Path) -> dict[str, str]:
    """BEIR queries.jsonl -> {query id: text}."""
    queries: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                queries[str(record["_id"])] = record["text"]
    return queries


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (header line) -> {query id: {doc id: relevance}}."""
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as handle:
        next(handle, None)
        for line in handle:
            parts = line.split("\t")
            if len(parts) >= 3:
                qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return qrels
