"""The ``retrieval`` command: build, verify, describe, search, hints and errors, --help."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from live_index import build_small

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from retrieval import Retriever
from retrieval.cli import COMMANDS, main
from retrieval.service.workers import preload

REPO = Path(__file__).resolve().parents[1]


def test_build_verify_search_round_trip(dataset, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    docs = itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 40)
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                          "metadata": d.metadata}) + "\n" for d in docs))
    out = tmp_path / "index"
    assert main(["build", "--corpus", str(corpus), "--out", str(out), "--batch-size", "16"]) == 0
    printed = capsys.readouterr().out
    assert "published build" in printed and "MiB on disk; peak RSS" in printed
    assert main(["verify", str(out)]) == 0
    assert "files verified" in capsys.readouterr().out
    assert main(["search", str(out), "cell biology", "--filter", "year >= 2000", "--k", "3",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 < len(result["hits"]) <= 3
    assert all(h["metadata"]["year"] >= 2000 for h in result["hits"])
    assert main(["search", str(out), "cell", "--filter", "colour = 'red'"]) == 2
    assert "colour" in capsys.readouterr().err
    compact = tmp_path / "compact"
    assert main(["build", "--corpus", str(corpus), "--out", str(compact), "--batch-size", "16",
                 "--postings", "compact", "--analysis-workers", "2"]) == 0
    assert main(["verify", str(compact)]) == 0
    assert list(compact.glob("builds/*/bm25/row_bytes.npy"))
    capsys.readouterr()
    hits = []
    for root in (out, compact):
        assert main(["search", str(root), "cell biology", "--k", "5", "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        hits.append([(h["doc_id"], h["score"]) for h in answer["hits"]])
    assert hits[0] == hits[1] and hits[0]


def test_default_query_encoder_is_onnx_int8_against_torch_documents(beir_index):
    root, _, _ = beir_index("scifact")
    retriever = Retriever.load(root, {"cache": {"backend": "none"}})
    assert retriever.encoder.encoder_id == "all-MiniLM-L6-v2:onnx-int8:int8:384"
    assert retriever.snapshot.manifest.encoder.encoder_id == "all-MiniLM-L6-v2:torch:fp32:384"
    assert retriever.search("statins and heart disease", k=5).hits
    assert retriever.stats()["batching"] is None  # auto: batching only pays for torch


# --- what a newcomer trips on: formats, inferred fields, hints, errors before the model ---

SMALL = [
    {"_id": "a1", "title": "Wing flutter", "text": "flutter of a swept wing at subsonic speed",
     "metadata": {"department": "aero", "year": 1962, "published": "1962-05-01"}},
    {"_id": "a2", "title": "Boundary layers", "text": "laminar boundary layer heat transfer",
     "metadata": {"department": "aero", "year": 1965, "tags": ["heat", "laminar"]}},
    {"_id": "s1", "title": "Shells", "text": "buckling of thin cylindrical shells under load",
     "metadata": {"department": "structures", "year": 1970}},
]


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in SMALL))
    assert main(["build", "--corpus", str(corpus), "--out", str(folder / "index")]) == 0
    return folder / "index"


def test_build_prints_the_fields_and_types_it_inferred(small_index, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in SMALL))
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "index")]) == 0
    out = capsys.readouterr().out
    assert ("metadata fields inferred: department (keyword), published (date), tags (keyword), "
            "year (number)") in out
    assert "3 vectors reused, 0 encoded" not in out  # a new root: nothing to reuse
    assert "0 vectors reused, 3 encoded" in out


def test_describe_lists_fields_types_and_most_common_values(small_index, capsys):
    assert main(["describe", str(small_index)]) == 0
    out = capsys.readouterr().out
    assert "3 documents" in out
    assert "department (keyword, 2 distinct values): 'aero' (2), 'structures' (1)" in out
    assert "year (number, 3 of 3 documents): 1962 .. 1970" in out
    assert "published (date, 1 of 3 documents): 1962-05-01T00:00:00Z .. 1962-05-01T00:00:00Z" in out


def test_describe_and_the_workers_preload_read_a_sharded_build(tmp_path, capsys):
    """Fields summed over every shard, as on the whole build; the forked workers' preload warms
    each shard's kernels (both refused a sharded root with a misleading error)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in SMALL))
    index = tmp_path / "index"
    assert main(["build", "--corpus", str(corpus), "--out", str(index), "--shards", "2"]) == 0
    capsys.readouterr()
    assert main(["describe", str(index)]) == 0
    out = capsys.readouterr().out
    assert "3 documents in 2 shards" in out
    assert "department (keyword, 2 distinct values): 'aero' (2), 'structures' (1)" in out
    assert "year (number, 3 of 3 documents): 1962 .. 1970" in out
    preload(index)


