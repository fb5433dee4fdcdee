"""``--url``: the write commands sent to a running ``retrieval serve`` instead of the root."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from retrieval.errors import ConfigError

if TYPE_CHECKING:
    from retrieval.client import RemoteRetriever

DEFAULT_KEY_ENV = "RETRIEVAL_API_KEY"


def add_remote_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running `retrieval serve` to write "
                        "through, e.g. http://127.0.0.1:8080 (then no INDEX)")
    parser.add_argument("--api-key-env", default=DEFAULT_KEY_ENV, metavar="NAME",
                        help=f"environment variable holding a key of write scope (default "
                        f"{DEFAULT_KEY_ENV}; a key on the command line would show in ps)")
    parser.add_argument("--batch", type=int, default=500, help="documents or ids per request "
                        "with --url (each is one acknowledged write)")


def remote_writer(args: argparse.Namespace) -> RemoteRetriever:
    """The client ``--url`` names; an INDEX as well, or a batch below 1, is an error."""
    if args.index is not None:
        raise ConfigError("give either an INDEX root or --url, not both", "url")
    if args.batch < 1:
        raise ConfigError(f"--batch must be at least 1, not {args.batch}", "batch")
    from retrieval.client import RemoteRetriever  # httpx: only for --url, not every command

    return RemoteRetriever(args.url, os.environ.get(args.api_key_env) or None, timeout=60.0)
