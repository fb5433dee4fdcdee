"""Feature views: the declared schema of a group of per-document features.

A view names its entity column (the document id), its features (name, dtype, default,
description), the optional timestamp column used for staleness and the maximum age after which
a value is reported stale. Views are pydantic models (``extra="forbid"``: a typo in a JSON view
file is an error) and travel with every snapshot, so a reader needs only the view's name.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from retrieval.features.errors import FeatureConfigError
from retrieval.strict import problems

FeatureDtype = Literal["float32", "float64", "int64", "bool"]
FORMAT_VERSION = 1

# Little-endian on disk and on the wire, whatever the host: snapshots are portable.
WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "bool": np.dtype("|b1"),
}

# View names go into Redis keys inside a Cluster hash tag and into directory names: no braces,
# no slashes, no glob characters.
VIEW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Feature names become Redis hash fields joined by "," and file names: keep them identifiers.
FEATURE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


class Feature(BaseModel):
    """One precomputed feature; ``default`` is served for missing entities and null values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=FEATURE_NAME.pattern)
    dtype: FeatureDtype = "float32"
    default: bool | int | float = 0
    description: str = ""

    @model_validator(mode="after")
    def _default_fits_dtype(self) -> Feature:
        value = self.default
        if self.dtype == "bool":
            ok = isinstance(value, bool)
        elif self.dtype == "int64":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
        if not ok:
            raise ValueError(
                f"feature {self.name!r}: default {value!r} does not fit dtype {self.dtype} "
                "(bool needs true/false, int64 an integer, floats a finite number)"
            )
        return self

    @property
    def numpy_dtype(self) -> np.dtype:
        return WIRE_DTYPES[self.dtype].newbyteorder("=")


class FeatureView(BaseModel):
    """A named group of features keyed by document id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=VIEW_NAME.pattern)
    entity_key: str = Field("doc_id", min_length=1, description="source column of document ids")
    features: tuple[Feature, ...] = Field(min_length=1)
    timestamp_field: str = Field(
        "event_time",
        min_length=1,
        description="optional source column (epoch seconds, ISO-8601 or timestamp); when the "
        "source lacks it, or a value is null, the materialization time is used",
    )
    max_age_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="older values are reported stale"
    )
    description: str = ""

    @model_validator(mode="after")
    def _distinct_columns(self) -> FeatureView:
        names = [feature.name for feature in self.features]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"view {self.name!r}: duplicate feature names {duplicates}")
        for reserved in (self.entity_key, self.timestamp_field):
            if reserved in names:
                raise ValueError(
                    f"view {self.name!r}: feature {reserved!r} collides with the entity key or "
                    "timestamp column; rename the feature"
                )
        if self.entity_key == self.timestamp_field:
            raise ValueError(f"view {self.name!r}: entity_key and timestamp_field are equal")
        return self

    @property
    def feature_names(self) -> list[str]:
        return [feature.name for feature in self.features]

    def feature(self, name: str) -> Feature:
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(name)

    def defaults(self) -> dict[str, bool | int | float]:
        return {feature.name: feature.default for feature in self.features}


class SnapshotMeta(BaseModel):
    """What a snapshot was written from: stored next to its data in every store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    snapshot_id: str
    view: FeatureView
    created_at: float = Field(description="materialization start, epoch seconds")
    rows: int = Field(0, ge=0)
    has_event_time: bool = False


def load_view(path: str | Path) -> FeatureView:
    """Read a ``FeatureView`` from a JSON file; errors name the file and the bad setting."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise FeatureConfigError(f"cannot read view file {str(file)!r}: {exc}") from exc
    try:
        return FeatureView.model_validate_json(text)
    except ValidationError as exc:
        raise FeatureConfigError(f"view file {str(file)!r} is invalid: {problems(exc)}; write the "
                                 "view as JSON (`retrieval features materialize --help` shows "
                                 "one)") from exc