@pytest.mark.parametrize(("args", "says"), [
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--batch-size", "0"],
     "invalid BuildConfig settings: --batch-size: Input should be greater than or equal to 1"),
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--k1", "-1"], "--k1: Input should"),
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--k1", "inf"],
     "--k1: Input should be a finite number"),  # every BM25 score was NaN
    (["build", "--corpus", "{corpus}", "--out", "{index}/builds"], "builds of an index root"),
    (["build", "--corpus", "{corpus}", "--out", "{build}"], "is a build directory"),
    (["calibrate", "{build}", "--data", "{tmp}"], "is no index root"),
    (["calibrate", "{index}", "--data", "{judged}"], "line 1 is not a query record"),
    (["rollback", "{damaged}"], "pass --to BUILD_ID"),
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--model", "{tmp}/no-model"],
     "no model directory"),
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--drop-fields", "nothere"],
     "no field 'nothere'"),
    (["build", "--corpus", "{corpus}", "--out", "{tmp}/i", "--passages", "--passage-tokens",
      "5"], "--passage-tokens: Input should be greater than or equal to 32"),
    (["build", "--corpus", "{corpus}", "--out", "{corpus}"], "is a file; give a directory"),
    (["calibrate", "{index}", "--data", "{tmp}/judged"], "No such file or directory: "),
    (["rollback", "{tmp}/nope"], "no index root at"),
    (["features", "materialize", "--view-file", "{corpus}", "--source", "{corpus}",
      "--store", "{tmp}/fs"], "is invalid: Invalid JSON"),
    (["restore", "{corpus}", "{tmp}/restored"], "is not a snapshot (not a tar file)"),
    (["demo", "--data", "{tmp}/nope"], "has no corpus.jsonl: give --data a BEIR folder"),
    (["delete", "{index}", "--ids", "{corpus}"], "holds JSON objects, not ids"),
    (["delete", "--url", "http://127.0.0.1:9", "--ids", "{tmp}/judged-bad/empty.txt"],
     "holds no ids to delete"),  # before any request: it exited 0 in silence
    (["upsert", "--url", "http://127.0.0.1:9", "--corpus", "{tmp}/judged-bad/empty.jsonl"],
     "empty.jsonl holds no documents to upsert"),  # as the local upsert: it exited 0
    (["features", "materialize", "--view-file", "{view}", "--source", "{corpus}", "--store",
      "{tmp}/fs", "--grace-seconds", "-1"],
     "error: --grace-seconds: Input should be greater than or equal to 0"),  # several lines,
    # blamed on --store/--cluster/--namespace
    (["features", "materialize", "--view-file", "{view}", "--source", "{corpus}", "--store",
      "{tmp}/fs", "--batch-rows", "0"], "error: --batch-rows: must be at least 1, not 0"),
    (["distill", "{index}", "--texts", "1"], "distilling needs both"),
    (["distill", "{given}", "--texts", "600"], "a distilled query encoder learns"),
])
def test_common_mistakes_are_one_line_errors(small_index, tmp_path, capsys, args, says):
    """Each printed a traceback (a refused setting, a missing path) or several lines."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in SMALL))
    capsys.readouterr()
    if "{given}" in args:  # a build of vectors from another model
        build_small(tmp_path / "given", [Document(f"d{i}", f"text {i}") for i in range(20)])
    judged = tmp_path / "judged-bad"
    judged.mkdir()
    (judged / "queries.jsonl").write_text('{"_id": "q1"}\n')  # no text
    (judged / "empty.txt").write_text("\n")
    (judged / "empty.jsonl").write_text("")
    view = tmp_path / "view.json"
    view.write_text(json.dumps({"name": "v", "entity_key": "doc_id", "features": [
        {"name": "clicks", "dtype": "int64", "default": 0}]}))
    damaged = tmp_path / "damaged"
    if "{damaged}" in args:  # a flip history with a damaged line (gc and verify refuse it)
        shutil.copytree(small_index, damaged)
        with open(damaged / "HISTORY.jsonl", "a") as history:
            history.write("garbage\n")
    build = small_index / "builds" / (small_index / "CURRENT").read_text().strip()
    given = [a.format(corpus=corpus, tmp=tmp_path, index=small_index, given=tmp_path / "given",
                      build=build, judged=judged, damaged=damaged, view=view) for a in args]
    assert main(given) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and says in last, err


def test_search_says_when_no_document_has_a_filter_value(small_index, capsys):
    assert main(["search", str(small_index), "wing flutter", "--filter",
                 'department = "aeor"', "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["hits"] == []
    assert "no document has department = 'aeor'; did you mean 'aero'?" in captured.err
    assert main(["search", str(small_index), "wing", "--filter",
                 'department IN ("Structures", "aero")']) == 0
    assert "did you mean 'structures'?" in capsys.readouterr().err
    assert main(["search", str(small_index), "wing", "--filter", 'department = "aero"']) == 0
    assert "note:" not in capsys.readouterr().err


def test_search_explain_prints_why_each_hit_ranked(small_index, capsys):
    assert main(["search", str(small_index), "wing flutter", "--k", "2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "bm25 " in out and "(#1; " in out and "zscore fusion, vector weight" in out
    assert main(["search", str(small_index), "wing flutter", "--json", "--explain"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and all(h["explanation"]["candidates"] >= len(hits) for h in hits)


def test_search_min_score_and_calibrate(small_index, tmp_path, capsys):
    assert main(["search", str(small_index), "wing flutter", "--k", "3"]) == 0
    assert "relevance=0." in capsys.readouterr().out
    assert main(["search", str(small_index), "wing flutter", "--min-score", "1"]) == 0
    assert "no hits" in capsys.readouterr().out
    judged = tmp_path / "judged"
    (judged / "qrels").mkdir(parents=True)
    queries = {"q1": "swept wing flutter", "q2": "heat transfer in laminar flow",
               "q3": "shell buckling", "q4": "subsonic wing", "q5": "thin shells under load"}
    relevant = {"q1": "a1", "q2": "a2", "q3": "s1", "q4": "a1", "q5": "s1"}
    (judged / "queries.jsonl").write_text("".join(
        json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (judged / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, d in relevant.items()))
    assert main(["calibrate", str(small_index), "--data", str(judged), "--k", "3"]) == 2
    assert "5 judged queries" in capsys.readouterr().err  # below --min-queries: none written
    assert not (small_index / "relevance.json").exists()
    assert main(["calibrate", str(small_index), "--data", str(judged), "--k", "3",
                 "--min-queries", "5"]) == 0
    out = capsys.readouterr().out
    assert "fitted on 5 judged queries" in out and "relevance.json" in out
    calibration = json.loads((small_index / "relevance.json").read_text())
    assert calibration["fitted_on"] == {"judged": 5}
    assert main(["search", str(small_index), "wing flutter", "--k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0]["relevance"] > hits[-1]["relevance"]
    (small_index / "relevance.json").unlink()  # the module's other tests use the shipped one


def test_invalid_json_filter_is_reported_as_the_filter(small_index, capsys):
    assert main(["search", str(small_index), "wing", "--filter", "{'year': 1962}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --filter starts with '{' but is not valid JSON")
    assert "double quotes" in err


def test_a_filter_nested_past_the_recursion_limit_is_a_filter_error(small_index, capsys):
    """json.loads raised RecursionError, which no handler caught: a traceback."""
    deep = '{"a": ' + "[" * 20000 + "]" * 20000 + "}"
    assert main(["search", str(small_index), "wing", "--filter", deep]) == 2
    assert capsys.readouterr().err.startswith("error: --filter JSON nests too deeply")


def test_search_prints_each_hit_on_one_line_without_terminal_controls(tmp_path, capsys):
    """Line ends in a title split a hit over several lines, and an id's tab or a text's ANSI
    escapes reached the terminal as they are."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in [
        {"_id": "id\twith tab", "title": "wing\n\nflutter", "text": "wing flutter one"},
        {"_id": "ansi", "text": "\x1b[2J\x1b[31mwing flutter\x1b[0m two"},
        {"_id": "plain", "text": "Überschall wing flutter"}]))
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "index")]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "index"), "wing flutter"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 2  # the hits, then the build and timings lines
    assert "\x1b" not in "".join(lines) and "\t" not in "".join(lines)
    assert any("id\\twith tab" in line and line.endswith("wing flutter") for line in lines)
    assert any(line.endswith("\\x1b[2J\\x1b[31mwing flutter\\x1b[0m two") for line in lines)
    assert any(line.endswith("Überschall wing flutter") for line in lines)  # letters as they are
    assert main(["search", str(tmp_path / "index"), "wing flutter", "--json"]) == 0
    hit_ids = {h["doc_id"] for h in json.loads(capsys.readouterr().out)["hits"]}
    assert "id\twith tab" in hit_ids  # JSON keeps the values exact


