"""A relevance score comparable across queries: P(a hit is relevant), calibrated on judged queries.

The fused score ranks hits within one query (it is normalized per query: the top hit of any
query scores near 1), so it cannot say whether a corpus holds a good answer at all. The
relevance score can: a logistic model over two pieces of evidence that mean the same on every
query,

- ``vector``: the cosine between query and hit (absolute, in the encoder's space);
- ``coverage``: the hit's BM25 score over the most any document could score for these query
  terms (each term's idf times the saturation bound, ``k1 + 1`` for okapi), in [0, 1];
- ``log_rank``: log of the hit's position (1 = first): with the same evidence a first hit is
  more often relevant than a tenth (a collection holds few answers per question), and without
  it the top hits' estimates were a third of their measured rate on SciFact,

fitted by maximum likelihood (``fit_calibration``) on the top hits of judged queries, labelled
relevant or not by their qrels. A ``Calibration`` is per document model (cosines live in its
space). The one shipped (``relevance_minilm.json``: all-MiniLM-L6-v2, fitted on the shipped
collections' training queries by ``benchmarks.relevance --write-default``) serves every build
of that model; ``retrieval calibrate ROOT`` fits one on an index's own judged queries and
stores it beside its builds (``<root>/relevance.json``), which then wins.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from indexes.bm25 import BM25Index
from indexes.errors import InvalidQueryError
from indexes.manifest import Manifest
from indexes.storage import fsync_write
from retrieval.errors import ConfigError
from retrieval.models import SearchResult
from retrieval.strict import problems

ROOT_FILE = "relevance.json"  # an index's own calibration, beside builds/ and CURRENT
SHIPPED = Path(__file__).with_name("relevance_minilm.json")
FEATURES = ("vector", "coverage", "log_rank")


class Calibration(BaseModel):
    """P(relevant) = sigmoid(intercept + Σ weights[f] * feature f), for one document model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="the document model whose cosines it was fitted on")
    intercept: float = Field(allow_inf_nan=False)
    weights: dict[str, float] = Field(description="feature name -> coefficient")
    fitted_on: dict[str, int] = Field(default_factory=dict,
                                      description="collection -> judged queries used")
    hits_per_query: int = Field(10, description="top hits of each query used as examples")

    @field_validator("weights")
    @classmethod
    def _every_feature_once(cls, weights: dict[str, float]) -> dict[str, float]:
        if sorted(weights) != sorted(FEATURES):
            raise ValueError(f"weights must name exactly {list(FEATURES)}, not "
                             f"{sorted(weights)}")
        if not all(math.isfinite(w) for w in weights.values()):
            raise ValueError(f"weights must be finite numbers, not {weights}")
        return weights

    @property
    def calibration_id(self) -> str:
        """Short identity for cache keys: a refit changes every cached relevance."""
        body = f"{self.model}:{self.intercept!r}:{sorted(self.weights.items())!r}"
        return "rel-" + hashlib.sha256(body.encode()).hexdigest()[:12]

    def score(self, vector: np.ndarray, coverage: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """float64 (n,) probabilities for n hits' cosines, coverages and ranks (1-based)."""
        z = (self.intercept + self.weights["vector"] * np.asarray(vector, dtype=np.float64)
             + self.weights["coverage"] * np.asarray(coverage, dtype=np.float64)
             + self.weights["log_rank"] * np.log(np.asarray(rank, dtype=np.float64)))
        return 1.0 / (1.0 + np.exp(-z))

    def save(self, root: Path) -> Path:
        """Write it beside the root's builds, atomically (temp file, fsync, rename)."""
        path = Path(root) / ROOT_FILE
        fsync_write(path, self.model_dump_json(indent=1).encode())
        return path


def keyword_bound(tokens: Sequence[str], bm25: BM25Index) -> float:
    """The most any one document could score for these BM25 terms: Σ weight × max(idf, 0) ×
    the saturation bound (``k1 + 1`` okapi, 1 lucene), each term's idf as ``bm25`` scores it
    (okapi's floor for a term in more than half the documents included)."""
    params = bm25.params
    saturation = params.k1 + 1 if params.variant == "okapi" else 1.0
    weights = np.array([getattr(token, "weight", 1.0) for token in tokens], dtype=np.float64)
    return float(weights @ np.maximum(bm25.idf(tokens), 0.0)) * saturation


def coverage(bm25: np.ndarray, bound: float) -> np.ndarray:
    """BM25 scores as a share of ``keyword_bound``, clipped to [0, 1]; 0 without terms."""
    if bound <= 0:
        return np.zeros(np.shape(bm25), dtype=np.float64)
    return np.clip(np.asarray(bm25, dtype=np.float64) / bound, 0.0, 1.0)


def fit_calibration(features: np.ndarray, labels: np.ndarray, model: str,
                    fitted_on: dict[str, int] | None = None, hits_per_query: int = 10,
                    l2: float = 1e-3, iterations: int = 50) -> Calibration:
    """Logistic regression by Newton's method (IRLS) with a small L2 penalty (not on the
    intercept): deterministic, no randomness. ``features`` float (n, 3): cosine, coverage,
    rank (1-based; the model takes its log), ``labels`` (n,) 0/1."""
    given = np.asarray(features, dtype=np.float64).reshape(-1, 3)
    x = np.column_stack([np.ones(len(given)), given[:, :2], np.log(given[:, 2])])
    y = np.asarray(labels, dtype=np.float64)
    if x.shape[0] == 0 or y.min(initial=1) == y.max(initial=0):
        raise InvalidQueryError("calibration needs judged hits of both kinds, relevant and "
                                "not: give more judged queries")
    beta = np.zeros(x.shape[1])
    penalty = np.diag([0.0] + [l2 * len(y)] * (x.shape[1] - 1))
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ beta)))
        gradient = x.T @ (y - p) - penalty @ beta
        hessian = (x * (p * (1 - p))[:, None]).T @ x + penalty
        step = np.linalg.solve(hessian, gradient)
        beta += step
        if np.abs(step).max() < 1e-10:
            break
    return Calibration(model=model, intercept=float(beta[0]),
                       weights=dict(zip(FEATURES, map(float, beta[1:]), strict=True)),
                       fitted_on=fitted_on or {}, hits_per_query=hits_per_query)


