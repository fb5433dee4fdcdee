"""Shared helpers of the feature-store tests (no tests here): views, rows, store factories."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from retrieval.features import Feature, FeatureView, LocalStore, OnlineStore, RedisStore

# Generous timeouts: a loaded CI box must not turn reads into unavailable ones. The fail-open
# tests use short ones on purpose.
RELAXED_MS = 1000.0


def quality_view(name: str = "quality", max_age_seconds: float | None = None) -> FeatureView:
    return FeatureView(
        name=name,
        features=(
            Feature(name="quality", dtype="float32", default=-1.0, description="editor score"),
            Feature(name="clicks", dtype="int64", default=0),
            Feature(name="authority", dtype="float64", default=0.5),
            Feature(name="spam", dtype="bool", default=False),
        ),
        max_age_seconds=max_age_seconds,
    )


def quality_rows(n: int, offset: float = 0.0, event_time: float | None = None
                 ) -> list[dict[str, Any]]:
    """Row i: quality = i + offset, clicks = 10 i, authority = i / n, spam = i % 3 == 0."""
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"doc_id": f"doc-{i}", "quality": i + offset, "clicks": 10 * i,
                               "authority": i / n, "spam": i % 3 == 0}
        if event_time is not None:
            row["event_time"] = event_time
        rows.append(row)
    return rows


def version_view(name: str = "versions") -> FeatureView:
    return FeatureView(name=name, features=(
        Feature(name="version", dtype="int64", default=-1),
        Feature(name="score", dtype="float32", default=0.0),
    ))


def version_rows(n: int, version: int) -> list[dict[str, Any]]:
    return [{"doc_id": f"doc-{i}", "version": version, "score": float(version * 1000 + i)}
            for i in range(n)]


def make_store(kind: str, tmp_path: Path, request: Any, **options: Any) -> OnlineStore:
    """A fresh store of ``kind`` (local | redis | cluster) with its own namespace/directory."""
    options.setdefault("grace_seconds", 0.0)
    if kind == "local":
        return LocalStore(tmp_path / f"features-{uuid.uuid4().hex[:6]}", **options)
    namespace = f"t{uuid.uuid4().hex[:10]}"
    options.setdefault("socket_timeout_ms", RELAXED_MS)
    options.setdefault("connect_timeout_ms", RELAXED_MS)
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        return RedisStore(server.url, namespace=namespace, **options)
    cluster = request.getfixturevalue("redis_cluster")
    return RedisStore(cluster.url, cluster=True, namespace=namespace, **options)


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
