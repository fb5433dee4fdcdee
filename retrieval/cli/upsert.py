"""``retrieval upsert``: add or replace documents of a live index through its write-ahead log."""

from __future__ import annotations

import argparse
from pathlib import Path

from indexes.corpus import read_corpus
from indexes.encoders import SentenceTransformerEncoder
from indexes.errors import CorpusError
from indexes.writer import IndexWriter
from retrieval.cli.common import Subparsers, add_mapping_flags, add_parser, mapping_of
from retrieval.cli.remote import add_remote_flags, remote_writer
from retrieval.errors import ConfigError

EPILOG = """The corpus has the format of `retrieval build` (a BEIR folder or a JSONL file, one
document per line with _id, text, optional title and metadata). All its documents are one
write: validated first, then appended, fsynced and acknowledged together; serving processes
see it within their live_lag_seconds. Unchanged texts reuse their stored vectors; new ones are
encoded with the index's model.

With --url the documents go to a running `retrieval serve` instead (a key of write scope in
the environment variable --api-key-env names), in requests of --batch documents: each is one
acknowledged write, retried with its request id on a connection error, and the server embeds
the texts, so no model loads here."""


def register(subparsers: Subparsers) -> None:
    upsert = add_parser(subparsers, "upsert", "add or replace documents of a live index", EPILOG)
    upsert.add_argument("index", nargs="?", help="index root (not with --url)")
    upsert.add_argument("--corpus", required=True, help="a corpus as `retrieval build` reads "
                        "it (JSONL, CSV, Parquet, a folder of files)")
    add_mapping_flags(upsert)
    add_remote_flags(upsert)
    upsert.add_argument("--model", default=None, help="the index's sentence-transformers "
                        "model directory (default: the shipped one)")
    upsert.set_defaults(func=run_upsert)


def run_upsert(args: argparse.Namespace) -> int:
    # read and checked before any write
    documents = list(read_corpus(Path(args.corpus), mapping_of(args)))
    if not documents:  # as the writer refuses it: a remote upsert of nothing exited 0 in silence
        raise CorpusError(f"{args.corpus} holds no documents to upsert: give at least one")
    if args.url:
        with remote_writer(args) as client:
            for start in range(0, len(documents), args.batch):
                batch = documents[start:start + args.batch]
                ack = client.upsert(batch)
                print(f"acknowledged seq {ack.seq}: {len(batch)} documents upserted"
                      + (" (a retry: logged once)" if ack.replayed else ""))
        return 0
    encoder = SentenceTransformerEncoder(args.model) if args.model else None
    if args.index is None:
        raise ConfigError("give the INDEX root, or --url of a running server", "index")
    with IndexWriter(args.index, encoder) as writer:
        seq = writer.upsert(documents)
    print(f"acknowledged seq {seq}: {len(documents)} documents upserted")
    return 0