def calibration_for(root: Path | None, manifest: Manifest) -> Calibration | None:
    """The root's own calibration for the build's document model, else the shipped one for
    it, else None (a build of another model has no relevance score until calibrated)."""
    model = manifest.encoder.model
    if root is not None:
        path = Path(root) / ROOT_FILE
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp is not None:
            own = _read(path, stamp)
            if own.model == model:
                return own
    shipped = _read(SHIPPED, 0)
    return shipped if shipped.model == model else None


@functools.lru_cache(maxsize=16)
def _read(path: Path, stamp: int) -> Calibration:
    """A calibration file, parsed once per modification (``stamp``); ``ConfigError`` naming
    it when it is no calibration (a build reads it at load: refused, the old one serves)."""
    try:
        return Calibration.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else problems(exc)
        raise ConfigError(f"{path} is no relevance calibration ({why}); fit it again with "
                          "`retrieval calibrate` or remove it to use the shipped one",
                          "relevance") from None


def check_min_score(min_score: object) -> float | None:
    """``min_score`` as a float in [0, 1], or None; anything else is ``InvalidQueryError``."""
    if min_score is None:
        return None
    if isinstance(min_score, np.integer | np.floating):  # a numpy scalar, as k takes one
        min_score = float(min_score)
    if isinstance(min_score, bool) or not isinstance(min_score, int | float) \
            or not 0.0 <= float(min_score) <= 1.0:
        raise InvalidQueryError(f"min_score must be a number from 0 to 1 (a relevance "
                                f"probability), got {min_score!r}")
    return float(min_score)


def above(result: SearchResult, min_score: float | None) -> SearchResult:
    """``result`` with only the hits whose relevance is at least ``min_score`` (a hit
    without one, from a search that lost its query vector to the deadline, is left out)."""
    if min_score is None:
        return result
    kept = [h for h in result.hits if h.relevance is not None and h.relevance >= min_score]
    return result if len(kept) == len(result.hits) else result.model_copy(update={"hits": kept})
