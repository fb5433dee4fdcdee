"""What several subcommands share: the subparsers type and the ``--filter`` argument."""

from __future__ import annotations

import argparse
import json
from typing import Any, TypeAlias

from retrieval.errors import MalformedFilterError

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
    except json.JSONDecodeError as exc:
        raise MalformedFilterError(
            f"--filter starts with '{{' but is not valid JSON ({exc.msg} at position {exc.pos}); "
            'write JSON with double quotes, e.g. \'{"year": {"gte": 2010}}\', or use the DSL, '
            "e.g. 'year >= 2010'"
        ) from exc
    if not isinstance(value, dict):  # pragma: no cover - a "{" text decodes only to a dict
        raise MalformedFilterError("--filter JSON must be an object")
    return value
