"""The publish gate's file: thresholds, canary queries and a labeled query log.

A gate file is JSON or TOML, validated strictly (a misspelt key is an error)::

    max_doc_drop = 0.10          # refuse losing more than 10% of the live build's documents
    canaries = "canaries.jsonl"  # {"query": "...", "expected": ["doc-id", ...]} per line
    min_canary_overlap = 0.7     # mean overlap@10 between live and candidate
    labeled_log = "labeled.jsonl"  # {"query": "...", "relevant": {"doc-id": 1}} per line
    max_ndcg_drop = 0.02         # absolute nDCG@10 drop allowed

Relative paths are read from the gate file's directory.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from retrieval.errors import ConfigError
from retrieval.strict import config_error, problems

T = TypeVar("T", bound=BaseModel)


class GateConfigError(ConfigError):
    """A gate file, canary file or labeled log is missing or malformed."""


class GateConfig(BaseModel):
    """Thresholds of the publish gate. Defaults: structural checks only (no searches)."""

    model_config = ConfigDict(extra="forbid")

    max_doc_drop: float = Field(0.10, ge=0.0, le=1.0,
                                description="largest allowed drop, fraction of live documents")
    max_doc_growth: float | None = Field(None, ge=0.0,
                                         description="largest allowed growth; None = any")
    max_changed: float | None = Field(
        None, ge=0.0, le=1.0,
        description="largest fraction of live documents removed or changed (content hash)")
    allow_metadata_loss: bool = False
    allow_encoder_change: bool = False
    allow_analyzer_change: bool = Field(
        False, description="analyzer (stemmer, stopwords...) or BM25 parameters may change")
    k: int = Field(10, ge=1, le=100, description="depth of overlap, recall and nDCG")
    canaries: str | None = Field(None, description="JSONL of canary queries")
    min_canary_overlap: float = Field(0.7, ge=0.0, le=1.0, description="mean overlap@k")
    min_canary_overlap_each: float = Field(0.0, ge=0.0, le=1.0,
                                           description="overlap@k every canary must reach")
    min_expected_recall: float = Field(1.0, ge=0.0, le=1.0,
                                       description="mean recall@k of canaries' expected ids")
    labeled_log: str | None = Field(None, description="JSONL of queries with relevant ids")
    max_ndcg_drop: float = Field(0.02, ge=0.0, le=1.0, description="absolute nDCG@k drop")


class Canary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    expected: list[str] = Field(default_factory=list)


class LabeledQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    relevant: dict[str, int] = Field(min_length=1, description="doc id -> graded relevance")


def load_gate(path: str | Path) -> GateConfig:
    """A ``GateConfig`` from a .json or .toml file; relative data paths become absolute."""
    path = Path(path)
    raw = _read_gate_file(path)
    try:
        gate = GateConfig.model_validate(raw)
    except ValidationError as exc:  # one line naming each key (pydantic's took several)
        raise GateConfigError(f"gate file {path}: {config_error(GateConfig, exc)}") from exc
    updates = {name: str((path.parent / value).resolve())
               for name in ("canaries", "labeled_log")
               if (value := getattr(gate, name)) is not None}
    return gate.model_copy(update=updates)


def _read_gate_file(path: Path) -> Any:
    if not path.is_file():
        raise GateConfigError(f"gate file {path} does not exist; give a .json or .toml file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix == ".json":
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise GateConfigError(f"gate file {path} holds a {type(raw).__name__}, not an "
                                      'object of settings like {"max_doc_drop": 0.1}')
            return raw
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise GateConfigError(f"gate file {path} cannot be parsed: {exc}") from exc
    raise GateConfigError(f"gate file {path} must end in .json or .toml")


def load_canaries(path: str | Path) -> list[Canary]:
    return _read_jsonl(Path(path), Canary)


def load_labeled_log(path: str | Path) -> list[LabeledQuery]:
    return _read_jsonl(Path(path), LabeledQuery)


def _read_jsonl(path: Path, model: type[T]) -> list[T]:
    if not path.is_file():
        raise GateConfigError(f"{path} does not exist; fix the path in the gate file")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(model.model_validate_json(line))
        except ValidationError as exc:
            raise GateConfigError(f"{path} line {number} is not a valid "
                                  f"{model.__name__}: {problems(exc)}") from exc
    if not rows:
        raise GateConfigError(f"{path} holds no {model.__name__} lines")
    return rows
