"""Checks that read only the two builds' files: documents, metadata fields, encoder, analyzer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from indexes.going_live import describe_export, older_export
from indexes.publish import BuildContents
from retrieval.publishing.config import GateConfig
from retrieval.publishing.report import Check

SAMPLE = 5  # ids listed per kind of change; the counts are complete


@dataclass(frozen=True)
class Served:
    """What serving a build means at this point of the root's log: its documents (id ->
    content hash) and fields with the records after its ``log_seq`` applied (a live build's
    pending writes; the ones a candidate would take once published)."""

    hashes: dict[str, bytes]
    fields: dict[str, str]

    @classmethod
    def alone(cls, contents: BuildContents) -> Served:
        """A build as served with no log records after it."""
        return cls(dict(zip(contents.doc_ids, map(bytes, contents.content_hashes), strict=True)),
                   contents.manifest.metadata_fields)


def structural_checks(live: BuildContents, candidate: BuildContents, gate: GateConfig,
                      served: tuple[Served, Served] | None = None) -> list[Check]:
    """``served``: (live, candidate) as served; by default each build alone."""
    live_served, candidate_served = served or (Served.alone(live), Served.alone(candidate))
    return [doc_count_check(len(live_served.hashes), len(candidate_served.hashes), gate),
            content_check(live_served.hashes, candidate_served.hashes, gate),
            metadata_check(live_served.fields, candidate_served.fields, gate),
            encoder_check(live, candidate, gate), analyzer_check(live, candidate, gate),
            export_check(live, candidate)]


def export_check(live: BuildContents, candidate: BuildContents) -> Check:
    """Refused: a candidate made from an older corpus export than the live build's (two
    nightly builds that overlapped, the one that read its export first finishing last)."""
    before, after = describe_export(live.manifest), describe_export(candidate.manifest)
    figures = {"live": before, "candidate": after}
    if older_export(candidate.manifest, live.manifest):
        return Check(name="corpus export", outcome="refused", figures=figures,
                     threshold="not older than the live build's",
                     summary=f"read {after}, before the live build's export ({before}): "
                             "publishing it would bring back the older export")
    return Check(name="corpus export", outcome="passed", figures=figures,
                 threshold="not older than the live build's",
                 summary=f"read {after} (the live build's: {before})")


def doc_count_check(before: int, after: int, gate: GateConfig) -> Check:
    """Documents served before and after (not rows: a passage build's rows are passages,
    and half the corpus cut into smaller passages counted as growth)."""
    change = (after - before) / before if before else 0.0
    figures = {"live_docs": before, "candidate_docs": after, "change": round(change, 6)}
    threshold = f"drop <= {gate.max_doc_drop:.1%}"
    if gate.max_doc_growth is not None:
        threshold += f", growth <= {gate.max_doc_growth:.1%}"
    summary = f"{before} -> {after} documents ({change:+.1%})"
    too_small = -change > gate.max_doc_drop
    too_large = gate.max_doc_growth is not None and change > gate.max_doc_growth
    if too_small:
        summary += f": a drop of {-change:.1%}, more than the {gate.max_doc_drop:.1%} allowed"
    elif too_large:
        summary += f": growth of {change:.1%}, more than the {gate.max_doc_growth:.1%} allowed"
    return Check(name="document count", outcome="refused" if too_small or too_large else "passed",
                 summary=summary, threshold=threshold, figures=figures)


def content_diff(old: dict[str, bytes], new: dict[str, bytes]) -> dict[str, list[str]]:
    """Ids added, removed, and kept with a different content hash (title + text), between
    two served views' ``hashes``."""
    return {
        "added": [i for i in new if i not in old],
        "removed": [i for i in old if i not in new],
        "changed": [i for i, digest in new.items() if i in old and old[i] != digest],
    }