def test_an_ids_file_with_a_byte_order_mark_deletes_its_first_id(small_index, tmp_path, capsys):
    """A Windows editor's BOM made the first id "\ufeffa1": acknowledged as deleted, and
    document a1 stayed."""
    root = tmp_path / "index"
    shutil.copytree(small_index, root)
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"\xef\xbb\xbfa1\r\na2\r\n")
    assert main(["delete", str(root), "--ids", str(ids)]) == 0
    assert "2 ids deleted" in capsys.readouterr().out
    retriever = Retriever.load(root)
    retriever.wait_for_seq(1)
    assert retriever.get_documents(["a1", "a2", "s1"])[:2] == [None, None]
    retriever.close()


def test_a_gate_file_with_a_mistyped_key_is_one_line(small_index, tmp_path, capsys):
    """pydantic's own text took four lines, the key on one, the problem on the next."""
    gate = tmp_path / "gate.json"
    gate.write_text('{"min_ndcg": 0.1}')
    with pytest.raises(SystemExit):
        main(["publish", str(small_index), "x", "--gate", str(gate)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown key 'min_ndcg' (did you mean 'max_ndcg_drop'?)" in last
    gate.write_text("[1, 2]")
    with pytest.raises(SystemExit):
        main(["publish", str(small_index), "x", "--gate", str(gate)])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        'holds a list, not an object of settings like {"max_doc_drop": 0.1}')


def test_dsl_operators_of_other_languages_say_what_to_write(small_index, capsys):
    assert main(["search", str(small_index), "wing", "--filter", 'department == "aero"']) == 2
    assert "'==' is not part of the filter language; use '='" in capsys.readouterr().err


def test_missing_corpus_is_reported_before_the_model_loads(tmp_path, capsys):
    # A model directory that does not exist: had the model loaded first, it would fail first.
    code = main(["build", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "i"),
                 "--model", str(tmp_path / "no-model")])
    assert code == 2
    err = capsys.readouterr().err
    assert "corpus file" in err and "nope.jsonl" in err and "does not exist" in err


