"""Document sources: BEIR folders and generic JSONL files.

Generic JSONL: one object per line with an id (``id`` or ``_id``), ``text``, optional ``title``,
optional ``metadata`` object; any other top-level keys are treated as metadata too. A missing
file is reported when the reader is created; malformed lines, duplicate ids and a metadata field
holding two types are reported as they are read, naming the file, the line and the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.metadata import FieldKind, merge_kinds, value_kind

_RESERVED = {"_id", "id", "title", "text", "metadata"}


def read_jsonl(path: Path) -> Iterator[Document]:
    """Documents from a JSONL file; malformed lines are a CorpusError naming the line.

    The file's existence is checked now, before anything is read (and before a caller loads a
    model): the documents themselves are read lazily.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist; give a JSONL file or a BEIR "
                          "folder holding corpus.jsonl")
    return _read_lines(path)


def _read_lines(path: Path) -> Iterator[Document]:
    check = _Consistency(path)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                document = _document(_parse(line, path, number), path, number)
                check(document, number)
                yield document


class _Consistency:
    """Unique ids and one type per metadata field, checked line by line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.id_lines: dict[str, int] = {}
        # field -> kind -> (line, document id) where the kind was first seen
        self.kinds: dict[str, dict[FieldKind, tuple[int, str]]] = {}

    def __call__(self, document: Document, line: int) -> None:
        first = self.id_lines.setdefault(document.id, line)
        if first != line:
            raise CorpusError(f"{self.path}:{line}: duplicate document id {document.id!r} "
                              f"(first at line {first}); ids must be unique")
        for field, value in document.metadata.items():
            kind = value_kind(value)
            if kind is None:
                continue
            seen = self.kinds.setdefault(field, {})
            if kind not in seen:
                seen[kind] = (line, document.id)
                if merge_kinds(set(seen)) is None:
                    raise CorpusError(self._mixed(field, kind, seen))

    def _mixed(self, field: str, kind: FieldKind, seen: dict[FieldKind, tuple[int, str]]) -> str:
        line, doc_id = seen[kind]
        other = next(k for k in seen if k != kind and {k, kind} != {"date", "keyword"})
        other_line, other_id = seen[other]
        return (f"{self.path}:{line}: document {doc_id!r}: metadata field {field!r} is a "
                f"{kind} here but a {other} at line {other_line} (document {other_id!r}); "
                "give every document the same type for this field (or leave it out)")


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
