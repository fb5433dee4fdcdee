"""Document sources beyond BEIR and JSONL: CSV and Parquet tables, folders of Markdown, text
and HTML files, and the field mapping every source takes.

A ``FieldMapping`` names the fields holding a document's id, text and title, and which other
fields become metadata (all of them by default, ``keep`` to list them, ``drop`` to leave
some out). A mapping naming a field the source does not have is a ``CorpusError`` listing
the fields it does have.

Tables are read with pyarrow (``pyarrow.csv`` infers each column's type from its values, so a
column of years is a number field, and Parquet keeps its schema). A folder yields one
document per ``.md`` / ``.markdown`` / ``.txt`` / ``.html`` / ``.htm`` file, its id the path
relative to the folder, its title the first Markdown heading or the HTML ``<title>`` (else
the first ``<h1>``); HTML is reduced to its readable text with lxml's parser (scripts, styles
and templates left out), never with regexes.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from indexes.doc_ids import ID_FIELD
from indexes.docstore import Document
from indexes.errors import CorpusError

TABLE_SUFFIXES = {".csv": "CSV", ".tsv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}
FILE_SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html",
                 ".htm": "html"}
UNREADABLE = ("script", "style", "noscript", "template", "head")
BLOCKS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
          "blockquote", "section", "article", "header", "footer", "td", "th", "dt", "dd")


class FieldMapping(BaseModel):
    """Which fields of a source record hold a document's parts (``read_corpus(mapping=)``,
    ``retrieval build --id-field ...``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id_field: str | None = Field(None, description="the id (default: _id, else id)")
    text_field: str = "text"
    title_field: str | None = Field(None, description="the title (default: title, optional)")
    keep: tuple[str, ...] | None = Field(None, description="metadata fields to keep (default "
                                         "all other fields)")
    drop: tuple[str, ...] = Field((), description="fields to leave out of the metadata")

    @property
    def is_default(self) -> bool:
        return self == FieldMapping()

    def check(self, fields: Iterable[str], where: str, nested: Iterable[str] = ()) -> None:
        """A mapping naming fields ``where`` lacks is an error listing the ones it has.
        ``nested``: the fields of its ``metadata`` object, which ``keep`` and ``drop`` may
        name (``document`` merges them with the top-level ones) but an id or a text not."""
        have = list(dict.fromkeys(fields))
        inside = [f for f in dict.fromkeys(nested) if f not in have]
        named = [self.text_field, *(f for f in (self.id_field, self.title_field) if f)]
        missing = [repr(f) for f in named if f not in have]
        missing += [repr(f) for f in (*(self.keep or ()), *self.drop)
                    if f not in have and f not in inside]
        if self.id_field is None and "_id" not in have and "id" not in have:
            missing.insert(0, "'_id' (or 'id')")
        if missing:
            listed = ", ".join(map(repr, have)) or "none"
            if inside:
                listed += f" (in its metadata: {', '.join(map(repr, inside))})"
            raise CorpusError(
                f"{where}: no field {', '.join(missing)}; its fields are {listed}: map them "
                "with --id-field, --text-field, --title-field and name metadata with "
                "--keep-fields, --drop-fields (FieldMapping in Python)")
        self._check_reserved(have, where)

    def columns_to_read(self, columns: Sequence[str], where: str) -> list[str]:
        """The columns of a table to read, each name once. A row becomes a record holding one
        value per name, so of two columns named alike all but the last were lost silently: a
        repeated name is an error, unless the mapping leaves that field out of the documents
        (``drop``, or not among ``keep``), when neither column is read."""
        counts = Counter(columns)
        repeated = [name for name, count in counts.items() if count > 1]
        read = [name for name in repeated if self._is_read(name)]
        if read:
            raise CorpusError(self._repeated_columns(columns, read, where))
        return [name for name in columns if counts[name] == 1]

    def _is_read(self, name: str) -> bool:
        """Whether a field of that name reaches a document (as a part, the merged metadata
        object or a metadata field)."""
        return name in self.parts or name == "metadata" or bool(self._metadata_fields([name]))

    def _repeated_columns(self, columns: Sequence[str], names: list[str], where: str) -> str:
        def positions(name: str) -> str:
            found = [str(i) for i, column in enumerate(columns, start=1) if column == name]
            return ", ".join(found[:-1]) + " and " + found[-1]

        given = "; ".join(f"columns {positions(name)} are named {name!r}" for name in names)
        message = (f"{where}: {given}, and a row keeps one value per name (all but the last "
                   "column's would be lost): rename the columns so each name is distinct")
        droppable = [name for name in names if name not in self.parts and name != "metadata"]
        if droppable:
            message += (" (or, if neither column is needed, leave both out with --drop-fields "
                        f"{','.join(droppable)}; FieldMapping(drop=...) in Python)")
        return message

    def _check_reserved(self, fields: Iterable[str], where: str) -> None:
        """No field named ``id`` becomes metadata (checked on every record: one that only a
        later record holds was stored where no filter reaches it)."""
        if ID_FIELD in fields and self._metadata_fields([ID_FIELD]):
            raise CorpusError(
                f"{where}: its field {ID_FIELD!r} would be metadata (the id is "
                f"{self.id_field!r}), but a filter on {ID_FIELD!r} means the document id: "
                f"leave it out with --drop-fields {ID_FIELD} or make it the id with "
                f"--id-field {ID_FIELD}")

    def _metadata_fields(self, fields: Iterable[str]) -> list[str]:
        """Those of ``fields`` that become metadata: neither a part nor left out."""
        return [f for f in fields if f not in self.parts and f not in self.drop
                and (self.keep is None or f in self.keep)]

    @property
    def parts(self) -> set[str]:
        """The fields holding a document's id, text and title, never metadata. By default
        both "_id" and "id" name the id; with --id-field they are fields like any other
        (--keep-fields may name them)."""
        ids = (self.id_field,) if self.id_field else ("_id", "id")
        return {*ids, self.text_field, self.title_field or "title"}

    def document(self, record: Mapping[str, Any], where: str, table: bool = False
                 ) -> Document:
        """The record as a ``Document``; a missing id or a text that is not a string is an
        error naming ``where``. ``table``: a table's row, whose dates may be nested in lists
        and structs (a JSON record holds none: its lists are not walked)."""
        if table:  # an empty cell is no value (a CSV's text cells are read as written)
            record = {key: None if value == "" else value for key, value in record.items()}
        self._check_reserved(record, where)
        id_field = self.id_field or ("_id" if "_id" in record else "id")
        doc_id, text = record.get(id_field), record.get(self.text_field)
        if table and text is None:  # an empty cell of the text column (``check`` found the
            # column): how a CSV writes an empty text, JSON's ""
            text = ""
        if doc_id is None or doc_id == "" or not isinstance(text, str):
            raise CorpusError(f"{where}: a document needs an id ({id_field!r}) and a text "
                              f"string ({self.text_field!r}); got id {doc_id!r}, text "
                              f"{type(text).__name__}")
        title_field = self.title_field or "title"
        title = record.get(title_field)
        check_scalar(doc_id, f"{where}: the id ({id_field!r})", (str, int))
        check_scalar(title, f"{where}: the title ({title_field!r})", (str, int, float))
        given = record.get("metadata")
        nested: dict[str, Any] = given if isinstance(given, dict) else {}
        # a metadata object is merged; anything else there (a CSV column) is a field
        parts = self.parts | ({"metadata"} if isinstance(given, dict) else set())
        extra = {k: v for k, v in record.items() if k not in parts}
        clash = sorted(nested.keys() & extra.keys())
        if clash:  # the top-level value silently replaced the metadata object's
            raise CorpusError(f"{where}: {clash[0]!r} is both a field and a key of its "
                              "metadata object; keep one of them")
        metadata = {**nested, **extra}
        if self.keep is not None:
            metadata = {k: v for k, v in metadata.items() if k in self.keep}
        for name in self.drop:
            metadata.pop(name, None)
        return Document(id=str(doc_id), text=text, title="" if title is None else str(title),
                        metadata={k: (table_value if table else cell_value)(v)
                                  for k, v in metadata.items() if v is not None})