def content_check(old: dict[str, bytes], new: dict[str, bytes], gate: GateConfig) -> Check:
    """Documents served before and after: a live build's pending writes count as served (a
    candidate that lacked 50 live edits changed nothing, compared build to build)."""
    diff = content_diff(old, new)
    counts = {kind: len(ids) for kind, ids in diff.items()}
    figures: dict[str, Any] = {**counts, **{f"{kind}_sample": ids[:SAMPLE]
                                           for kind, ids in diff.items()}}
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    if gate.max_changed is None:
        return Check(name="documents changed", outcome="passed", summary=summary,
                     threshold="any (max_changed not set)", figures=figures)
    base = max(len(old), 1)  # documents: a passage build's rows are passages
    fraction = (counts["removed"] + counts["changed"]) / base
    figures["removed_or_changed"] = round(fraction, 6)
    refused = fraction > gate.max_changed
    if refused:
        summary += f": {fraction:.1%} of live documents removed or changed"
    return Check(name="documents changed", outcome="refused" if refused else "passed",
                 summary=summary, threshold=f"removed + changed <= {gate.max_changed:.1%}",
                 figures=figures)


def metadata_check(old: dict[str, str], new: dict[str, str], gate: GateConfig) -> Check:
    """The fields served before and after."""
    added = sorted(set(new) - set(old))
    lost = sorted(set(old) - set(new))
    retyped = sorted(f for f in set(old) & set(new) if old[f] != new[f])
    figures = {"added": added, "lost": lost,
               "retyped": {f: [old[f], new[f]] for f in retyped}}
    parts = [f"{label}: {', '.join(names)}" for label, names in
             (("added", added), ("lost", lost), ("type changed", retyped)) if names]
    summary = "; ".join(parts) or f"same {len(old)} fields"
    refused = bool(lost or retyped) and not gate.allow_metadata_loss
    if refused:
        summary += " (filters on these fields would fail or change meaning)"
    return Check(name="metadata fields", outcome="refused" if refused else "passed",
                 summary=summary, threshold="no field lost or retyped unless allowed",
                 figures=figures)


def encoder_check(live: BuildContents, candidate: BuildContents, gate: GateConfig) -> Check:
    old, new = live.manifest.encoder, candidate.manifest.encoder
    figures = {"live": old.encoder_id, "candidate": new.encoder_id,
               "live_dim": old.dim, "candidate_dim": new.dim}
    if old.encoder_id == new.encoder_id and old.dim == new.dim:
        return Check(name="encoder", outcome="passed", summary=f"same ({old.encoder_id})",
                     threshold="unchanged unless allowed", figures=figures)
    summary = f"changed from {old.encoder_id} to {new.encoder_id}"
    if gate.allow_encoder_change:
        return Check(name="encoder", outcome="passed", summary=summary + " (allowed)",
                     threshold="change allowed", figures=figures)
    return Check(name="encoder", outcome="refused",
                 summary=summary + ": serving processes would need the new query encoder; "
                 "allow with --allow-encoder-change", threshold="unchanged unless allowed",
                 figures=figures)


# A setting's value longer than this is cut in a check's summary (the figures keep it whole):
# the token pattern that keeps combining marks in words is about 4 KB.
SUMMARY_VALUE_CHARS = 60


def shortened(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SUMMARY_VALUE_CHARS else text[:SUMMARY_VALUE_CHARS] + "..."


def analyzer_check(live: BuildContents, candidate: BuildContents, gate: GateConfig) -> Check:
    old, new = live.manifest, candidate.manifest
    changed = {key: [old.analyzer.get(key), new.analyzer.get(key)]
               for key in sorted(set(old.analyzer) | set(new.analyzer))
               if old.analyzer.get(key) != new.analyzer.get(key)}
    changed |= {f"bm25.{key}": [old.bm25.get(key), new.bm25.get(key)]
                for key in sorted(set(old.bm25) | set(new.bm25))
                if old.bm25.get(key) != new.bm25.get(key)}
    same_fingerprint = old.analyzer_fingerprint == new.analyzer_fingerprint
    figures = {"live_fingerprint": old.analyzer_fingerprint,
               "candidate_fingerprint": new.analyzer_fingerprint, "changed": changed}
    if same_fingerprint and not changed:
        return Check(name="analyzer", outcome="passed", summary="same analyzer and BM25 settings",
                     threshold="unchanged unless allowed", figures=figures)
    what = ", ".join(f"{k} {shortened(a)} -> {shortened(b)}"
                     for k, (a, b) in changed.items()) or "fingerprint"
    if gate.allow_analyzer_change:
        return Check(name="analyzer", outcome="passed", summary=f"changed: {what} (allowed)",
                     threshold="change allowed", figures=figures)
    return Check(name="analyzer", outcome="refused",
                 summary=f"changed: {what}; allow with allow_analyzer_change",
                 threshold="unchanged unless allowed", figures=figures)