def test_duplicate_id_is_reported_before_the_model_loads(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps(SMALL[0]) + "\n" + json.dumps(SMALL[1]) + "\n"
                      + json.dumps(SMALL[0]) + "\n")
    code = main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                 "--model", str(tmp_path / "no-model")])
    assert code == 2
    assert f"{corpus}:3: duplicate document id 'a1' (first at line 1)" in capsys.readouterr().err


def test_help_shows_the_input_formats(capsys):
    for argv in (["build", "--help"], ["features", "materialize", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    out = capsys.readouterr().out
    assert '{"_id": "d1", "title": "Wing flutter"' in out
    assert '{"name": "popularity", "entity_key": "doc_id"' in out
    assert "doc_id,clicks,ctr,editor_pick,event_time" in out


def test_python_dash_m_retrieval_runs_the_command(small_index):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "retrieval", "describe", str(small_index)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "department (keyword" in done.stdout
    done = subprocess.run([sys.executable, "-m", "retrieval", "bench"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2 and "invalid choice: 'bench'" in done.stderr
    # A reader that stops early (`| head`): no error printed, the shell's SIGPIPE code.
    piped = subprocess.Popen([sys.executable, "-m", "retrieval", "describe", str(small_index)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert piped.stdout is not None and piped.stderr is not None
    piped.stdout.close()  # before anything is written
    errors = piped.stderr.read().decode()
    assert piped.wait(timeout=120) == 141 and "Broken pipe" not in errors, errors


def test_every_registered_module_adds_its_subcommand():
    names = set()
    for register in COMMANDS:
        root = argparse.ArgumentParser()
        sub = root.add_subparsers()
        register(sub)
        added = set(sub.choices)
        assert added, f"{register} added no subcommand"
        assert not added & names, f"{register} re-adds {added & names}"
        names |= added
    assert names == {"build", "verify", "gc", "describe", "search", "features", "demo",
                     "publish", "rollback", "builds", "diff", "serve", "upsert", "delete",
                     "compact", "snapshot", "restore", "calibrate", "distill"}