KIND_NAMES = {str: "string", int: "whole number", float: "number"}


def check_scalar(value: Any, what: str, kinds: tuple[type, ...]) -> None:
    """``value`` (None allowed) is one of ``kinds``, not a boolean: a list, an object or
    ``true`` was stored as its Python repr ("[1]", "True"), and a title of 0 became ""."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        wanted = " or ".join(KIND_NAMES[k] for k in kinds)
        raise CorpusError(f"{what} is {type(value).__name__} {str(value)[:40]!r}; give "
                          f"a {wanted}")


def cell_value(value: Any) -> Any:
    """A source's value as JSON holds it: a date or a datetime (pyarrow reads an ISO 8601
    column of a CSV or Parquet file as one) becomes its ISO 8601 string, which the build
    indexes as a date field; a time of day its ISO string too (a keyword), a decimal a
    number, a duration its seconds (pyarrow reads "09:00:00" in a CSV as a time, and the
    build refused these with advice for Python callers)."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def table_value(value: Any) -> Any:
    """``cell_value`` also inside a list or a struct (a ``list<date32>`` column)."""
    if isinstance(value, list):
        return [table_value(item) for item in value]
    if isinstance(value, dict):
        return {key: table_value(item) for key, item in value.items()}
    return cell_value(value)


def read_table(path: Path, mapping: FieldMapping) -> Iterator[Document]:
    """Documents from a CSV (header row) or Parquet file, one per row."""
    table, columns = _load_table(path, mapping)
    mapping.check(columns, str(path), _struct_fields(table, "metadata"))
    for number, record in enumerate(table.to_pylist(), start=1):
        yield mapping.document(record, f"{path}: row {number}", table=True)


