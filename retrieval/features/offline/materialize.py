"""``materialize``: the nightly batch job that publishes a new snapshot of a feature view.

The source is streamed in chunks, each checked against the view and written to a new snapshot
that readers cannot see; only when every row is written is the live pointer flipped. Any error
(a bad row half-way, a duplicate id, a store failure, Ctrl-C) aborts the snapshot and leaves the
previous one live. Timestamps: each row's ``view.timestamp_field`` value when the source has
that column, else (and for null values) the materialization start time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from tqdm import tqdm

from retrieval.features.errors import FeatureConfigError, FeatureSourceError
from retrieval.features.offline.convert import to_columns
from retrieval.features.offline.sources import CallableSource, FeatureSource, open_source
from retrieval.features.offline.writers import open_writer
from retrieval.features.reads import FeatureColumns
from retrieval.features.store import OnlineStore
from retrieval.features.view import FeatureView

DEFAULT_BATCH_ROWS = 50_000


class MaterializeReport(BaseModel):
    """What one materialization published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    view: str
    snapshot_id: str
    rows: int
    seconds: float
    rows_per_s: float
    store: str
    deleted_snapshots: list[str]


def as_source(source: FeatureSource | str | Path | Callable[[], Any]) -> FeatureSource:
    """A ``FeatureSource`` for a source object, a file path, or a callable."""
    if isinstance(source, FeatureSource):
        return source
    if isinstance(source, str | Path):
        return open_source(source)
    if callable(source):
        return CallableSource(source)
    raise FeatureSourceError(f"cannot use {type(source).__name__} as a feature source")


def iter_columns(view: FeatureView, source: FeatureSource, batch_rows: int, created_at: float
                 ) -> Iterator[FeatureColumns]:
    """Validated chunks; whether rows carry timestamps is decided by the first chunk."""
    first_row = 0
    with_event_time: bool | None = None
    for table in source.tables(view, batch_rows):
        if with_event_time is None:
            with_event_time = view.timestamp_field in table.schema.names
        if table.num_rows == 0:
            continue
        yield to_columns(view, table, source.name, first_row, with_event_time, created_at)
        first_row += table.num_rows


def materialize(
    view: FeatureView,
    source: FeatureSource | str | Path | Callable[[], Any],
    store: OnlineStore,
    *,
    progress: bool = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> MaterializeReport:
    """Write ``source`` as a new snapshot of ``view`` into ``store`` and publish it."""
    if batch_rows < 1:
        raise FeatureConfigError(f"batch_rows must be >= 1, got {batch_rows}")
    feature_source = as_source(source)
    started = time.perf_counter()
    created_at = time.time()
    chunks = iter_columns(view, feature_source, batch_rows, created_at)
    first = next(chunks, None)  # checks the columns before anything is written
    if first is None:
        raise FeatureSourceError(
            f"source {feature_source.name} has no rows; refusing to publish an empty snapshot "
            f"of view {view.name!r} (it would reset every document to its defaults)"
        )
    writer = open_writer(store, view, created_at=created_at,
                         has_event_time=first.event_time is not None)
    bar = tqdm(total=feature_source.num_rows(), unit="rows", unit_scale=True,
               desc=f"materialize {view.name}", disable=not progress)
    rows = 0
    try:
        with bar:
            for chunk in _chain(first, chunks):
                writer.write(chunk)
                rows += len(chunk)
                bar.update(len(chunk))
            deleted = writer.commit()
    except BaseException:
        writer.abort()
        raise
    seconds = time.perf_counter() - started
    return MaterializeReport(
        view=view.name, snapshot_id=writer.snapshot_id, rows=rows, seconds=round(seconds, 3),
        rows_per_s=round(rows / seconds, 1) if seconds > 0 else float(rows),
        store=store.describe(), deleted_snapshots=deleted,
    )


def _chain(first: FeatureColumns, rest: Iterator[FeatureColumns]) -> Iterator[FeatureColumns]:
    yield first
    yield from rest
