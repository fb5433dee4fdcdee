"""Writes over HTTP against a real ``retrieval serve`` (2 forked workers) on a SciFact subset:
visibility on every worker, read-your-writes, scopes, limits, retries, and SIGKILL during a
stream of acknowledged writes."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import Serving, serve

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.restore import restore_snapshot
from indexes.wal import read_all, segments
from indexes.wal.log import check_log
from retrieval import (
    ForbiddenError,
    RequestReplayError,
    Retriever,
    SchemaMismatchError,
    SequenceNotReachedError,
)
from retrieval.cli.app import main
from retrieval.client import RemoteRetriever

READ_KEY, WRITE_KEY = "read-key-0123456789", "write-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"
LAG = 0.3
CONFIG = f"""
[server]
workers = 2
api_keys_env = "WRITE_TEST_KEYS"
max_write_documents = 50
max_write_body_bytes = 400000
drain_seconds = 0.1
[retriever]
live_lag_seconds = {LAG}
"""
ENV = {"WRITE_TEST_KEYS": f"{READ_KEY},{WRITE_KEY} write,{ADMIN_KEY} admin"}


def ready_workers(server: Serving) -> float:
    with server.client(WRITE_KEY) as client:
        text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "retrieval_ready_workers":
                return float(sample.value)
    return 0.0


def start(root: Path, base: Path) -> Serving:
    config = base / "serve.toml"
    config.write_text(CONFIG)
    server = serve(root, config, base / "server.log", ENV)
    server.wait_until(lambda: ready_workers(server) == 2.0, 300, "2 ready workers")
    return server


@pytest.fixture(scope="module")
def corpus(dataset: Any) -> list[Any]:
    return list(with_demo_metadata(read_corpus(dataset("scifact"))))[:200]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, corpus: list[Any], build_subset: Any
            ) -> Iterator[tuple[Serving, Path]]:
    base = tmp_path_factory.mktemp("writes")
    build_subset(corpus, base / "index")
    server = start(base / "index", base)
    try:
        yield server, base / "index"
    finally:
        server.stop()


def new_docs(corpus: list[Any], encoder: Any, n: int, tag: str) -> list[dict[str, Any]]:
    """``n`` new documents (texts of the corpus, new ids) with their real vectors."""
    texts = [f"{tag} {corpus[i].text}" for i in range(n)]
    vectors = np.asarray(encoder.encode(texts), dtype=np.float32)
    return [{"id": f"{tag}-{i}", "text": text, "title": f"{tag} {i}",
             "metadata": {"department": corpus[i].metadata["department"]},
             "vector": vector.tolist()} for i, (text, vector) in enumerate(zip(texts, vectors,
                                                                        strict=True))]


def test_http_writes_are_visible_on_every_worker_within_the_lag(written, corpus, encoder):
    server, _ = written
    docs = new_docs(corpus, encoder, 20, "fresh")
    deleted = [corpus[100 + i].id for i in range(5)]
    with server.client(WRITE_KEY) as client:
        seqs = [client.post("/v1/documents", json={"documents": [doc]}).json()["seq"]
                for doc in docs]
        # Read-your-writes: the ack's seq as min_seq, on whichever worker answers, at once.
        seen = client.post("/v1/search", json={"query": docs[-1]["text"], "k": 3,
                                               "filters": {"id": docs[-1]["id"]},
                                               "min_seq": seqs[-1]}).json()
        assert [h["doc_id"] for h in seen["hits"]] == [docs[-1]["id"]]
        seqs += [client.post("/v1/documents/delete", json={"ids": [doc_id]}).json()["seq"]
                 for doc_id in deleted]
    assert seqs == sorted(seqs) and len(set(seqs)) == 25
    time.sleep(LAG + 1.0)
    for attempt in range(30):  # a fresh connection each: both workers answer some of them
        with server.client(READ_KEY) as client:
            doc = docs[attempt % len(docs)]
            result = client.post("/v1/search", json={"query": doc["text"], "k": 3}).json()
            assert result["build_id"].endswith(f"+{seqs[-1]}"), "a worker lags the log"
            assert result["hits"][0]["doc_id"] == doc["id"]
            gone = client.post("/v1/search", json={"query": "cells", "k": 10,
                                                   "filters": {"id": {"in": deleted}}}).json()
            assert gone["hits"] == []
    with server.client(READ_KEY) as client:
        fetched = client.post("/v1/documents/get",
                              json={"ids": [d["id"] for d in docs] + deleted}).json()
    assert [d["id"] for d in fetched["documents"]] == [d["id"] for d in docs]
    assert fetched["documents"][0]["metadata"] == docs[0]["metadata"]
    assert fetched["missing"] == deleted and fetched["applied_seq"] == seqs[-1]


def test_scopes_limits_and_malformed_writes_log_nothing(written, corpus, encoder):
    server, root = written
    before = sum(path.stat().st_size for _, path in segments(root))
    doc = new_docs(corpus, encoder, 1, "scoped")[0]
    with server.client(READ_KEY) as client:
        denied = client.post("/v1/documents", json={"documents": [doc]})
        assert denied.status_code == 403 and denied.json()["error"]["type"] == "ForbiddenError"
        assert client.post("/v1/documents/delete", json={"ids": ["x"]}).status_code == 403
    with server.client(None) as client:
        assert client.post("/v1/documents", json={"documents": [doc]}).status_code == 401
    with server.client(WRITE_KEY) as client:
        big = {"documents": [{**doc, "text": "x" * 500_000}]}
        assert client.post("/v1/documents", json=big).status_code == 413
        many = {"documents": [{"id": f"m{i}", "text": "short"} for i in range(51)]}
        too_many = client.post("/v1/documents", json=many)
        assert too_many.status_code == 413 and "max_write_documents" in too_many.text
        for bad, kind in [({**doc, "id": " "}, "InvalidWriteError"),
                          ({**doc, "vector": doc["vector"][:10]}, "InvalidWriteError"),
                          ({**doc, "vector": "not base64!"}, "InvalidWriteError"),
                          ({**doc, "vector": "AAAA"}, "InvalidWriteError"),  # 3 bytes
                          ({**doc, "metadata": {"departmnet": "x"}}, "SchemaMismatchError"),
                          ({**doc, "metadata": {"year": "recent"}}, "SchemaMismatchError"),
                          ({**doc, "colour": "red"}, "RequestFieldError")]:
            response = client.post("/v1/documents", json={"documents": [bad]})
            assert response.status_code == 422, response.text
            assert response.json()["error"]["type"] == kind
    assert sum(path.stat().st_size for _, path in segments(root)) == before


def test_remote_client_retries_once_and_reads_its_writes(written, corpus, encoder):
    server, _ = written
    doc = new_docs(corpus, encoder, 1, "remote")[0]
    vector = np.asarray([doc.pop("vector")], dtype=np.float32)
    with RemoteRetriever(server.url, WRITE_KEY) as remote:
        first = remote.upsert([doc], vector, request_id="remote-1")
        again = remote.upsert([doc], vector, request_id="remote-1")
        assert again.seq == first.seq and again.replayed and not first.replayed
        with pytest.raises(RequestReplayError):
            remote.upsert([{**doc, "text": "another text"}], vector, request_id="remote-1")
        with pytest.raises(SchemaMismatchError, match="'colour'"):
            remote.upsert([{**doc, "metadata": {"colour": "red"}}], vector)
        found, absent = remote.get_documents([doc["id"], "no-such-id"], min_seq=first.seq)
        assert found is not None and found.text == doc["text"] and absent is None
        hits = remote.search(doc["text"], {"id": doc["id"]}, k=1, min_seq=first.seq).hits
        assert hits[0].doc_id == doc["id"]
        with pytest.raises(SequenceNotReachedError, match="min_seq"):
            remote.search("cells", min_seq=first.seq + 1000)
        removed = remote.delete([doc["id"]])
        assert remote.get_documents([doc["id"]], min_seq=removed.seq) == [None]
    with RemoteRetriever(server.url, READ_KEY) as reader, pytest.raises(ForbiddenError):
        reader.delete(["anything"])


def test_cli_upsert_and_delete_through_the_url(written, tmp_path, monkeypatch, capsys):
    """No model in the caller: the server embeds the texts (its own writer's encoder)."""
    server, _ = written
    corpus_file = tmp_path / "two.jsonl"
    corpus_file.write_text('{"_id": "cli-1", "text": "lipid metabolism in cardiac cells"}\n'
                           '{"_id": "cli-2", "text": "vitamin D and bone density"}\n')
    (tmp_path / "ids.txt").write_text("cli-1\n")
    monkeypatch.delenv("RETRIEVAL_API_KEY", raising=False)
    assert main(["upsert", "--url", server.url, "--corpus", str(corpus_file)]) == 2
    assert "$RETRIEVAL_API_KEY is not set" in capsys.readouterr().err
    monkeypatch.setenv("RETRIEVAL_API_KEY", READ_KEY)
    assert main(["delete", "--url", server.url, "--ids", str(tmp_path / "ids.txt")]) == 2
    assert "the key in $RETRIEVAL_API_KEY was refused" in capsys.readouterr().err
    monkeypatch.setenv("RETRIEVAL_API_KEY", WRITE_KEY)
    assert main(["upsert", "--url", server.url, "--corpus", str(corpus_file)]) == 0
    assert main(["delete", "--url", server.url, "--ids", str(tmp_path / "ids.txt")]) == 0
    out = capsys.readouterr().out
    last = int(out.strip().splitlines()[-1].split()[2].rstrip(":"))
    with RemoteRetriever(server.url, READ_KEY) as remote:
        assert remote.get_documents(["cli-1", "cli-2"], min_seq=last)[0] is None
        assert remote.search("vitamin D bone density", k=1, min_seq=last).hits[0].doc_id == \
            "cli-2"


def test_an_admin_key_downloads_a_snapshot_that_restores_at_its_seq(written, tmp_path):
    server, root = written
    with server.client(WRITE_KEY) as client:
        assert client.post("/v1/snapshot").status_code == 403
    with server.client(ADMIN_KEY) as client:
        response = client.post("/v1/snapshot")
    assert response.status_code == 200, response.text
    seq = int(response.headers["x-snapshot-seq"])
    (tmp_path / "snap.tar").write_bytes(response.content)
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "restored")
    with Retriever.load(tmp_path / "restored", {"cache": {"backend": "none"}}) as restored, \
            Retriever.load(root, {"cache": {"backend": "none"}}) as source:
        assert restored.applied_seq == seq == source.applied_seq
        ids = [f"fresh-{i}" for i in range(20)] + ["cli-2", "remote-0"]
        assert restored.get_documents(ids) == source.get_documents(ids)
        assert restored.search("lipid metabolism", k=5).hits == \
            source.search("lipid metabolism", k=5).hits


