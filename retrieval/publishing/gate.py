"""The publish gate: a candidate build checked against the live one before it serves a query.

Both builds are loaded as a serving process loads them, ``Retriever.load`` on their build
directories, whole or sharded (no cache, no reloader, the same ranking config), so the
canaries and the labeled log see exactly what serving would return from each. A sharded
build's contents are its shards' ids and hashes in global row order under its top manifest,
so the structural checks compare documents whatever the layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.encoders import Encoder, compatible_query_encoder
from indexes.manifest import read_manifest
from indexes.publish import BuildContents, read_contents
from indexes.sharding import is_sharded, read_layout
from indexes.vectors import content_hashes
from indexes.wal.checks import merged_kinds
from indexes.wal.log import Record, read_all
from indexes.wal.state import Changes
from retrieval.config import RetrieverConfig
from retrieval.publishing.config import (
    Canary,
    GateConfig,
    LabeledQuery,
    load_canaries,
    load_labeled_log,
)
from retrieval.publishing.quality import (
    QueryVectors,
    canary_figures,
    labeled_figures,
    rankings,
    within,
)
from retrieval.publishing.report import Check, GateReport
from retrieval.publishing.structure import Served, structural_checks
from retrieval.retriever import Retriever


@dataclass(frozen=True)
class SearchInputs:
    """The gate's canaries and labeled log, read (and validated) once."""

    canaries: list[Canary]
    labeled: list[LabeledQuery]

    @classmethod
    def read(cls, gate: GateConfig) -> SearchInputs:
        return cls(load_canaries(gate.canaries) if gate.canaries else [],
                   load_labeled_log(gate.labeled_log) if gate.labeled_log else [])


CANARY = "canary overlap"
EXPECTED = "canary expected ids"
LABELED = "labeled log nDCG"


def compare_builds(
    live_dir: Path | None, candidate_dir: Path, gate: GateConfig | None = None, *,
    encoder: Encoder | None = None, config: RetrieverConfig | dict[str, Any] | None = None,
    inputs: SearchInputs | None = None,
) -> GateReport:
    """Run every check of ``gate`` on ``candidate_dir`` against ``live_dir``.

    ``encoder`` is reused for a build made by the same (or a compatible) model, so the model is
    loaded once; ``config`` is the serving config (cache and reloader are turned off here);
    ``inputs``: canaries and labeled queries given directly instead of the gate's files.
    """
    started = time.perf_counter()
    gate = gate or GateConfig()
    if inputs is None:
        inputs = SearchInputs.read(gate)  # bad files fail before any build is loaded
    candidate = build_contents(candidate_dir)
    if live_dir is None:
        checks = [Check(name="live build", outcome="skipped",
                        summary="nothing is live yet: nothing to compare against")]
        return GateReport(live_build=None, candidate_build=candidate.manifest.build_id,
                          checks=checks, seconds=time.perf_counter() - started)
    live = build_contents(live_dir)
    live_served, candidate_served = served_views([(live_dir, live), (candidate_dir, candidate)])
    checks = structural_checks(live, candidate, gate, (live_served, candidate_served))
    timings = {"diff": time.perf_counter() - started}
    checks += _search_checks(live_dir, candidate_dir, live, candidate, gate, inputs, checks,
                             encoder, config, timings)
    return GateReport(live_build=live.manifest.build_id,
                      candidate_build=candidate.manifest.build_id, checks=checks,
                      seconds=time.perf_counter() - started,
                      timings={k: round(v, 4) for k, v in timings.items()})


def served_views(builds: list[tuple[Path, BuildContents]]) -> list[Served]:
    """Each build served at this point of its root's log (``served_view``); the log is read
    once for the builds of one root, from the oldest ``log_seq`` among them."""
    def root(directory: Path) -> Path:
        return directory.parent.parent  # <root>/builds/<build id>

    logs: dict[Path, list[Record]] = {}
    for directory, _ in builds:
        if root(directory) not in logs:
            after = min(c.manifest.log_seq for d, c in builds if root(d) == root(directory))
            logs[root(directory)] = read_all(root(directory), after=after)
    return [served_view(contents, [r for r in logs[root(directory)]
                                   if r.seq > contents.manifest.log_seq])
            for directory, contents in builds]


def served_view(contents: BuildContents, records: list[Record]) -> Served:
    """``contents`` with ``records`` (the root's after its ``log_seq``) applied: the live
    build's pending writes (a candidate superseding 50 of them lost 50 documents served, and
    compared build to build the gate saw none lost), or those a candidate would take once
    live (a field a write adds after it was sealed is no field lost)."""
    changes = Changes.of(records)
    replaced = changes.replaced()
    hashes = {i: h for i, h in Served.alone(contents).hashes.items() if i not in replaced}
    upserted = [doc for doc, _ in changes.upserts.values()]
    hashes.update(zip((d.id for d in upserted),
                      map(bytes, content_hashes([d.content for d in upserted])), strict=True))
    return Served(hashes, merged_kinds(contents.manifest.metadata_fields, records,
                                      contents.manifest.allow_new_fields))


def build_contents(directory: Path) -> BuildContents:
    """``read_contents`` of a build; of a sharded one, its shards' in row order."""
    if not is_sharded(directory):
        return read_contents(directory)
    directory, layout = read_layout(directory, verify=False)  # verified when loaded
    parts = [read_contents(layout.shard_dir(directory, i)) for i in range(len(layout.shards))]
    return BuildContents(read_manifest(directory), [i for p in parts for i in p.doc_ids],
                         np.concatenate([p.content_hashes for p in parts]))


