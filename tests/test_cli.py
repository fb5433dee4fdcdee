"""The ``retrieval`` command: build, verify, search (default query encoder), errors."""

from __future__ import annotations

import itertools
import json

from indexes.corpus import read_corpus
from indexes.synthetic import with_demo_metadata
from retrieval import Retriever
from retrieval.cli import main


def test_build_verify_search_round_trip(dataset, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    docs = itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 40)
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                          "metadata": d.metadata}) + "\n" for d in docs))
    out = tmp_path / "index"
    assert main(["build", "--corpus", str(corpus), "--out", str(out), "--batch-size", "16"]) == 0
    assert "published build" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    assert "files verified" in capsys.readouterr().out
    assert main(["search", str(out), "cell biology", "--filter", "year >= 2000", "--k", "3",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 < len(result["hits"]) <= 3
    assert all(h["metadata"]["year"] >= 2000 for h in result["hits"])
    assert main(["search", str(out), "cell", "--filter", "colour = 'red'"]) == 2
    assert "colour" in capsys.readouterr().err


def test_default_query_encoder_is_onnx_int8_against_torch_documents(beir_index):
    root, _, _ = beir_index("scifact")
    retriever = Retriever.load(root, {"cache": {"backend": "none"}})
    assert retriever.encoder.encoder_id == "all-MiniLM-L6-v2:onnx-int8:int8:384"
    assert retriever.snapshot.manifest.encoder.encoder_id == "all-MiniLM-L6-v2:torch:fp32:384"
    assert retriever.search("statins and heart disease", k=5).hits
    assert retriever.stats()["batching"] is None  # auto: batching only pays for torch