def _stream(server: Serving, docs: list[dict[str, Any]], acked: list[tuple[int, list[str]]],
            stop: threading.Event) -> None:
    """Upsert batches of 5 until the server dies, keeping each acknowledged (seq, ids)."""
    with server.client(WRITE_KEY) as client:
        at = 0
        while not stop.is_set():
            batch = [{**d, "id": f"{d['id']}-{at}"} for d in docs[:5]]
            at += 1
            try:
                response = client.post("/v1/documents", json={"documents": batch})
            except httpx.HTTPError:
                return
            if response.status_code != 200:
                return
            acked.append((response.json()["seq"], [d["id"] for d in batch]))


def test_sigkill_during_acknowledged_http_writes_loses_nothing_in_20_trials(
        tmp_path, corpus, build_subset, encoder):
    """20 trials: SIGKILL of the server and its workers at a random moment of a stream of
    acknowledged writes; every acknowledged write is then in the log, whole, and after the
    last restart every acknowledged document is served and the root verifies."""
    root = tmp_path / "index"
    build_subset(corpus[:60], root)
    docs = new_docs(corpus, encoder, 5, "killed")
    rng = random.Random(7)
    acked: list[tuple[int, list[str]]] = []
    for _ in range(20):
        server = start(root, tmp_path)
        stop = threading.Event()
        writer = threading.Thread(target=_stream, args=(server, docs, acked, stop))
        writer.start()
        time.sleep(rng.uniform(0.1, 0.6))
        server.kill()
        stop.set()
        writer.join()
        records = read_all(root)  # raises on a damaged record: a torn tail is only cut off
        seqs = [r.seq for r in records]
        assert seqs == list(range(1, len(seqs) + 1))
        assert {seq for seq, _ in acked} <= set(seqs), "an acknowledged write was lost"
        assert all(len(r.documents) == 5 and r.vectors.shape == (5, 384) for r in records)
    assert len(acked) > 20
    check_log(root)
    assert main(["verify", str(root)]) == 0
    with Retriever.load(root, {"cache": {"backend": "none"}}) as reopened:
        ids = [doc_id for _, batch in acked for doc_id in batch]
        assert all(doc is not None for doc in reopened.get_documents(ids))


def test_a_stop_while_a_worker_is_replaced_stops_the_server(tmp_path, corpus, build_subset):
    """SIGTERM during the pause before a dead worker's replacement: the replacement started
    after the stop was forwarded, and the server waited on it forever."""
    import os
    import signal
    import subprocess

    root = tmp_path / "index"
    build_subset(corpus[:30], root)
    server = start(root, tmp_path)
    try:
        pid = server.process.pid
        workers = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        os.kill(int(workers[0]), signal.SIGKILL)
        time.sleep(0.3)  # inside the pause before the replacement (1 s)
        server.process.send_signal(signal.SIGTERM)
        try:
            assert server.process.wait(timeout=20) is not None
        except subprocess.TimeoutExpired:
            pytest.fail(server.failure("the server kept running after SIGTERM"))
    finally:
        server.kill()