def _struct_fields(table: Any, column: str) -> list[str]:
    """The fields of a struct column (a Parquet ``metadata`` object), else none."""
    import pyarrow as pa

    if column not in table.column_names:
        return []
    kind = table.schema.field(column).type
    return [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []


def _load_table(path: Path, mapping: FieldMapping) -> tuple[Any, list[str]]:
    """The table, less the columns of a repeated name the mapping leaves out
    (``FieldMapping.columns_to_read``), and the names of all its columns."""
    import pyarrow as pa  # here: serving never reads tables
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    try:
        if TABLE_SUFFIXES[path.suffix.lower()] == "Parquet":
            schema = pq.read_schema(path)  # the footer: names are checked before any row
            columns = mapping.columns_to_read(schema.names, str(path))
            check_struct_names(schema, columns, str(path))
            read = pq.read_table(path, columns=columns if columns != schema.names else None)
            return read, schema.names
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        # Ids, texts and titles stay text even when they look like numbers ("00123" must
        # not become 123, a title "2" not "2.0").
        header = _csv_header(path, delimiter)
        id_fields = (mapping.id_field,) if mapping.id_field else ("_id", "id")
        texts = (*id_fields, mapping.text_field, mapping.title_field or "title")
        text_columns = {name: pa.string() for name in texts if name in header}
        # A text cell is kept as written ("NA" is Namibia, "null" a title; an empty one is
        # missing, in ``FieldMapping.document``, or an empty text in the text column); in a
        # column of numbers or dates pyarrow's null spellings ("NA", "null", "N/A") are
        # missing values, as R and pandas write them.
        table = pa_csv.read_csv(path, parse_options=pa_csv.ParseOptions(delimiter=delimiter),
                                convert_options=pa_csv.ConvertOptions(
                                    column_types=text_columns, strings_can_be_null=False))
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(f"cannot read {path}: {exc}") from exc
    return table.select(mapping.columns_to_read(table.column_names, str(path))), table.column_names


def check_struct_names(schema: Any, columns: Iterable[str], where: str) -> None:
    """No struct among ``columns`` (a Parquet ``metadata`` object, nested at any depth) names
    two fields alike: pyarrow cannot turn such a row into a record (a bare ValueError)."""
    for name in columns:
        found = _repeated_inside(schema.field(name).type, name)
        if found is not None:
            path, field = found
            raise CorpusError(f"{where}: the struct {path!r} holds two fields named {field!r}; "
                              "rename one so each name is distinct")


def _repeated_inside(kind: Any, path: str) -> tuple[str, str] | None:
    """(struct path, field name) of the first struct in ``kind`` naming a field twice."""
    import pyarrow as pa

    children = [kind.field(i) for i in range(kind.num_fields)]
    is_struct = pa.types.is_struct(kind)
    if is_struct:
        names = [child.name for child in children]
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            return path, repeated
    for child in children:  # a list's or a map's items, a struct's fields
        found = _repeated_inside(child.type, f"{path}.{child.name}" if is_struct else path)
        if found is not None:
            return found
    return None


def _csv_header(path: Path, delimiter: str) -> list[str]:
    import csv

    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name;
    # pyarrow drops it too, and the id column must be named as it reads it.
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return next(csv.reader(handle, delimiter=delimiter), [])
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path}: not UTF-8 near its start (byte {exc.start} of a block "
                          "read); save the file as UTF-8") from exc


