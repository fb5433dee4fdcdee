"""``retrieval search``: one query against an index; hits, timings and filter hints."""

from __future__ import annotations

import argparse
import sys

from retrieval.cli.common import FILTER_HELP, Subparsers, add_parser, parse_filter_arg
from retrieval.config import RetrieverConfig
from retrieval.models import Explanation, SearchResult
from retrieval.retriever import Retriever


def register(subparsers: Subparsers) -> None:
    search = add_parser(subparsers, "search", "search an index and print hits and timings",
                        epilog="retrieval describe INDEX lists the fields and values to filter on.")
    search.add_argument("index", help="index root or build directory")
    search.add_argument("query")
    search.add_argument("--filter", default=None, help=FILTER_HELP)
    search.add_argument("--k", type=int, default=10)
    search.add_argument("--candidates", type=int, default=300)
    search.add_argument("--group-by", choices=["document"], default=None,
                        help="one hit per document (passage builds): its best passage")
    search.add_argument("--context", type=int, default=0,
                        help="neighbouring passages returned around each hit")
    search.add_argument("--json", action="store_true", help="print the result as JSON")
    search.add_argument("--explain", action="store_true",
                        help="why each hit ranked there: BM25 by term, cosine, its rank in "
                        "each leg, the fusion's normalization")
    search.add_argument("--min-score", type=float, default=None,
                        help="keep only hits whose relevance (calibrated probability that a "
                        "hit is relevant, 0 to 1) is at least this")
    search.add_argument("--encoder", default="onnx-int8",
                        choices=["onnx-int8", "onnx", "torch", "distilled"],
                        help="query encoder backend (distilled: the index's own, trained by "
                        "`retrieval distill`, else the shipped generic one)")
    search.set_defaults(func=run_search)


def run_search(args: argparse.Namespace) -> int:
    retriever = Retriever.load(args.index, RetrieverConfig(candidates=args.candidates,
                                                           encoder_backend=args.encoder))
    filters = parse_filter_arg(args.filter)
    result = retriever.search(args.query, filters=filters, k=args.k, group_by=args.group_by,
                              context=args.context, explain=args.explain,
                              min_score=args.min_score)
    for warning in result.warnings:  # stderr: --json output stays parseable
        print(f"note: {warning}", file=sys.stderr)
    for word, term in result.corrections.items():
        print(f"note: no document holds {word!r}; searched as {term!r} (typo tolerance)",
              file=sys.stderr)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        _print_hits(result)
    retriever.close()
    return 0


def describe(why: Explanation) -> str:
    terms = ", ".join(f"{t} {p:.3f}" for t, p in sorted(why.bm25_terms.items(),
                                                          key=lambda item: -item[1]))
    bounds = ", ".join(f"{k}={v:.3f}" for k, v in why.normalization.items())
    return (f"bm25 {why.bm25:.3f} (#{why.bm25_rank}; {terms or 'no term matched'}), "
            f"cos {why.vector:.3f} (#{why.vector_rank}) of {why.candidates} candidates; "
            f"{why.fusion} fusion, vector weight {why.vector_weight} ({bounds}); fused "
            f"{why.fused:.4f}, features {why.features:+.4f}; keyword coverage "
            f"{why.coverage:.3f}")


def escaped(text: str) -> str:
    """``text`` with each character a terminal would act on (a line end, a tab, an escape
    sequence's ESC) written as its Python escape: a hit printed its newlines as new lines and
    its ANSI escapes reached the terminal. Letters of every script stay as they are."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(text: str) -> str:
    """A title or text for the one line of its hit: runs of white space as one space."""
    return escaped(" ".join(text.split()))


def _print_hits(result: SearchResult) -> None:
    for rank, hit in enumerate(result.hits, start=1):
        where = f"#{hit.passage}[{hit.start}:{hit.end}]" if hit.passage is not None else ""
        relevance = f"  relevance={hit.relevance:.2f}" if hit.relevance is not None else ""
        snippet = one_line(hit.title[:70] or hit.text[:70])
        print(f"{rank:>3}. {escaped(hit.doc_id)}{where}  score={hit.score:.4f}  "
              f"bm25={hit.bm25_score:.3f}  cos={hit.vector_score:.3f}{relevance}  {snippet}")
        if hit.explanation is not None:
            print("     " + describe(hit.explanation))
    if not result.hits:
        print("no hits")
    timings = "  ".join(f"{k}={v:.3f}" for k, v in result.timings.items())
    encoder = f"; query encoder {result.query_encoder}" if result.query_encoder else ""
    print(f"build {result.build_id}; allowed {result.allowed}; candidates {result.candidates}"
          f"{encoder}")
    print(f"timings ms: {timings}")
