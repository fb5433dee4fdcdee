"""``retrieval upsert``, ``retrieval delete`` and ``retrieval compact`` on a live root."""

from __future__ import annotations

import json

from live_index import build_small, scifact_docs

from indexes.manifest import read_manifest, resolve_build_dir
from indexes.wal import read_all
from retrieval.cli import main


def test_upsert_delete_compact_round_trip(dataset, tmp_path, capsys):
    docs = scifact_docs(dataset("scifact"), 60)
    root = tmp_path / "index"
    build_small(root, docs[:50])
    corpus = tmp_path / "changes.jsonl"
    # Unchanged texts with new metadata: their stored vectors are reused, no model needed.
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                          "metadata": {"year": 2030}}) + "\n"
                              for d in docs[:3]), encoding="utf-8")
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{docs[10].id}\n\n{docs[11].id}\n", encoding="utf-8")
    assert main(["upsert", str(root), "--corpus", str(corpus)]) == 0
    assert main(["delete", str(root), "--ids", str(ids)]) == 0
    assert "acknowledged seq 2: 2 ids deleted" in capsys.readouterr().out
    assert [r.op for r in read_all(root)] == ["upsert", "delete"]
    assert main(["compact", str(root)]) == 0
    assert "up to seq 2 folded" in capsys.readouterr().out
    manifest = read_manifest(resolve_build_dir(root))
    assert manifest.n_docs == 48 and manifest.log_seq == 2
    assert len(read_all(root)) == 2  # kept while the build before is the rollback target
    assert main(["upsert", str(root), "--corpus", str(corpus)]) == 0
    assert main(["compact", str(root)]) == 0
    assert [r.seq for r in read_all(root)] == [3]  # folded by both builds that may serve


def test_bad_input_exits_2_and_writes_nothing(dataset, tmp_path, capsys):
    docs = scifact_docs(dataset("scifact"), 20)
    root = tmp_path / "index"
    build_small(root, docs)
    corpus = tmp_path / "new.jsonl"
    corpus.write_text(json.dumps({"_id": "n1", "text": "a text no build holds"}) + "\n",
                      encoding="utf-8")
    assert main(["upsert", str(root), "--corpus", str(corpus)]) == 2
    assert "pass vectors" in capsys.readouterr().err
    assert main(["delete", str(root), "--ids", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read ids" in capsys.readouterr().err
    assert read_all(root) == []


def test_delete_takes_each_line_as_the_id_written(dataset, tmp_path, capsys):
    """Ids as upserts keep them: with spaces around, a tab, a form feed or a Unicode line
    separator inside. Each was cut or trimmed into other ids (a and b for "a\u2028b"), and
    documents of those ids deleted, with the ones named kept."""
    docs = scifact_docs(dataset("scifact"), 20)
    root = tmp_path / "index"
    build_small(root, docs)
    odd = [" pad ", "a\u2028b", "tab\t", "x\x0cy"]
    ids = tmp_path / "ids.txt"
    ids.write_text("\r\n".join(odd) + "\r\n\n", encoding="utf-8")  # Windows line ends
    assert main(["delete", str(root), "--ids", str(ids)]) == 0
    assert "4 ids deleted" in capsys.readouterr().out
    assert [list(r.ids) for r in read_all(root)] == [odd]


def test_a_nightly_build_carries_the_folded_position_forward(dataset, tmp_path):
    """A build from an external corpus keeps the live ``log_seq``: serving processes go on
    applying exactly the records after it."""
    docs = scifact_docs(dataset("scifact"), 30)
    root = tmp_path / "index"
    build_small(root, docs[:20])
    assert main(["delete", str(root), "--ids", str(_ids(tmp_path, [docs[0].id]))]) == 0
    assert main(["compact", str(root)]) == 0
    build_small(root, docs[10:30], seed=1)
    assert read_manifest(resolve_build_dir(root)).log_seq == 1


def _ids(folder, ids):
    path = folder / "ids.txt"
    path.write_text("\n".join(ids) + "\n", encoding="utf-8")
    return path


def test_compacting_an_empty_log_keeps_the_live_build(dataset, tmp_path, capsys):
    docs = scifact_docs(dataset("scifact"), 10)
    root = tmp_path / "index"
    build_small(root, docs)
    live = resolve_build_dir(root)
    assert main(["compact", str(root)]) == 0
    assert "nothing to fold" in capsys.readouterr().out and resolve_build_dir(root) == live


def test_verify_checks_the_log_and_fails_on_a_damaged_record(dataset, tmp_path, capsys):
    from live_index import unit_vectors

    from indexes import Document
    from indexes.wal import segments
    from indexes.writer import IndexWriter

    build_small(tmp_path, scifact_docs(dataset("scifact"), 20))
    with IndexWriter(tmp_path) as writer:
        for n in range(3):
            writer.upsert([Document(f"v{n}", f"verify text {n}")], vectors=unit_vectors(1, n))
    assert main(["verify", str(tmp_path)]) == 0
    assert "write-ahead log, 3 whole records" in capsys.readouterr().out
    (_, path), = segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[30] ^= 0x01  # inside the first record: two acknowledged records follow it
    path.write_bytes(bytes(data))
    assert main(["verify", str(tmp_path)]) != 0
    assert "damaged" in capsys.readouterr().err


def test_verify_fails_on_a_damaged_acked_file_and_a_writer_rewrites_it(dataset, tmp_path,
                                                                       capsys):
    """A damaged ACKED reads as "nothing acknowledged": verify says so rather than ok."""
    from live_index import unit_vectors

    from indexes import Document
    from indexes.wal import segments
    from indexes.wal.log import ACKED, acked_end, wal_dir
    from indexes.writer import IndexWriter

    build_small(tmp_path, scifact_docs(dataset("scifact"), 20))
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("v1", "verify text")], vectors=unit_vectors(1, 1))
    acked = wal_dir(tmp_path) / ACKED
    data = bytearray(acked.read_bytes())
    data[9] ^= 0x01  # inside the end offset
    acked.write_bytes(bytes(data))
    assert main(["verify", str(tmp_path)]) == 2
    assert "ACKED is damaged" in capsys.readouterr().err
    acked.unlink()
    assert main(["verify", str(tmp_path)]) == 0
    with IndexWriter(tmp_path):
        pass
    (_, path), = segments(tmp_path)
    assert acked_end(path) == path.stat().st_size


def test_a_compaction_retires_segments_a_stopped_one_left_behind(dataset, tmp_path, capsys):
    """A compaction that published its build but stopped before retiring: the next one has
    nothing to fold and retires what the live build and its rollback target both hold."""
    from live_index import unit_vectors

    from indexes import Document
    from indexes.wal import segments
    from indexes.writer import IndexWriter

    build_small(tmp_path, scifact_docs(dataset("scifact"), 20))
    with IndexWriter(tmp_path) as writer:
        writer.upsert([Document("c1", "compaction probe")], vectors=unit_vectors(1, 1))
        assert writer.compact().records_folded == 1
        (_, folded), _ = segments(tmp_path)
        kept = folded.read_bytes()
        writer.upsert([Document("c2", "compaction probe two")], vectors=unit_vectors(1, 2))
        assert writer.compact().records_folded == 1
        assert len(segments(tmp_path)) == 2  # seq 1's segment went: both builds hold it
        folded.write_bytes(kept)  # as if the retire step never ran
        again = writer.compact()
    assert again.records_folded == 0 and again.segments_retired == 1
    assert folded.name not in [path.name for _, path in segments(tmp_path)]
