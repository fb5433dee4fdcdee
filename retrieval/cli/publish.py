"""``retrieval publish | rollback | builds | diff`` and the gate flags of ``retrieval build``.

Exit codes: 0 done, 1 refused by the gate (the report says why), 2 bad input (``main``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from indexes.build import BuildReport
from indexes.encoders import Encoder
from retrieval.publishing.api import builds, diff, publish, rollback
from retrieval.publishing.config import (
    GateConfig,
    GateConfigError,
    load_canaries,
    load_gate,
    load_labeled_log,
)
from retrieval.publishing.report import GateReport

REFUSED = 1


def gate_file(path: str) -> GateConfig:
    """Read and validate ``--gate`` while parsing, so a bad file fails before a long build."""
    try:
        gate = load_gate(path)
        if gate.canaries:
            load_canaries(gate.canaries)
        if gate.labeled_log:
            load_labeled_log(gate.labeled_log)
        return gate
    except GateConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_gate_flags(parser: argparse.ArgumentParser, *, staging: bool = False) -> None:
    """``--gate``, ``--force``, ``--allow-*-change`` (and ``--no-publish`` for ``build``)."""
    if staging:
        parser.add_argument("--no-publish", action="store_true",
                            help="stage the verified build without making it live")
    parser.add_argument("--gate", default=None, type=gate_file,
                        help="gate file (.json/.toml): thresholds, canaries, labeled log")
    parser.add_argument("--force", action="store_true",
                        help="publish even if the gate refuses (recorded as forced)")
    parser.add_argument("--allow-encoder-change", action="store_true")
    parser.add_argument("--allow-analyzer-change", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the gate report as JSON")


def register(subparsers: Any) -> None:
    """Add publish, rollback, builds and diff to an ``add_subparsers()`` object."""
    run = subparsers.add_parser("publish", help="make a staged or older build live (gated)")
    run.add_argument("index", help="index root")
    run.add_argument("build_id")
    add_gate_flags(run)
    run.set_defaults(func=run_publish)

    back = subparsers.add_parser("rollback", help="flip back to the previously live build")
    back.add_argument("index", help="index root")
    back.add_argument("--to", default=None, help="a build id instead of the previous live one")
    back.set_defaults(func=run_rollback)

    listing = subparsers.add_parser("builds", help="list builds: live, rollback target, staged")
    listing.add_argument("index", help="index root")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=run_builds)

    compare = subparsers.add_parser("diff", help="compare build B against build A (no publish)")
    compare.add_argument("index", help="index root")
    compare.add_argument("a", help="build playing the live one")
    compare.add_argument("b", help="candidate build")
    compare.add_argument("--gate", default=None, type=gate_file,
                         help="gate file: thresholds and searches")
    compare.add_argument("--allow-encoder-change", action="store_true")
    compare.add_argument("--allow-analyzer-change", action="store_true")
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(func=run_diff)


def _print_report(report: GateReport, as_json: bool) -> None:
    print(json.dumps(report.as_dict(), indent=2) if as_json else report.text())


def run_publish(args: argparse.Namespace, encoder: Encoder | None = None) -> int:
    outcome = publish(args.index, args.build_id, args.gate, force=args.force,
                      allow_encoder_change=args.allow_encoder_change,
                      allow_analyzer_change=args.allow_analyzer_change, encoder=encoder)
    _print_report(outcome.report, args.json)
    said = sys.stderr if args.json else sys.stdout  # stdout holds the JSON report alone
    if not outcome.published:
        print(f"refused: build {args.build_id} stays staged; the live build keeps serving "
              "(--force publishes anyway)", file=said)
        return REFUSED
    print(f"published build {args.build_id} ({outcome.how})", file=said)
    return 0


def after_build(args: argparse.Namespace, report: BuildReport, encoder: Encoder) -> int:
    """``retrieval build --no-publish / --gate``: stage, or gate then publish."""
    if args.no_publish:
        print(f"staged build {report.build_id} at {report.path}; publish it with "
              f"`retrieval publish {args.out} {report.build_id}`")
        return 0
    args.index, args.build_id = args.out, report.build_id
    return run_publish(args, encoder)


def run_rollback(args: argparse.Namespace) -> int:
    record = rollback(args.index, args.to)
    print(f"rolled back: {record.build_id} is live again (was {record.previous})")
    return 0


def run_builds(args: argparse.Namespace) -> int:
    rows = builds(args.index)
    if args.json:
        print(json.dumps([vars(r) for r in rows], indent=2))
        return 0
    print(f"{'build id':<34} {'created (UTC)':<20} {'docs':>9} {'MB':>8}  {'status':<16} "
          "encoder")
    for row in rows:
        created = row.created_at[:19] + "Z"  # written as UTC (isoformat with +00:00)
        print(f"{row.build_id:<34} {created:<20} {row.n_docs:>9} "
              f"{row.size_bytes / 1e6:>8.1f}  {row.status:<16} {row.encoder_id}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    report = diff(args.index, args.a, args.b, args.gate,
                  allow_encoder_change=args.allow_encoder_change,
                  allow_analyzer_change=args.allow_analyzer_change)
    _print_report(report, args.json)
    return 0 if report.passed else REFUSED  # a script may run diff as its check
