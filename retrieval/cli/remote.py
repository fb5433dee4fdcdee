"""``--url``: the write commands sent to a running ``retrieval serve`` instead of the root."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
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
    parser.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                        help="with --url: how long to wait for each request's answer (default "
                        "60; the server embeds a batch's texts before it answers)")


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


@contextmanager
def remote_writer(args: argparse.Namespace) -> Iterator[RemoteRetriever]:
    """The client ``--url`` names; an INDEX as well, or a batch below 1, is an error. A
    refused key is reported with where the command reads its key from."""
    if args.index is not None:
        raise ConfigError("give either an INDEX root or --url, not both", "url")
    if args.batch < 1:
        raise ConfigError(f"--batch must be at least 1, not {args.batch}", "batch")
    from retrieval.client import RemoteRetriever, WriteTimeoutError  # httpx: only for --url
    from retrieval.service.errors import AuthenticationError

    key = os.environ.get(args.api_key_env) or None
    try:
        client = RemoteRetriever(args.url, key, timeout=args.timeout)
    except ConfigError as exc:  # a key no HTTP header carries, named by where it is read
        raise ConfigError(f"${args.api_key_env}: {exc}", "api_key_env") from exc
    try:
        with client:
            yield client
    except AuthenticationError as exc:
        where = (f"${args.api_key_env} is not set" if key is None else
                 f"the key in ${args.api_key_env} was refused")
        raise type(exc)(f"{exc} ({where}: put a key of write scope there, or name another "
                        "variable with --api-key-env)") from exc
    except WriteTimeoutError as exc:
        raise WriteTimeoutError(f"{exc} (--timeout); running the command again is safe too: "
                                "documents upserted again replace themselves, ids deleted "
                                "again are no-ops", exc.request_id) from exc
