"""``retrieval features ...`` subcommands (hooked into ``retrieval.cli`` by its owner)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from indexes.errors import RetrievalError
from retrieval.features.config import FeatureStoreConfig, make_store
from retrieval.features.errors import FeatureConfigError
from retrieval.features.offline.materialize import materialize
from retrieval.features.redis_store import DEFAULT_SLOT_MOVE_WAIT_SECONDS
from retrieval.features.store import DEFAULT_GRACE_SECONDS
from retrieval.features.view import FeatureView, load_view


def add_features_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``features materialize`` to an ``add_subparsers()`` object; returns the parser."""
    features = subparsers.add_parser("features", help="feature store: materialize views")
    commands = features.add_subparsers(dest="features_command", required=True)
    run = commands.add_parser(
        "materialize",
        help="publish a new snapshot of a feature view from a Parquet/CSV/JSONL file",
    )
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--view", help="view name: reuse the schema of its live snapshot")
    which.add_argument("--view-file", help="JSON file with the FeatureView definition")
    run.add_argument("--source", required=True, help=".parquet, .csv or .jsonl file")
    run.add_argument("--store", required=True,
                     help="redis://host:port/0 or rediss://... (RedisStore), else a directory")
    run.add_argument("--cluster", action="store_true", help="the Redis URL is a Cluster")
    run.add_argument("--namespace", default="retrieval", help="Redis key namespace")
    run.add_argument("--grace-seconds", type=float, default=DEFAULT_GRACE_SECONDS,
                     help="keep retired snapshots this long (the previous one is always kept)")
    run.add_argument("--slot-move-wait-seconds", type=float,
                     default=DEFAULT_SLOT_MOVE_WAIT_SECONDS,
                     help="Cluster: wait this long for a reshard moving the view's slot to end "
                     "before failing (the previous snapshot stays live)")
    run.add_argument("--batch-rows", type=int, default=50_000)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=run_materialize)
    return features


def _view(args: argparse.Namespace, store: Any) -> FeatureView:
    if args.view_file:
        return load_view(args.view_file)
    view = store.live_view(args.view)
    if view is None:
        raise FeatureConfigError(
            f"view {args.view!r} has no live snapshot in {store.describe()} to take its schema "
            "from; pass --view-file the first time"
        )
    return view


def run_materialize(args: argparse.Namespace) -> int:
    """Materialize one view; prints rows and rows/s. Errors propagate as ``RetrievalError``."""
    if args.batch_rows < 1:
        raise FeatureConfigError(f"--batch-rows: must be at least 1, not {args.batch_rows}")
    try:
        config = FeatureStoreConfig(location=args.store, cluster=args.cluster,
                                    namespace=args.namespace, grace_seconds=args.grace_seconds,
                                    slot_move_wait_seconds=args.slot_move_wait_seconds)
    except ValidationError as exc:
        raise FeatureConfigError(_flag_problems(exc)) from exc
    with make_store(config) as store:
        view = _view(args, store)
        report = materialize(view, args.source, store, progress=not args.no_progress,
                             batch_rows=args.batch_rows)
    deleted = f"; deleted {', '.join(report.deleted_snapshots)}" if report.deleted_snapshots \
        else ""
    print(f"materialized view {report.view}: snapshot {report.snapshot_id}, {report.rows} rows "
          f"in {report.seconds:.2f} s ({report.rows_per_s:,.0f} rows/s) into {report.store}"
          f"{deleted}", file=sys.stdout)
    return 0


FLAGS = {"location": "--store", "cluster": "--cluster", "namespace": "--namespace",
         "grace_seconds": "--grace-seconds", "slot_move_wait_seconds": "--slot-move-wait-seconds"}


def _flag_problems(exc: ValidationError) -> str:
    """Each refused setting named by its flag, on one line (pydantic's took several, and every
    one was blamed on --store/--cluster/--namespace, --grace-seconds's too). Written here, not
    taken from ``retrieval.cli``: the nightly job imports nothing of the serving side."""
    said = []
    for error in exc.errors(include_url=False):
        where = error.get("loc") or ("location",)  # a check of the whole config: the URL's
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        said.append(f"{FLAGS.get(str(where[0]), '--store')}: {message}")
    return "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m retrieval.features.offline.cli materialize ...``)."""
    root = argparse.ArgumentParser(prog="retrieval")
    add_features_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(["features", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args))
    except RetrievalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
