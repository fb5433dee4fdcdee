"""Staging, the flip history, rollback, the builds listing, gc protection and gate-file errors.

Small builds from precomputed vectors (no model): these are the on-disk rules; the gate's
searches on real data are in test_publish_gate.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from indexes.build import build_index
from indexes.docstore import Document
from indexes.errors import LiveBuildChangedError
from indexes.history import HISTORY, read_history, rollback_target
from indexes.manifest import CURRENT, EncoderInfo, collect_garbage
from indexes.publish import (
    NoRollbackTargetError,
    PublishError,
    UnknownBuildError,
    history,
    list_builds,
    publish_build,
    rollback,
)
from retrieval.cli import main as cli
from retrieval.publishing import GateConfigError, load_gate

INFO = EncoderInfo(encoder_id="test:precomputed:fp32:8", model="test", dim=8,
                   vector_dtype="float32")


def _docs(n: int, revision: int = 0) -> list[Document]:
    return [Document(f"d{i}", f"document {i} about topic {i % 5} revision {revision}",
                     metadata={"group": f"g{i % 3}"}) for i in range(n)]


def _build(root, n: int = 20, revision: int = 0, publish: bool = True, info=INFO) -> str:
    vectors = np.random.default_rng(revision).normal(size=(n, info.dim)).astype(np.float32)
    return build_index(_docs(n, revision), root, vectors=vectors, encoder_info=info,
                       progress=False, publish=publish).build_id


def test_staged_build_leaves_current_and_is_listed_as_staged(tmp_path):
    live = _build(tmp_path)
    staged = _build(tmp_path, revision=1, publish=False)
    assert (tmp_path / CURRENT).read_text().strip() == live
    status = {b.build_id: b.status for b in list_builds(tmp_path)}
    assert status == {live: "live", staged: "staged"}
    assert [r.how for r in read_history(tmp_path)] == ["plain"]


def test_rollback_returns_to_the_previously_live_build_not_the_previously_built(tmp_path):
    first = _build(tmp_path)
    second = _build(tmp_path, revision=1)
    _build(tmp_path, revision=2, publish=False)  # newer, never live
    record = rollback(tmp_path)
    assert record.build_id == first and record.how == "rollback" and record.previous == second
    assert (tmp_path / CURRENT).read_text().strip() == first
    assert rollback_target(tmp_path) == second
    assert rollback(tmp_path).build_id == second  # a second rollback undoes the first


def test_a_rollback_does_not_undo_a_build_published_while_it_verified(tmp_path, monkeypatch):
    """A rollback chose its target, then read its checksums (seconds at scale) and flipped:
    a build the nightly job published meanwhile was undone, to a target it never had."""
    import indexes.publish

    first = _build(tmp_path)
    _build(tmp_path, revision=1)
    nightly = _build(tmp_path, revision=2, publish=False)
    verify = indexes.publish.verify_build

    def verify_while_the_nightly_publishes(directory, manifest):
        verify(directory, manifest)
        if directory.name == first:  # the rollback's target
            publish_build(tmp_path, nightly)

    monkeypatch.setattr(indexes.publish, "verify_build", verify_while_the_nightly_publishes)
    with pytest.raises(LiveBuildChangedError, match=nightly):
        rollback(tmp_path)
    assert (tmp_path / CURRENT).read_text().strip() == nightly


def test_a_flip_killed_before_current_was_replaced_is_no_flip(tmp_path):
    """A flip appends its record, then replaces CURRENT: killed in between, the record named
    a build that never served as once live, and rollback took it without the gate."""
    from indexes.history import FlipRecord, append_record, ever_live

    first = _build(tmp_path)
    second = _build(tmp_path, revision=1)
    never = _build(tmp_path, revision=2, publish=False)
    append_record(tmp_path, FlipRecord(build_id=never, at="2026-12-07T00:00:00+00:00",
                                       how="forced", previous=second))  # then killed
    assert ever_live(tmp_path) == {first, second} and rollback_target(tmp_path) == first
    assert {b.build_id: b.status for b in list_builds(tmp_path)}[never] == "staged"
    with pytest.raises(PublishError, match="never live"):
        rollback(tmp_path, to=never)
    third = _build(tmp_path, revision=3)
    assert [r.build_id for r in history(tmp_path)] == [first, second, third]
    # A damaged record proves nothing about the one before it.
    lines = (tmp_path / HISTORY).read_text().splitlines()
    lines[1] = lines[1][:20]  # second's record, damaged
    (tmp_path / HISTORY).write_text("\n".join(lines) + "\n")
    assert {first, third} <= ever_live(tmp_path)


def test_the_gate_counts_a_passage_builds_documents_not_its_passages(tmp_path, encoder):
    """It compared rows: half the documents cut into smaller passages counted as +75% and
    passed the default 10% drop limit. And documents are compared by their own text."""
    from indexes import BuildConfig, PassageConfig
    from retrieval.publishing import publish

    para = " ".join(f"word{j} sentence about cells and proteins number {j}." for j in range(40))
    docs = [Document(f"d{i}", f"{para}\n\n{para} doc {i}") for i in range(20)]

    def passage_build(docs: list[Document], max_tokens: int, publish: bool) -> str:
        config = BuildConfig(passages=PassageConfig(max_tokens=max_tokens, overlap_tokens=0))
        return build_index(docs, tmp_path, encoder=encoder, config=config, progress=False,
                           publish=publish).build_id

    passage_build(docs, 256, True)
    halved = passage_build(docs[:10], 64, False)
    outcome = publish(tmp_path, halved)
    count = next(c for c in outcome.report.checks if c.name == "document count")
    assert not outcome.published and count.outcome == "refused"
    assert count.figures["live_docs"] == 20 and count.figures["candidate_docs"] == 10
    # The same documents cut into other passages, or built whole, are the same documents:
    # hashed from their passages' hashes, every one counted as changed.
    strict = {"max_changed": 0.05}
    recut = publish(tmp_path, passage_build(docs, 64, False), strict)
    changed = next(c for c in recut.report.checks if c.name == "documents changed")
    assert recut.published and changed.figures["changed"] == 0
    whole = build_index(docs, tmp_path, encoder=encoder, progress=False, publish=False)
    assert publish(tmp_path, whole.build_id, strict).published


def test_a_gate_given_as_a_mapping_is_its_settings(tmp_path):
    """publish(root, build, {"max_doc_drop": 0.5}) was a bare TypeError from deep inside."""
    from retrieval.publishing import publish

    _build(tmp_path, n=20)
    smaller = _build(tmp_path, n=14, revision=1, publish=False)  # a 30% drop
    assert not publish(tmp_path, smaller, {"max_doc_drop": 0.1}).published
    assert publish(tmp_path, smaller, {"max_doc_drop": 0.5}).published
    with pytest.raises(GateConfigError, match="max_doc_drp"):
        publish(tmp_path, smaller, {"max_doc_drp": 0.5})


def test_the_gate_compares_what_is_served_not_the_two_builds(tmp_path):
    """A nightly build whose export lacks 10 live writes supersedes them: 30 documents served
    become 20, yet build to build the gate saw 20 -> 20. A field a write adds after the
    candidate sealed the log is served on it too, yet it counted as lost."""
    from indexes import BuildConfig
    from indexes.writer import IndexWriter
    from retrieval.publishing import publish

    def build(n: int, revision: int, publish: bool) -> str:
        vectors = np.random.default_rng(revision).normal(size=(n, 8)).astype(np.float32)
        return build_index(_docs(n, revision), tmp_path, vectors=vectors, encoder_info=INFO,
                           progress=False, publish=publish,
                           config=BuildConfig(allow_new_fields=True)).build_id

    build(20, 0, True)
    live_vectors = np.random.default_rng(9).normal(size=(10, 8)).astype(np.float32)
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document(f"live{i}", f"live text {i}") for i in range(10)], live_vectors)
    nightly = build(20, 1, False)  # its export lacks the live writes: they are superseded
    outcome = publish(tmp_path, nightly)
    count = next(c for c in outcome.report.checks if c.name == "document count")
    assert not outcome.published
    assert (count.figures["live_docs"], count.figures["candidate_docs"]) == (30, 20)
    # The content diff too: the 10 served live writes are removed (build to build: none).
    changed = next(c for c in outcome.report.checks if c.name == "documents changed")
    assert (changed.figures["removed"], changed.figures["changed"]) == (10, 20)
    assert changed.figures["removed_sample"] == [f"live{i}" for i in range(5)]
    with IndexWriter(tmp_path) as writer:  # logged after the nightly sealed the log
        writer.upsert([Document("team-doc", "a new field", metadata={"team": "search"})],
                      live_vectors[:1])
    fields = next(c for c in publish(tmp_path, nightly, {"max_doc_drop": 0.5}).report.checks
                  if c.name == "metadata fields")
    assert fields.outcome == "passed" and fields.figures["lost"] == []


def test_publish_and_rollback_errors_are_typed(tmp_path):
    only = _build(tmp_path)
    with pytest.raises(NoRollbackTargetError, match="--to"):
        rollback(tmp_path)
    with pytest.raises(UnknownBuildError, match="no build 'nope'"):
        publish_build(tmp_path, "nope")
    with pytest.raises(PublishError, match="already live"):
        rollback(tmp_path, to=only)
    assert cli(["rollback", str(tmp_path)]) == 2


def test_gc_keeps_live_and_rollback_target_even_when_older_than_keep(tmp_path):
    old = _build(tmp_path)
    target = _build(tmp_path, revision=1)
    rollback(tmp_path)  # live: old; rollback target: target
    doomed = _build(tmp_path, revision=2, publish=False)
    newest = _build(tmp_path, revision=3, publish=False)
    removed = collect_garbage(tmp_path, keep=1)
    assert [p.name for p in removed] == [doomed]
    assert sorted(p.name for p in (tmp_path / "builds").iterdir()) == sorted([old, target, newest])


def test_a_killed_flips_temp_file_goes_with_the_next_flip(tmp_path):
    _build(tmp_path)
    leftover = tmp_path / ".CURRENT.tmp-4242"  # a flip killed between its write and rename
    leftover.write_text("half\n")
    second = _build(tmp_path, revision=1)
    assert not leftover.exists()
    assert (tmp_path / "CURRENT").read_text().strip() == second


def test_torn_history_line_is_skipped(tmp_path):
    _build(tmp_path)
    second = _build(tmp_path, revision=1)
    with open(tmp_path / HISTORY, "a") as handle:
        handle.write('{"build_id": "half-writ')
    assert [r.build_id for r in read_history(tmp_path)][-1] == second


def test_a_flip_after_a_torn_history_line_is_recorded_whole(tmp_path, caplog):
    """The next flip's line was appended onto the torn one: its record was lost, and the
    damaged line (no longer the last) failed verify and stopped gc from then on."""
    from indexes.history import check_history

    _build(tmp_path)
    second = _build(tmp_path, revision=1)
    with open(tmp_path / HISTORY, "a") as handle:
        handle.write('{"build_id": "half-writ')
    third = _build(tmp_path, revision=2)
    assert [r.build_id for r in read_history(tmp_path)][-2:] == [second, third]
    check_history(tmp_path)
    assert "torn last line" in caplog.text
    collect_garbage(tmp_path, keep=1)
    whole = (tmp_path / HISTORY).read_text()  # a whole last line without its newline (an
    (tmp_path / HISTORY).write_text(whole.rstrip("\n"))  # editor's save) is kept
    fourth = _build(tmp_path, revision=3)
    assert [r.build_id for r in read_history(tmp_path)][-3:] == [second, third, fourth]


def test_cli_builds_publish_and_rollback(tmp_path, capsys):
    first = _build(tmp_path)
    staged = _build(tmp_path, revision=1, publish=False)
    assert cli(["publish", str(tmp_path), staged]) == 0
    assert "published build" in capsys.readouterr().out
    assert read_history(tmp_path)[-1].how == "gate"
    assert cli(["rollback", str(tmp_path)]) == 0
    assert f"{first} is live again" in capsys.readouterr().out
    assert (tmp_path / CURRENT).read_text().strip() == first
    assert cli(["builds", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["build_id"], r["status"]) for r in rows] == [(staged, "rollback target"),
                                                            (first, "live")]
    assert rows[0]["n_docs"] == 20 and rows[0]["size_bytes"] > 0
    assert cli(["builds", str(tmp_path)]) == 0
    assert "rollback target" in capsys.readouterr().out


def test_default_gate_refuses_a_big_drop_and_force_records_it(tmp_path, capsys):
    _build(tmp_path, n=20)
    small = _build(tmp_path, n=10, revision=1, publish=False)
    assert cli(["publish", str(tmp_path), small, "--json"]) == 1
    out = capsys.readouterr().out
    report = json.loads(out[: out.rindex("}") + 1])
    assert report["passed"] is False
    drop = next(c for c in report["checks"] if c["name"] == "document count")
    assert drop["outcome"] == "refused" and drop["figures"]["change"] == -0.5
    assert cli(["publish", str(tmp_path), small, "--force"]) == 0
    record = read_history(tmp_path)[-1]
    assert record.build_id == small and record.how == "forced"
    assert "document count" in record.note


@pytest.mark.parametrize("name, content, message", [
    ("gate.json", '{"max_doc_drop": 0.1, "max_doc_dorp": 0.2}', "max_doc_dorp"),
    ("gate.toml", "max_doc_drop = 2.0", "max_doc_drop"),
    ("gate.toml", "max_doc_drop = [", "cannot be parsed"),
    ("gate.yaml", "max_doc_drop: 0.1", ".json or .toml"),
])
def test_bad_gate_files_are_typed_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(GateConfigError, match=message):
        load_gate(path)


def test_missing_gate_file_and_bad_canary_line(tmp_path, capsys):
    with pytest.raises(GateConfigError, match="does not exist"):
        load_gate(tmp_path / "absent.toml")
    _build(tmp_path / "root")
    staged = _build(tmp_path / "root", revision=1, publish=False)
    (tmp_path / "canaries.jsonl").write_text('{"query": "topic", "expect": ["d1"]}\n')
    (tmp_path / "gate.toml").write_text('canaries = "canaries.jsonl"\n')
    with pytest.raises(SystemExit):
        cli(["publish", str(tmp_path / "root"), staged, "--gate", str(tmp_path / "gate.toml")])
    assert "line 1 is not a valid Canary" in capsys.readouterr().err


def test_diff_names_added_removed_changed_and_lost_fields(tmp_path, capsys):
    a = _build(tmp_path, n=20)
    docs = _docs(20)
    docs = [Document(d.id, d.text + (" edited" if d.id == "d3" else ""), d.title,
                     {"kind": "x"}) for d in docs if d.id != "d0"]
    docs.append(Document("d99", "a new document", metadata={"kind": "y"}))
    vectors = np.random.default_rng(5).normal(size=(len(docs), INFO.dim)).astype(np.float32)
    b = build_index(docs, tmp_path, vectors=vectors, encoder_info=INFO, progress=False,
                    publish=False).build_id
    assert cli(["diff", str(tmp_path), a, b, "--json"]) == 1  # refused: as publish would exit
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    changed = checks["documents changed"]["figures"]
    assert (changed["added"], changed["removed"], changed["changed"]) == (1, 1, 1)
    assert (changed["added_sample"], changed["removed_sample"], changed["changed_sample"]) == (
        ["d99"], ["d0"], ["d3"])
    fields = checks["metadata fields"]
    assert fields["outcome"] == "refused"
    assert fields["figures"]["lost"] == ["group"] and fields["figures"]["added"] == ["kind"]
    assert report["passed"] is False
    assert cli(["diff", str(tmp_path), a, b]) == 1
    text = capsys.readouterr().out
    assert "REFUSED metadata fields: added: kind; lost: group" in text
    assert "gate refused by: metadata fields" in text
    assert (tmp_path / CURRENT).read_text().strip() == a  # diff never publishes


def test_publishing_public_names_are_sorted_and_importable():
    import retrieval.publishing as publishing

    assert publishing.__all__ == sorted(publishing.__all__)
    assert all(hasattr(publishing, name) for name in publishing.__all__)
