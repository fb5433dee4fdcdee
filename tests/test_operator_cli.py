"""What an operator on call meets: gc, rollback, compact, verify, snapshot, builds and the
writer on mistyped or damaged roots answer with one clear line and the exit status of a
refusal, and never act on a history they cannot trust."""

from __future__ import annotations

from pathlib import Path

import pytest
from live_index import INFO, build_small, scifact_docs, unit_vectors

from indexes import build_index
from indexes.errors import MissingArtifactError
from indexes.history import HISTORY
from indexes.manifest import resolve_build_dir
from indexes.writer import IndexWriter
from retrieval.cli.app import main


@pytest.fixture(scope="module")
def docs(dataset):
    return scifact_docs(dataset("scifact"), 30)


@pytest.fixture
def root(tmp_path, docs) -> Path:
    build_small(tmp_path, docs[:20])
    build_small(tmp_path, docs[:25], seed=1)  # live; the first is the rollback target
    return tmp_path


def staged(root: Path, docs) -> str:
    return build_index(docs, root, vectors=unit_vectors(len(docs), 2), encoder_info=INFO,
                       progress=False, dense="exact", publish=False).build_id


@pytest.mark.parametrize(("args", "says"), [
    (["gc", "{root}", "--keep", "0"], "keep must be an integer of at least 1"),
    (["gc", "{root}/nope"], "no index root"),
    (["builds", "{root}/nope"], "no index root"),
    (["snapshot", "{root}", "{root}"], "is a directory: name the snapshot file"),
    (["compact", "{root}/nope"], "neither a build directory"),
    # a build directory given for the root: builds printed an empty table, exit 0, and
    # rollback said no build "was live before None"
    (["builds", "{build}"], "is a build directory, not an index root"),
    (["rollback", "{build}"], "is a build directory, not an index root"),
    (["builds", "{root}/builds"], "is no index root (no builds/ in it)"),
])
def test_mistyped_arguments_are_one_line_errors(root, capsys, args, says):
    build = next(p for p in (root / "builds").iterdir() if not p.name.startswith("."))
    assert main([a.format(root=root, build=build) for a in args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (root / "nope").exists()  # nothing created where nothing was


def test_a_damaged_history_line_stops_gc_and_fails_verify(root, capsys):
    history = root / HISTORY
    lines = history.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"previous"', '"prEvious"')
    history.write_text("".join(lines))
    before = sorted(p.name for p in (root / "builds").iterdir())
    assert main(["gc", str(root), "--keep", "1"]) == 2
    assert "line 1 is damaged" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "builds").iterdir()) == before
    assert main(["verify", str(root)]) == 2


def test_a_torn_last_history_line_is_no_damage(root, capsys):
    with (root / HISTORY).open("a") as handle:
        handle.write('{"build_id": "x", "at"')  # a crash mid-append: no newline
    assert main(["verify", str(root)]) == 0


def test_rollback_to_a_build_never_live_is_refused(root, docs, capsys):
    never = staged(root, docs[:5])
    live = resolve_build_dir(root)
    assert main(["rollback", str(root), "--to", never]) == 2
    assert "was never live" in capsys.readouterr().err
    assert resolve_build_dir(root) == live


def test_a_compaction_with_nothing_to_fold_says_so(root, capsys):
    assert main(["compact", str(root)]) == 0
    assert "nothing to fold" in capsys.readouterr().out


def test_current_naming_a_missing_build_names_the_fix(root):
    (root / "CURRENT").write_text("20990101T000000000000Z-000000\n")
    with pytest.raises(MissingArtifactError, match="retrieval rollback"):
        resolve_build_dir(root)
    with pytest.raises(MissingArtifactError):
        IndexWriter(root / "elsewhere")
    assert not (root / "elsewhere").exists()


def test_a_manifest_changed_after_the_build_fails_verify_and_load(root, capsys):
    """No file named the manifest's checksum: a flipped log_seq passed verify and replayed
    (or dropped) logged writes."""
    from retrieval import Retriever

    manifest = resolve_build_dir(root) / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"log_seq": 0', '"log_seq": 1'))
    assert main(["verify", str(root)]) == 2
    assert "the manifest changed after the build" in capsys.readouterr().err
    with pytest.raises(Exception, match="manifest changed"):
        Retriever.load(root, {"cache": {"backend": "none"}, "live_lag_seconds": None})