def read_folder(root: Path, mapping: FieldMapping) -> Iterator[Document]:
    """One document per Markdown, text or HTML file under ``root`` (sorted paths); listed
    now (an empty folder fails before a model loads), read lazily."""
    if not mapping.is_default:
        raise CorpusError(f"{root}: a folder of files has no fields to map (ids are paths, "
                          "titles headings); drop --id-field/--text-field/--title-field")
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise CorpusError(f"{root} holds no corpus.jsonl and no {', '.join(FILE_SUFFIXES)} "
                          "files: give a BEIR folder, a folder of documents or a file")
    return (file_document(path, path.relative_to(root).as_posix()) for path in files)


def file_document(path: Path, doc_id: str) -> Document:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"cannot read {path} as UTF-8 text: {exc}") from exc
    kind = FILE_SUFFIXES[path.suffix.lower()]
    # An empty file (or one of whitespace, or of tags only) is a document with an empty text,
    # as JSONL's "text": "" is: its id and metadata are still filterable and deletable.
    if kind == "html":
        title, text = html_text(raw, path)
    else:
        title, text = (markdown_title(raw) if kind == "markdown" else ""), raw.strip()
    return Document(id=doc_id, text=text, title=title,
                    metadata={"format": kind, "folder": str(Path(doc_id).parent)})


def markdown_title(text: str) -> str:
    """The first ATX heading (``# Title``) of a Markdown text, else ''."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
    return ""


_XML_DECLARATION = re.compile(r"\A\s*<\?xml[^>]*\?>")


def html_text(html: str, path: Path) -> tuple[str, str]:
    """(title, readable text) of an HTML page, parsed by lxml."""
    import lxml.html
    from lxml.etree import ParserError

    # lxml refuses a str that declares an encoding (XHTML's <?xml ... encoding=...?>): the
    # text is decoded already, so the declaration says nothing.
    html = _XML_DECLARATION.sub("", html, count=1)
    try:
        tree = lxml.html.document_fromstring(html)
    except ParserError:  # "Document is empty": no element at all (blank, or comments only)
        return "", ""
    except ValueError as exc:
        raise CorpusError(f"cannot parse {path} as HTML: {exc}") from exc
    found = tree.findtext(".//title") or tree.findtext(".//h1") or ""
    for element in list(tree.iter(*UNREADABLE)):
        element.drop_tree()
    for element in tree.iter(*BLOCKS):  # a block ends a line: words never run together
        element.tail = "\n" + (element.tail or "")
    lines = (" ".join(line.split()) for line in tree.text_content().splitlines())
    return " ".join(found.split()), "\n".join(line for line in lines if line)