def _search_checks(
    live_dir: Path, candidate_dir: Path, live: BuildContents, candidate: BuildContents,
    gate: GateConfig, inputs: SearchInputs, structural: list[Check], encoder: Encoder | None,
    config: RetrieverConfig | dict[str, Any] | None, timings: dict[str, float],
) -> list[Check]:
    wanted = [name for name, rows in ((CANARY, inputs.canaries), (LABELED, inputs.labeled))
              if rows]
    if not wanted:
        return []
    refused_identity = [c.name for c in structural
                        if c.name in ("encoder", "analyzer") and c.outcome == "refused"]
    if refused_identity:
        return _skipped(wanted, f"not run: the {' and '.join(refused_identity)} change was "
                        "refused")
    serving = _gate_config(config)
    started = time.perf_counter()
    pair = [_load(live_dir, live, serving, [encoder])]
    try:
        pair.append(_load(candidate_dir, candidate, serving, [encoder, pair[0].encoder]))
        timings["load"] = time.perf_counter() - started
        if any(r.encoder is None for r in pair):
            return _skipped(wanted, "not run: a build has no query encoder (precomputed "
                            "vectors of an unknown model)")
        started, vectors = time.perf_counter(), QueryVectors()
        checks = _run_searches(pair[0], pair[1], gate, inputs, vectors)
        timings["encode"] = vectors.seconds
        timings["search"] = time.perf_counter() - started - vectors.seconds
        return checks
    finally:
        for retriever in pair:
            retriever.close()


def _gate_config(config: RetrieverConfig | dict[str, Any] | None) -> RetrieverConfig:
    """The serving config, less what would make the gate's verdict depend on timing: a cache,
    reloads, and a deadline (one budget for a whole batch of canaries would skip the feature
    read on the later ones)."""
    base = config if isinstance(config, RetrieverConfig) else RetrieverConfig(**(config or {}))
    return base.model_copy(update={"cache": base.cache.model_copy(update={"backend": "none"}),
                                   "reload_interval_seconds": None, "deadline_ms": None})


def _load(directory: Path, contents: BuildContents, config: RetrieverConfig,
          encoders: list[Encoder | None]) -> Retriever:
    """The build's retriever with the first of ``encoders`` that fits it (the model is loaded
    once for both builds), else with the encoder its manifest names."""
    index_id = contents.manifest.encoder.encoder_id
    fitting = [e for e in encoders
               if e is not None and compatible_query_encoder(e.encoder_id, index_id)]
    encoder = fitting[0] if fitting else None
    return Retriever.load(directory, config, encoder=encoder)


def _skipped(names: list[str], why: str) -> list[Check]:
    return [Check(name=name, outcome="skipped", summary=why) for name in names]


def _run_searches(live: Retriever, candidate: Retriever, gate: GateConfig,
                  inputs: SearchInputs, vectors: QueryVectors) -> list[Check]:
    checks: list[Check] = []
    if inputs.canaries:
        canaries = inputs.canaries
        queries = [c.query for c in canaries]
        figures = canary_figures(rankings(live, queries, gate.k, vectors),
                                 rankings(candidate, queries, gate.k, vectors), canaries, gate.k)
        checks += _canary_checks(figures, gate)
    if inputs.labeled:
        labeled = inputs.labeled
        queries = [q.query for q in labeled]
        checks.append(_labeled_check(labeled_figures(
            rankings(live, queries, gate.k, vectors),
            rankings(candidate, queries, gate.k, vectors), labeled, gate.k), gate))
    return checks


def _canary_checks(figures: dict[str, Any], gate: GateConfig) -> list[Check]:
    overlap_ok, recall_ok = within(gate, figures)
    k = gate.k
    overlap = Check(
        name=CANARY, outcome="passed" if overlap_ok else "refused",
        summary=(f"mean overlap@{k} {figures['mean_overlap']:.3f}, lowest "
                 f"{figures['min_overlap']:.2f} ({figures['worst_canary']!r}) over "
                 f"{figures['canaries']} canaries"),
        threshold=(f"mean >= {gate.min_canary_overlap:.2f}, each >= "
                   f"{gate.min_canary_overlap_each:.2f}"),
        figures=figures)
    if "expected_recall_candidate" not in figures:
        return [overlap, Check(name=EXPECTED, outcome="skipped",
                               summary="no canary lists expected ids")]
    expected = Check(
        name=EXPECTED, outcome="passed" if recall_ok else "refused",
        summary=(f"recall@{k} {figures['expected_recall_candidate']:.3f} (live "
                 f"{figures['expected_recall_live']:.3f}) over {figures['with_expected']} "
                 "canaries"),
        threshold=f"mean >= {gate.min_expected_recall:.2f}",
        figures={key: figures[key] for key in
                 ("with_expected", "expected_recall_live", "expected_recall_candidate")})
    return [overlap, expected]


def _labeled_check(figures: dict[str, float], gate: GateConfig) -> Check:
    refused = figures["drop"] > gate.max_ndcg_drop
    return Check(
        name=LABELED, outcome="refused" if refused else "passed",
        summary=(f"nDCG@{gate.k} {figures['ndcg_live']:.4f} -> {figures['ndcg_candidate']:.4f} "
                 f"(drop {figures['drop']:+.4f}) over {figures['queries']:.0f} queries"),
        threshold=f"drop <= {gate.max_ndcg_drop:.4f}", figures=figures)
