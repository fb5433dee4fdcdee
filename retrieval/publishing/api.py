"""Publishing safely, as Python calls: gated publish, rollback, builds listing, diff."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from indexes.encoders import Encoder
from indexes.history import FlipRecord, How, live_build_id
from indexes.publish import BuildInfo, build_dir, list_builds, publish_build
from indexes.publish import rollback as rollback_flip
from retrieval.config import RetrieverConfig
from retrieval.publishing.config import GateConfig, GateConfigError, load_gate
from retrieval.publishing.gate import compare_builds
from retrieval.publishing.report import GateReport

GateLike = GateConfig | Mapping[str, Any] | str | Path | None


@dataclass(frozen=True)
class PublishOutcome:
    """What ``publish`` did: ``published`` False means the build stays staged."""

    build_id: str
    published: bool
    report: GateReport
    record: FlipRecord | None  # the flip, with ``how``: gate / forced

    @property
    def how(self) -> How | None:
        return self.record.how if self.record is not None else None


def resolve_gate(gate: GateLike, *, allow_encoder_change: bool = False,
                 allow_analyzer_change: bool = False) -> GateConfig:
    """A ``GateConfig`` from a file path, a mapping of its settings or an object (defaults
    when None), with the command-line permissions added (they only ever allow more)."""
    if isinstance(gate, Mapping):  # a dict was a TypeError from deep inside
        try:
            gate = GateConfig.model_validate(dict(gate))
        except ValidationError as exc:
            raise GateConfigError(f"gate settings are invalid: {exc}") from exc
    config = gate if isinstance(gate, GateConfig) else (
        load_gate(gate) if gate is not None else GateConfig())
    updates = {name: True for name, flag in (("allow_encoder_change", allow_encoder_change),
                                             ("allow_analyzer_change", allow_analyzer_change))
               if flag}
    return config.model_copy(update=updates)


def check(root: str | Path, build_id: str, gate: GateLike = None, *,
          allow_encoder_change: bool = False, allow_analyzer_change: bool = False,
          encoder: Encoder | None = None,
          config: RetrieverConfig | dict[str, Any] | None = None) -> GateReport:
    """The gate's report of ``build_id`` against the live build, without publishing."""
    root = Path(root)
    live = live_build_id(root)
    return compare_builds(build_dir(root, live) if live else None, build_dir(root, build_id),
                          resolve_gate(gate, allow_encoder_change=allow_encoder_change,
                                       allow_analyzer_change=allow_analyzer_change),
                          encoder=encoder, config=config)


def publish(root: str | Path, build_id: str, gate: GateLike = None, *, force: bool = False,
            allow_encoder_change: bool = False, allow_analyzer_change: bool = False,
            encoder: Encoder | None = None,
            config: RetrieverConfig | dict[str, Any] | None = None) -> PublishOutcome:
    """Make ``build_id`` live if the gate passes (defaults: structural checks only).

    A refused build stays staged and the live one keeps serving; ``force`` publishes anyway
    and records ``forced`` with the refusing checks in the history. A build that went live
    while the gate ran (a compaction, another publish) is not replaced unchecked:
    ``LiveBuildChangedError``, and publishing again checks against it.
    """
    checked_against = live_build_id(Path(root))  # another build live by then: refused
    report = check(root, build_id, gate, allow_encoder_change=allow_encoder_change,
                   allow_analyzer_change=allow_analyzer_change, encoder=encoder, config=config)
    if report.passed:
        record = publish_build(Path(root), build_id, "gate", replaces=checked_against)
    elif force:
        refused = ", ".join(c.name for c in report.refused)
        record = publish_build(Path(root), build_id, "forced", note=f"refused by: {refused}",
                               replaces=checked_against)
    else:
        return PublishOutcome(build_id, False, report, None)
    return PublishOutcome(build_id, True, report, record)


def rollback(root: str | Path, to: str | None = None) -> FlipRecord:
    """Flip ``CURRENT`` back to the previously live build (or ``to``); ungated: it is the
    emergency exit, and the target already served."""
    return rollback_flip(Path(root), to)


def builds(root: str | Path) -> list[BuildInfo]:
    """Every build under ``root``, newest first, with live / rollback target / staged."""
    return list_builds(Path(root))


def diff(root: str | Path, a: str, b: str, gate: GateLike = None, *,
         allow_encoder_change: bool = False, allow_analyzer_change: bool = False,
         encoder: Encoder | None = None,
         config: RetrieverConfig | dict[str, Any] | None = None) -> GateReport:
    """The gate's comparison of build ``b`` against build ``a`` (``a`` playing the live one)."""
    root = Path(root)
    return compare_builds(build_dir(root, a), build_dir(root, b),
                          resolve_gate(gate, allow_encoder_change=allow_encoder_change,
                                       allow_analyzer_change=allow_analyzer_change),
                          encoder=encoder, config=config)
