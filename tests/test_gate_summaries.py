"""The gate's analyzer check names a changed setting without printing a whole long value."""

from __future__ import annotations

from types import SimpleNamespace

from indexes.analyzer import WORD_CHARACTER_TOKEN_PATTERN, Analyzer, AnalyzerConfig
from retrieval.publishing.config import GateConfig
from retrieval.publishing.structure import SUMMARY_VALUE_CHARS, analyzer_check


def _contents(config: AnalyzerConfig) -> SimpleNamespace:
    manifest = SimpleNamespace(analyzer=config.model_dump(mode="json"), bm25={},
                               analyzer_fingerprint=Analyzer(config).fingerprint)
    return SimpleNamespace(manifest=manifest)


def test_a_build_that_keeps_marks_over_one_that_did_not_is_refused_in_a_short_summary():
    old = _contents(AnalyzerConfig(token_pattern=WORD_CHARACTER_TOKEN_PATTERN))
    new = _contents(AnalyzerConfig())
    refused = analyzer_check(old, new, GateConfig())
    assert refused.outcome == "refused"
    assert refused.summary.startswith("changed: token_pattern '(?u)\\\\b\\\\w\\\\w+\\\\b' -> ")
    assert "allow with allow_analyzer_change" in refused.summary
    assert len(refused.summary) < 3 * SUMMARY_VALUE_CHARS + 80
    # The figures keep the whole values for whoever reads the report.
    assert refused.figures["changed"]["token_pattern"][1] == AnalyzerConfig().token_pattern
    allowed = analyzer_check(old, new, GateConfig(allow_analyzer_change=True))
    assert allowed.outcome == "passed"
