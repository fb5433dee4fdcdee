"""Document sources: BEIR folders, JSONL files, and (``indexes.sources``) CSV and Parquet
tables and folders of Markdown, text and HTML files.

Generic JSONL: one object per line with an id (``id`` or ``_id``), ``text``, optional ``title``,
optional ``metadata`` object; any other top-level keys are treated as metadata too; a
``FieldMapping`` names other fields. A missing file is reported when the reader is created;
malformed lines, a key repeated in one object, duplicate ids and a metadata field holding two
types are reported as they are read, naming the file, the line and the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.metadata import FieldKind, merge_kinds, value_kind
from indexes.sources import TABLE_SUFFIXES, FieldMapping, read_folder, read_table


def read_jsonl(path: Path, mapping: FieldMapping | None = None) -> Iterator[Document]:
    """Documents from a JSONL file; malformed lines are a CorpusError naming the line.

    The file's existence is checked now, before anything is read (and before a caller loads a
    model): the documents themselves are read lazily.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist; give a JSONL file or a BEIR "
                          "folder holding corpus.jsonl")
    return _read_lines(path, mapping or FieldMapping())


def _read_lines(path: Path, mapping: FieldMapping) -> Iterator[Document]:
    with open(path, "rb") as handle:
        yield from checked(_documents(_records(handle, path), path, mapping), path)


def check_lines(path: Path, start: int = 0, end: int | None = None,
                numbered: bool = True) -> None:
    """Every line of a JSONL file decoded and parsed as ``read_jsonl`` does (UTF-8, valid
    JSON, no key repeated in an object), a ``CorpusError`` naming the file and the line: for
    readers that parse the file their own way and would keep a repeated key's last value.

    ``start``, ``end``: only the lines whose first byte lies in [start, end), so that parts
    cut at any byte offsets check every line once. ``numbered=False`` numbers a part's lines
    from 1 (a refusal then only says that the part holds a bad line); otherwise the lines
    before the part are counted first, so an error names the line in the whole file."""
    with open(path, "rb") as handle:
        lines = _lines_starting_in(handle, start, end)
        first = next(lines, None)
        if first is None:
            return
        at = handle.tell() - len(first)  # where the part's first line starts
        before = _lines_before(path, at) if numbered else 0
        records = _records(chain((first,), lines), path, before + 1, at == 0)
        for _ in records:
            pass


def _lines_starting_in(handle: Any, start: int, end: int | None) -> Iterator[bytes]:
    """The lines of a binary file whose first byte lies in [start, end) (end None: to the
    end of the file)."""
    handle.seek(max(start - 1, 0))
    position = handle.tell()
    if start > 0:  # the rest of the line holding byte start - 1 belongs to the part before
        position += len(handle.readline())
    while end is None or position < end:
        line = handle.readline()
        if not line:
            return
        yield line
        position += len(line)


def _lines_before(path: Path, offset: int, block: int = 1 << 24) -> int:
    """How many lines end before byte ``offset`` (where a line starts) of the file."""
    count = 0
    with open(path, "rb") as handle:
        while offset > 0:
            chunk = handle.read(min(block, offset))
            if not chunk:
                break
            count += chunk.count(b"\n")
            offset -= len(chunk)
    return count


def _records(handle: Iterable[bytes], path: Path, first_number: int = 1,
             file_start: bool = True) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of each non-blank line; decoded line by line, so an error
    names its line. ``file_start``: the first line is the file's first."""
    return ((number, _parse(line, path, number))
            for number, line in _decoded(handle, path, first_number, file_start) if line.strip())


def _decoded(lines: Iterable[bytes], path: Path, first_number: int, file_start: bool
             ) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(lines, start=first_number):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{path}:{number}: not UTF-8 (byte {exc.start + 1} of the line "
                              f"is {raw[exc.start]:#04x}); save the file as UTF-8") from exc
        # A byte-order mark (Windows tools write one) starts the file, not the first record.
        yield number, line.removeprefix("\ufeff") if file_start and number == first_number \
            else line


