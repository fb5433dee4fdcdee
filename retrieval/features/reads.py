"""The data that flows in and out of online stores: written columns and read batches."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.features.errors import FeatureRequestError
from retrieval.features.view import FeatureView


class FeatureStatus(enum.IntEnum):
    """Per-entity outcome of a read (stored as int8 in ``FeatureBatch.status``)."""

    PRESENT = 0  # found, and not older than the view's max age
    STALE = 1  # found, but older than max_age_seconds: the value is still served
    MISSING = 2  # not in the live snapshot (or the store is unavailable): defaults served


@dataclass(frozen=True)
class FeatureColumns:
    """One chunk of validated source rows, ready for a store writer.

    ``values[name]`` has the feature's dtype and ``len(entity_ids)`` rows; ``event_time`` holds
    float64 epoch seconds (None when the source has no timestamp column).
    """

    entity_ids: list[str]
    values: dict[str, np.ndarray]
    event_time: np.ndarray | None

    def __len__(self) -> int:
        return len(self.entity_ids)


@dataclass(frozen=True)
class FeatureBatch:
    """Features of the requested entities, in input order.

    ``values[name]``: shape ``(n,)``, the feature's dtype, defaults filled in for missing
    entities. ``status``: int8 ``FeatureStatus`` per entity. ``event_time``: float64 epoch
    seconds the value was computed at (NaN when missing). ``snapshot_id``: the one snapshot every
    value came from (None when there is none or the store was unavailable). ``available`` is
    False when the store could not be read; every entity is then MISSING with defaults.
    """

    view: str
    entity_ids: tuple[str, ...]
    values: dict[str, np.ndarray]
    status: np.ndarray
    event_time: np.ndarray
    defaults: dict[str, bool | int | float]
    snapshot_id: str | None
    available: bool

    def __len__(self) -> int:
        return len(self.entity_ids)

    def mask(self, status: FeatureStatus) -> np.ndarray:
        """Boolean mask of the entities with ``status``."""
        return np.asarray(self.status == int(status))

    @property
    def found(self) -> np.ndarray:
        """Entities served from the snapshot (present or stale)."""
        return np.asarray(self.status != int(FeatureStatus.MISSING))

    def row(self, index: int) -> dict[str, bool | int | float]:
        """The features of one entity as Python values of the view's dtypes (``Hit.features``):
        int64 stays an exact int, bool a bool, floats a float."""
        return {name: column[index].item() for name, column in self.values.items()}


def check_entity_ids(entity_ids: Sequence[str], limit: int) -> tuple[str, ...]:
    """``entity_ids`` as a tuple of str, or ``FeatureRequestError`` (a caller bug)."""
    if isinstance(entity_ids, str | bytes):
        raise FeatureRequestError("entity_ids must be a sequence of str, not a single string")
    ids = tuple(entity_ids)
    if len(ids) > limit:
        raise FeatureRequestError(
            f"{len(ids)} entity ids in one read, more than the limit {limit}; "
            "read fewer candidates or raise max_entities_per_read"
        )
    for entity_id in ids:
        if not isinstance(entity_id, str):
            raise FeatureRequestError(
                f"entity ids must be str, got {type(entity_id).__name__} {entity_id!r}"
            )
    return ids


def default_columns(view: FeatureView | None, n: int) -> dict[str, np.ndarray]:
    """Columns of ``n`` defaults for ``view`` ({} when the schema is unknown)."""
    if view is None:
        return {}
    return {f.name: np.full(n, f.default, dtype=f.numpy_dtype) for f in view.features}


def unavailable_batch(
    view_name: str, ids: tuple[str, ...], view: FeatureView | None, snapshot_id: str | None = None,
    available: bool = False,
) -> FeatureBatch:
    """Every entity MISSING with defaults: the store was unreachable or the view has no data."""
    n = len(ids)
    return FeatureBatch(
        view=view_name,
        entity_ids=ids,
        values=default_columns(view, n),
        status=np.full(n, FeatureStatus.MISSING, dtype=np.int8),
        event_time=np.full(n, np.nan),
        defaults=view.defaults() if view is not None else {},
        snapshot_id=snapshot_id,
        available=available,
    )


def assemble_batch(
    view: FeatureView,
    ids: tuple[str, ...],
    found: np.ndarray,
    values: dict[str, np.ndarray],
    event_time: np.ndarray,
    snapshot_id: str,
    now: float,
) -> FeatureBatch:
    """Fill defaults where not ``found`` and classify present / stale / missing.

    ``values`` and ``event_time`` hold garbage where ``found`` is False; they are overwritten.
    """
    out: dict[str, np.ndarray] = {}
    for feature in view.features:
        column = np.asarray(values[feature.name], dtype=feature.numpy_dtype)
        out[feature.name] = np.where(found, column, np.asarray(feature.default, column.dtype))
    times = np.where(found, event_time, np.nan)
    status = np.full(len(ids), FeatureStatus.MISSING, dtype=np.int8)
    status[found] = FeatureStatus.PRESENT
    if view.max_age_seconds is not None:
        stale = found & (now - times > view.max_age_seconds)
        status[stale] = FeatureStatus.STALE
    return FeatureBatch(
        view=view.name, entity_ids=ids, values=out, status=status, event_time=times,
        defaults=view.defaults(), snapshot_id=snapshot_id, available=True,
    )
