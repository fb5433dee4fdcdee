"""``retrieval delete``: delete documents of a live index through its write-ahead log."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.errors import CorpusError
from indexes.writer import IndexWriter
from retrieval.cli.common import Subparsers, add_parser
from retrieval.cli.remote import add_remote_flags, remote_writer
from retrieval.errors import ConfigError


def register(subparsers: Subparsers) -> None:
    delete = add_parser(subparsers, "delete", "delete documents of a live index by id",
                        "IDS is a text file with one document id per line (blank lines are "
                        "skipped); all of them are one acknowledged write (with --url: one "
                        "per --batch ids, sent to a running `retrieval serve`).")
    delete.add_argument("index", nargs="?", help="index root (not with --url)")
    delete.add_argument("--ids", required=True, help="file of document ids, one per line")
    add_remote_flags(delete)
    delete.set_defaults(func=run_delete)


ABSENT = " (ids the index lacks are no-ops)"


def run_delete(args: argparse.Namespace) -> int:
    try:
        # utf-8-sig: a Windows editor's byte order mark made the first id "\ufeff1", which
        # was acknowledged as deleted while document 1 stayed
        lines = Path(args.ids).read_text(encoding="utf-8-sig").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"cannot read ids from {args.ids}: {exc}") from exc
    # Each line's id as written (an id may hold spaces, tabs and other line breaks than
    # "\n", as upserts keep them), less a Windows line end; blank lines skipped.
    ids = [line.removesuffix("\r") for line in lines if line.strip()]
    if not ids:  # as the writer refuses it: a remote delete of nothing exited 0 in silence
        raise CorpusError(f"{args.ids} holds no ids to delete: give one document id per line")
    if sum(i.startswith("{") for i in ids) * 2 > len(ids):
        raise CorpusError(f"{args.ids} holds JSON objects, not ids: --ids takes one document "
                          "id per line (a corpus file's ids: `jq -r ._id FILE`)")
    if args.url:
        with remote_writer(args) as client:
            for start in range(0, len(ids), args.batch):
                ack = client.delete(ids[start:start + args.batch])
                print(f"acknowledged seq {ack.seq}: {len(ids[start:start + args.batch])} ids "
                      f"deleted{ABSENT}")
        return 0
    if args.index is None:
        raise ConfigError("give the INDEX root, or --url of a running server", "index")
    with IndexWriter(args.index) as writer:
        seq = writer.delete(ids)
    print(f"acknowledged seq {seq}: {len(ids)} ids deleted{ABSENT}")
    return 0
