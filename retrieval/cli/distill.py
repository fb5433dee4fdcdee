"""``retrieval distill``: train a distilled query encoder on an index's own passages."""

from __future__ import annotations

import argparse
from pathlib import Path

from retrieval.cli.common import Subparsers, add_parser, positive_int


def register(subparsers: Subparsers) -> None:
    command = add_parser(subparsers, "distill",
                         "train a fast static query encoder in MiniLM's vector space on the "
                         "index's passages and store it beside its builds (ROOT/distilled); "
                         "search with it by encoder_backend=distilled",
                         epilog="With --data, FOLDER holds queries.jsonl and qrels/QRELS (BEIR "
                         "format): nDCG@10 and recall@100 with the distilled and with the INT8 "
                         "MiniLM query encoder are measured and stored with it.")
    command.add_argument("index", help="index root")
    command.add_argument("--data", type=Path, metavar="FOLDER",
                         help="judged queries to measure the encoder on")
    command.add_argument("--qrels", default="test.tsv", help="file under FOLDER/qrels/")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--texts", type=positive_int, default=None,
                         help="query-like training texts cut from the passages (default "
                         "40,000)")
    command.set_defaults(func=run_distill)


def run_distill(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from indexes.corpus import read_qrels, read_queries
    from indexes.distill import DistillSettings
    from retrieval.distill import distill_index

    settings = replace(DistillSettings(), seed=args.seed)
    if args.texts is not None:
        settings = replace(settings, texts=args.texts)
    judged = None
    if args.data is not None:
        judged = (args.data.name, read_queries(args.data / "queries.jsonl"),
                  read_qrels(args.data / "qrels" / args.qrels))
    encoder, path = distill_index(args.index, settings, judged=judged)
    quality = encoder.info.quality
    print(f"wrote {path} ({encoder.encoder_id}) in {encoder.info.training['seconds']:.0f} s; "
          f"held-out cosine to the teacher {quality['held_out_cosine']:.3f}")
    for collection, judged_figures in quality.get("judged", {}).items():
        print(f"on {collection}'s {judged_figures['queries']} judged queries:")
        for name in ("reference", "distilled"):
            figures = judged_figures[name]
            print(f"  {name:<10} {figures['encoder']:<44} nDCG@10 {figures['ndcg@10']:.4f}  "
                  f"recall@100 {figures['recall@100']:.4f}")
    return 0
