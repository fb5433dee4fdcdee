"""Safe publishing: a gated publish, rollback, the builds listing and the diff of two builds."""

from indexes.history import FlipRecord
from indexes.publish import (
    BuildInfo,
    NoRollbackTargetError,
    PublishError,
    UnknownBuildError,
)
from retrieval.publishing.api import PublishOutcome, builds, check, diff, publish, rollback
from retrieval.publishing.config import GateConfig, GateConfigError, load_gate
from retrieval.publishing.report import Check, GateReport

__all__ = [
    "BuildInfo",
    "Check",
    "FlipRecord",
    "GateConfig",
    "GateConfigError",
    "GateReport",
    "NoRollbackTargetError",
    "PublishError",
    "PublishOutcome",
    "UnknownBuildError",
    "builds",
    "check",
    "diff",
    "load_gate",
    "publish",
    "rollback",
]
