"""What several subcommands share: the subparsers type, the ``--filter`` argument and the
corpus field mapping flags."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, TypeAlias

from pydantic import ValidationError

from indexes.sources import FieldMapping
from retrieval.errors import MalformedFilterError
from retrieval.strict import problems

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

FILTER_HELP = ('JSON, e.g. \'{"year": {"gte": 2010}}\', or the DSL, e.g. '
               '\'year >= 2010 AND doc_type IN ("review", "trial")\'')


def add_parser(subparsers: Subparsers, name: str, help: str, epilog: str | None = None,
               **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` keeps the epilog's samples as written."""
    return subparsers.add_parser(
        name, help=help, description=help[:1].upper() + help[1:] + ".", epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def parse_filter_arg(text: str | None) -> dict[str, Any] | str | None:
    """``--filter`` takes JSON (when it starts with ``{``) or the DSL; bad JSON names the flag."""
    if not text or not text.strip():
        return None
    stripped = text.strip()
    if not stripped.startswith("{"):
        return stripped
    try:
        value = json.loads(stripped)
    except RecursionError:  # was a traceback; the filter language allows 32 levels anyway
        raise MalformedFilterError("--filter JSON nests too deeply to read; a filter nests at "
                                   "most 32 levels (AND/OR take any number of conditions "
                                   "without nesting)") from None
    except json.JSONDecodeError as exc:
        raise MalformedFilterError(
            f"--filter starts with '{{' but is not valid JSON ({exc.msg} at position {exc.pos}); "
            'write JSON with double quotes, e.g. \'{"year": {"gte": 2010}}\', or use the DSL, '
            "e.g. 'year >= 2010'"
        ) from exc
    if not isinstance(value, dict):  # pragma: no cover - a "{" text decodes only to a dict
        raise MalformedFilterError("--filter JSON must be an object")
    return value


def add_mapping_flags(parser: argparse.ArgumentParser) -> None:
    """``--id-field``, ``--text-field``, ``--title-field``, ``--keep-fields``,
    ``--drop-fields``: where a corpus's records hold each part (``FieldMapping``)."""
    parser.add_argument("--id-field", default=None, help="the field holding each document's "
                        "id (default: _id, else id)")
    parser.add_argument("--text-field", default="text", help="the field holding its text")
    parser.add_argument("--title-field", default=None, help="the field holding its title "
                        "(default: title, optional)")
    parser.add_argument("--keep-fields", default=None, metavar="A,B",
                        help="metadata fields to keep (default: every other field)")
    parser.add_argument("--drop-fields", default="", metavar="A,B",
                        help="fields to leave out of the metadata")


def mapping_of(args: argparse.Namespace) -> FieldMapping:
    def names(text: str | None) -> tuple[str, ...] | None:
        return None if text is None else tuple(n.strip() for n in text.split(",") if n.strip())

    return FieldMapping(id_field=args.id_field, text_field=args.text_field,
                        title_field=args.title_field, keep=names(args.keep_fields),
                        drop=names(args.drop_fields) or ())


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of values, texts...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def flag_problems(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """Each refused setting of ``exc`` named as the flag that set it: ``flags[name]``, else
    ``batch_size`` is ``--batch-size``."""
    return problems(exc, lambda name: (flags or {}).get(name, "--" + name.replace("_", "-")))