def _documents(records: Iterator[tuple[int, object]], path: Path, mapping: FieldMapping
               ) -> Iterator[tuple[int, Document]]:
    first = True
    for number, record in records:
        if not isinstance(record, dict):
            raise CorpusError(f"{path}:{number}: each line must be a JSON object")
        nested = record.get("metadata") or {}
        if not isinstance(nested, dict):
            raise CorpusError(f"{path}:{number}: `metadata` must be an object")
        if first:  # a wrong mapping shows at once, with the fields there are (blank lines
            # before the first record hold none)
            mapping.check(record, f"{path} (line {number})", nested)
            first = False
        yield number, mapping.document(record, f"{path}:{number}")


def checked(documents: Iterable[tuple[int, Document]], path: Path) -> Iterator[Document]:
    """The documents, each checked against those before it (``_Consistency``)."""
    check = _Consistency(path)
    for number, document in documents:
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


class RepeatedKey(ValueError):
    """A JSON object naming a key twice (``json`` keeps the last value silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object's pairs as a dict (an ``object_pairs_hook``); a repeated key (in the record
    or nested in it) is ``RepeatedKey``, not the first value lost. It costs about 5% of the
    reader's CPU time (0.06 s per 100k records of 80 words). A set finds the key: a scan of
    the keys before each was quadratic (7 s for one object of 20,000 keys)."""
    record = dict(pairs)
    if len(record) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return record


_DECODER = json.JSONDecoder(object_pairs_hook=distinct_keys)


def _parse(line: str, path: Path, number: int) -> object:
    try:
        return _DECODER.decode(line)
    except RepeatedKey as exc:
        raise CorpusError(f"{path}:{number}: the key {exc.key!r} appears twice in one object, "
                          "and only the last value would be kept; rename or remove one"
                          ) from exc
    except ValueError as exc:
        raise CorpusError(f"{path}:{number}: not valid JSON ({exc})") from exc
    except RecursionError as exc:  # json's decoder recurses once per level of nesting
        raise CorpusError(f"{path}:{number}: a JSON value nested too deeply to read; "
                          "flatten the record") from exc


def read_corpus(path: Path, mapping: FieldMapping | None = None) -> Iterator[Document]:
    """A BEIR folder (``corpus.jsonl`` inside), a folder of Markdown / text / HTML files, a
    CSV or Parquet table, or a JSONL file; ``mapping`` names the fields of records."""
    path = Path(path)
    mapping = mapping or FieldMapping()
    if path.is_dir():
        if (path / "corpus.jsonl").is_file():
            return read_jsonl(path / "corpus.jsonl", mapping)
        return checked(enumerate(read_folder(path, mapping), start=1), path)
    if path.suffix.lower() in TABLE_SUFFIXES:
        if not path.is_file():
            raise CorpusError(f"corpus file {path} does not exist")
        return checked(enumerate(read_table(path, mapping), start=1), path)
    return read_jsonl(path, mapping)


def read_queries(path: Path) -> dict[str, str]:
    """BEIR queries.jsonl -> {query id: text}; a line that is no such record is a
    ``CorpusError`` naming it."""
    queries: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                    queries[str(record["_id"])] = str(record["text"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise CorpusError(f"{path} line {number} is not a query record "
                                      f"{{\"_id\": ..., \"text\": ...}}: {exc!r}") from exc
                except RecursionError as exc:
                    raise CorpusError(f"{path} line {number}: a JSON value nested too "
                                      "deeply to read; give {\"_id\": ..., \"text\": ...}"
                                      ) from exc
    return queries


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (header line) -> {query id: {doc id: relevance}}; a judgement that is
    no integer is a ``CorpusError`` naming its line."""
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as handle:
        next(handle, None)
        for number, line in enumerate(handle, start=2):
            parts = line.split("\t")
            if len(parts) >= 3:
                try:
                    qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
                except ValueError as exc:
                    raise CorpusError(f"{path} line {number}: the judgement {parts[2].strip()!r}"
                                      " is no integer (query id, doc id, score)") from exc
    return qrels
