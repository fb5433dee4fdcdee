"""Validation of a write before anything reaches the log: every problem is an
``InvalidWriteError`` naming the document and what to change."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from indexes.doc_ids import ID_FIELD
from indexes.docstore import Document
from indexes.encoders import compatible_query_encoder
from indexes.errors import CorpusError, InvalidWriteError, SchemaMismatchError
from indexes.manifest import Manifest
from indexes.metadata import (
    FieldKind,
    empty_list,
    inexact_number,
    merge_kinds,
    parse_date,
    refuse_surrogates,
    value_kind,
)
from indexes.wal.log import Record
from indexes.wal.state import Changes


def document_list(documents: Iterable[Document | dict[str, Any]]
                  ) -> list[Document | dict[str, Any]]:
    """``documents`` as a list; one document given alone is an ``InvalidWriteError`` (a dict
    listed would be its keys, a string its characters)."""
    if isinstance(documents, Document | Mapping | str | bytes):
        raise InvalidWriteError(f"documents is one {type(documents).__name__}: give a list of "
                                "documents (``[document]`` for one)")
    return listed(documents, "documents", "documents (``[document]`` for one)")


def listed(items: Any, what: str, give: str) -> list[Any]:
    """``items`` as a list; what is no iterable (None, a number) is an ``InvalidWriteError``
    saying what to pass, not the bare TypeError of ``list(None)``."""
    try:
        return list(items)
    except TypeError as exc:
        if hasattr(items, "__iter__"):  # an iterable failing inside: its own error
            raise
        given = "None" if items is None else f"a {type(items).__name__}"
        raise InvalidWriteError(f"{what} is {given}, not a list: give a list of {give}"
                                ) from exc


def given_vectors(vectors: Any) -> np.ndarray | None:
    """Caller-given vectors as a float32 array; an ``InvalidWriteError`` for what is no matrix
    of numbers (rows of different lengths, strings)."""
    if vectors is None:
        return None
    try:
        return np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidWriteError(f"vectors are no matrix of numbers ({exc}): give one row of "
                                "floats per document, every row as long") from exc


def check_documents(documents: Iterable[Document | dict[str, Any]], kinds: Mapping[str, str],
                    allow_new_fields: bool = False) -> tuple[list[Document], dict[str, str]]:
    """The documents as ``Document``s and the field kinds including theirs; a field the
    index lacks is ``SchemaMismatchError`` unless ``allow_new_fields``."""
    docs = [as_document(item, i) for i, item in enumerate(documents)]
    if not docs:
        raise InvalidWriteError("no documents to upsert: give at least one")
    check_unique([d.id for d in docs])
    return docs, merged_schema(docs, kinds, allow_new_fields)


def merged_schema(docs: Iterable[Document], kinds: Mapping[str, str], allow_new_fields: bool
                  ) -> dict[str, str]:
    """The index's field kinds after ``docs`` (checked as ``check_documents`` says). A field
    new to the index takes the kind its values in these documents make together, as a build
    infers it (dates and other strings make a keyword field, empty lists alone one of tags
    yet to come), whatever their order."""
    docs = list(docs)
    if not allow_new_fields:
        for doc in docs:
            for name, value in doc.metadata.items():
                # An empty list is no value: refusing it refused writes clearing a field
                # the build stores unindexed (lists of numbers make no kind).
                if name not in kinds and name != ID_FIELD and value_kind(value) is not None:
                    raise SchemaMismatchError(
                        f"document {doc.id!r}: metadata field {name!r} is not in the index's "
                        f"schema ({describe_schema(kinds)}); fix the field name, or rebuild "
                        "with allow_new_fields (retrieval build --allow-new-fields) so "
                        "upserts may add fields", name)
    merged = dict(kinds)
    for name, seen in new_fields(docs, kinds, allow_new_fields).items():
        kind = new_kind(seen)
        if kind is None:
            raise SchemaMismatchError(f"metadata field {name!r} mixes {sorted(seen)} values in "
                                      "this write; give every document the same type for it",
                                      name)
        merged[name] = kind
    for doc in docs:
        for name, value in doc.metadata.items():
            field_kind(doc.id, name, value, merged.get(name), merged)
    return merged


def new_fields(docs: Iterable[Document], kinds: Mapping[str, str], empty_lists: bool
               ) -> dict[str, set[FieldKind]]:
    """The kinds the values of each field ``kinds`` lacks imply, over ``docs`` together; no
    kinds for a field holding only empty lists (``new_kind`` makes it a keyword field), left
    out unless ``empty_lists`` (an index taking new fields): where the schema takes none, an
    empty list is no value and adds no field, or a typo given ``[]`` would make one."""
    found: dict[str, set[FieldKind]] = {}
    for doc in docs:
        for name, value in doc.metadata.items():
            if name in kinds or name == ID_FIELD:
                continue
            kind = value_kind(value)
            if kind is not None:
                found.setdefault(name, set()).add(kind)
            elif empty_lists and empty_list(value):  # as ``indexes.metadata.listed_only``
                found.setdefault(name, set())  # nested objects, lists of numbers: stored only
    return found


def new_kind(seen: set[FieldKind]) -> FieldKind | None:
    """The kind of a new field whose values implied ``seen`` (None when they conflict). One
    holding only empty lists is a keyword field, as a build makes it: a field without a kind
    was no field, and a filter on it that a build of the same documents serves (no document
    holds "x", every one lacks a value) was an unknown-field error."""
    return merge_kinds(seen) if seen else "keyword"


def describe_schema(kinds: Mapping[str, str]) -> str:
    if not kinds:
        return "no filterable fields"
    return "fields: " + ", ".join(f"{name} ({kind})" for name, kind in sorted(kinds.items()))


def as_document(item: Document | dict[str, Any], position: int) -> Document:
    if isinstance(item, Document):
        doc = item
    elif isinstance(item, Mapping):
        extra = set(item) - {"_id", "id", "text", "title", "metadata"}
        raw_id = item.get("_id", item.get("id"))
        if not isinstance(item.get("metadata") or {}, Mapping):
            raise InvalidWriteError(f"document {position} ({raw_id!r}): metadata must be an "
                                    "object of field -> value")
        doc = Document(id=str(raw_id) if isinstance(raw_id, int | str) else raw_id,  # type: ignore[arg-type]
                       text=item.get("text"), title=item.get("title") or "",  # type: ignore[arg-type]
                       metadata={**(item.get("metadata") or {}), **{k: item[k] for k in extra}})
    else:
        raise InvalidWriteError(f"document {position} is a {type(item).__name__}; give "
                                "indexes.Document objects or dicts with id and text")
    if not isinstance(doc.id, str) or not doc.id.strip():
        raise InvalidWriteError(f"document {position} has no id: every document needs a "
                                "non-empty string id")
    if not isinstance(doc.text, str):  # "" is a text, as a build takes it: corpora hold
        # documents with none (two of Cranfield's), and a caller's vector may be all there is
        raise InvalidWriteError(f"document {doc.id!r} has no text: give it a text string "
                                f"(\"\" for none), not {type(doc.text).__name__}")
    if not isinstance(doc.title, str) or not isinstance(doc.metadata, dict):
        raise InvalidWriteError(f"document {doc.id!r}: title must be a string and metadata "
                                "an object")
    try:
        for part in ("id", "title", "text"):
            refuse_surrogates([getattr(doc, part)], f"document {position}: its {part}")
    except CorpusError as exc:
        raise InvalidWriteError(str(exc)) from exc
    named = next((name for name in doc.metadata if not isinstance(name, str)), None)
    if named is not None:  # as a build refuses it: 1 and "1" would be one field once logged
        raise InvalidWriteError(f"document {doc.id!r}: metadata field name {named!r} is a "
                                f"{type(named).__name__}; name every field with a string")
    try:  # UTF-8 and keys sorted, as logged: a lone surrogate is a ValueError too, and
        # nested keys of mixed types (1 and "a") a TypeError
        json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidWriteError(f"document {doc.id!r}: metadata is not JSON ({exc}); use "
                                "strings, numbers, booleans, lists and objects") from exc
    return doc


def field_kind(doc_id: str, name: str, value: Any, known: str | None,
               schema: Mapping[str, str]) -> str | None:
    """The field's kind after this value; refuses a value of another kind than the index's
    (``SchemaMismatchError``). None: only values of no filterable kind so far (stored with
    the document, not filterable)."""
    if name == ID_FIELD:
        raise InvalidWriteError(f"document {doc_id!r}: metadata field {ID_FIELD!r} is "
                                f"reserved: filters on {ID_FIELD!r} match document ids; "
                                "rename the field")
    kind = value_kind(value)
    if kind is None:  # a nested object or a list of non-strings: stored, not indexed, in a
        return known  # field of any kind (as a build and the live delta take it)
    if known is None:
        return check_convertible(doc_id, name, value, kind)
    if merge_kinds({kind, known}) != known:  # type: ignore[arg-type]
        raise SchemaMismatchError(
            f"document {doc_id!r}: metadata field {name!r} holds a {kind} value "
            f"({value!r}) but the index's field is {known} ({describe_schema(schema)}); "
            f"give a {known} value (or rebuild the index to change the field's type)", name)
    return check_convertible(doc_id, name, value, known)


def check_convertible(doc_id: str, name: str, value: Any, kind: str | None) -> str | None:
    """``kind``, once ``value`` converts as a field of that kind stores it (a build's column
    refuses what does not): a date-shaped string must be a real date, a number a float."""
    if value is None or kind not in ("number", "date"):
        return kind
    try:
        parse_date(value) if kind == "date" else float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidWriteError(f"document {doc_id!r}: metadata field {name!r} holds "
                                f"{value!r}, which is no {kind} ({exc}); fix the value") from exc
    why = inexact_number(value) if kind == "number" else None
    if why is not None:
        raise InvalidWriteError(f"document {doc_id!r}: metadata field {name!r}: {why}")
    return kind


def check_ids(ids: Iterable[str]) -> list[str]:
    if isinstance(ids, str | bytes):  # listed, "doc-1" would delete d, o, c, - and 1
        raise InvalidWriteError(f"ids is one string ({ids!r}): give a list of ids "
                                "(``[doc_id]`` for one)")
    checked = listed(ids, "ids", "document ids (``[doc_id]`` for one)")
    if not checked:
        raise InvalidWriteError("no ids to delete: give at least one")
    for position, doc_id in enumerate(checked):
        if not isinstance(doc_id, str) or not doc_id.strip():
            raise InvalidWriteError(f"id {position} ({doc_id!r}) is not a non-empty string")
    check_unique(checked)
    return checked


def check_unique(ids: list[str]) -> None:
    seen: set[str] = set()
    for doc_id in ids:
        if doc_id in seen:
            raise InvalidWriteError(f"duplicate id {doc_id!r} in one call: give each document "
                                    "once per call")
        seen.add(doc_id)


def merged_kinds(base: Mapping[str, str], records: Iterable[Record], allow_new_fields: bool
                 ) -> dict[str, str]:
    """Field kinds of the base build plus the fields the log's upserts added, each decided
    from the values of every upsert together, as ``check_fields_fit`` (the publish check)
    and a build decide it, whatever their order: a date then a word is a keyword field.
    Decided record by record, the first one's kind stuck (date), and a build published over
    writes of a field it lacks, checked as keyword, failed every reader at "not a date"."""
    found: dict[str, set[FieldKind]] = {}  # every kind of each new field's values
    first: dict[str, FieldKind] = {}  # the kind of the first write giving it a value
    for record in records:
        for name, kinds_seen in new_fields(record.documents, base, allow_new_fields).items():
            found.setdefault(name, set()).update(kinds_seen)
            if kinds_seen:
                first.setdefault(name, min(kinds_seen))
    kinds = dict(base)
    for name, seen in found.items():
        # Writes checked against different builds may conflict (a number, then a word):
        # the first write's kind then, as before, and the reader's delta says which value.
        kinds[name] = new_kind(seen) or first[name]
    return kinds


def check_records_fit(manifest: Manifest, changes: Changes) -> None:
    """Refuse upserts logged for another kind of build than ``manifest``'s (a root rebuilt
    with or without passages, or with another model, while records were pending): their
    vectors are per document where passages are needed, or the reverse, or of a width its
    vectors are not, or of another model (cosines across two models mean nothing)."""
    check_fit(manifest.passages is not None, f"build {manifest.build_id!r}", changes)
    dim = manifest.encoder.dim
    for doc_id, (_, vectors) in changes.upserts.items():
        if vectors.shape[-1] != dim:
            raise InvalidWriteError(
                f"the log's upsert of {doc_id!r} carries {vectors.shape[-1]}-dimensional "
                f"vectors, and build {manifest.build_id!r} holds {dim}-dimensional ones "
                f"(model {manifest.encoder.model!r}): fold the log first (`retrieval "
                "compact`, or IndexWriter.compact) so no write is pending, then build with "
                "the other model")
    check_models_fit(manifest, changes)


def check_models_fit(manifest: Manifest, changes: Changes) -> None:
    """Refuse upserts whose vectors another model made than the build's (records logged
    before ``Record.encoder`` was kept pass: their model is unknown)."""
    model = manifest.encoder.encoder_id
    for doc_id, made_by in changes.encoders.items():
        # Either way: a build's id written before ids carried a weights digest names the
        # same model as the digested one (``same_model_name``).
        if made_by and not (compatible_query_encoder(made_by, model)
                            or compatible_query_encoder(model, made_by)):
            raise InvalidWriteError(
                f"the log's upsert of {doc_id!r} carries vectors of {made_by!r}, and build "
                f"{manifest.build_id!r} holds vectors of {model!r}: fold the log first "
                "(`retrieval compact`, or IndexWriter.compact) so no write is pending, then "
                "build with the other model")


def check_fields_fit(manifest: Manifest, changes: Changes) -> None:
    """Refuse upserts whose metadata the build's field kinds refuse (a field rebuilt as a
    number, while writes of the old keyword kind were pending): every reader applying them
    would fail, and so would every compaction."""
    docs = [doc for doc, _ in changes.upserts.values()]
    try:  # new fields pass, as a reader's log follower takes them
        merged_schema(docs, manifest.metadata_fields, allow_new_fields=True)
    except InvalidWriteError as exc:
        raise InvalidWriteError(
            f"the log's pending upserts do not fit build {manifest.build_id!r}: {exc}. Pause "
            "the writes of the old kind, fold the log (`retrieval compact`, or "
            "IndexWriter.compact) so no write is pending, then build again") from exc


def check_fit(split_build: bool, build: str, changes: Changes) -> None:
    for doc_id in changes.upserts:
        if bool(changes.spans.get(doc_id)) != split_build:
            kind = "a passage build" if split_build else "a build of whole documents"
            raise InvalidWriteError(
                f"the log's upsert of {doc_id!r} was written for another kind of build than "
                f"{build}, which is {kind}: fold the log first (`retrieval compact`, or "
                "IndexWriter.compact) so no write is pending, then build with the other "
                "--passages setting")
