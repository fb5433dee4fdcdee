"""The console over a root with live writes: a side with other ranking reads the writes a
``min_seq`` names, and the schema counts the documents the index serves.

The real app runs in this process over a real two-build root (``console_index``) and a real
write-ahead log; the retriever follows the log only when asked (``live_lag_seconds=None``),
so a search that needs a write has to wait for it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_index import LIVE_DOCS, console_root
from small_index import query_encoder_fixture  # noqa: F401 (fixture)
from starlette.testclient import TestClient

from indexes.docstore import Document
from indexes.writer import IndexWriter
from retrieval import Retriever
from retrieval.service.app import create_app
from retrieval.service.auth import ApiKeys
from retrieval.service.settings import ServeConfig

NEW_ID, WORD = "n1", "zyxwquartz"  # a word no Cranfield document holds
RANKINGS = [{"fusion": "rrf"}, {"vector_weight": 0.5}]


@pytest.fixture(scope="module")
def base_root(tmp_path_factory: pytest.TempPathFactory, dataset: Any, encoder: Any
              ) -> tuple[Path, str]:
    """(root, staged build id): built once, copied by each test that writes to it."""
    root = tmp_path_factory.mktemp("console-live") / "index"
    _, staged = console_root(root, dataset("cranfield"), encoder)
    return root, staged


@pytest.fixture()
def root(base_root: tuple[Path, str], tmp_path: Path) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(base_root[0], copy)
    return copy


@pytest.fixture()
def serving(root: Path, query_encoder: Any) -> Iterator[Retriever]:
    with Retriever.load(root, {"live_lag_seconds": None},
                        encoder=query_encoder) as retriever:
        yield retriever


@pytest.fixture()
def client(root: Path, serving: Retriever) -> Iterator[TestClient]:
    app = create_app(root, ServeConfig(), keys=ApiKeys([]), loader=lambda: serving)
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        deadline = time.monotonic() + 60
        while test_client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the service never became ready"
            time.sleep(0.05)
        yield test_client


def write(root: Path, encoder: Any) -> int:
    """A new document, one replaced and three deleted; the last write's seq."""
    with IndexWriter(root, encoder) as writer:
        writer.upsert([Document(NEW_ID, f"{WORD} heat transfer in a boundary layer"),
                       Document("2", "replaced text of the second document")])
        return writer.delete(["3", "4", "5"])


@pytest.mark.parametrize("ranking", RANKINGS)
def test_a_side_with_other_ranking_reads_the_writes_min_seq_names(client, serving, root,
                                                                  encoder, ranking):
    """A ranking change is a ``with_ranking`` variant, which follows no log: with min_seq it
    always answered 409, though the serving build had the write."""
    seq = write(root, encoder)
    assert serving.applied_seq < seq  # not applied until a search asks for it
    answer = client.post("/v1/console/search", json={
        "query": WORD, "k": 3, "min_seq": seq, "side": {"ranking": ranking}})
    assert answer.status_code == 200, answer.text
    assert [h["doc_id"] for h in answer.json()["hits"]][:1] == [NEW_ID]
    assert serving.applied_seq >= seq


def test_a_comparison_waits_for_min_seq_once_for_both_sides(client, serving, root, encoder,
                                                           base_root):
    seq = write(root, encoder)
    answer = client.post("/v1/console/compare", json={
        "query": WORD, "k": 3, "min_seq": seq, "right": {"ranking": RANKINGS[0]}})
    assert answer.status_code == 200, answer.text
    for side in ("left", "right"):
        assert [h["doc_id"] for h in answer.json()[side]["hits"]][:1] == [NEW_ID], side
    staged = client.post("/v1/console/compare", json={
        "query": WORD, "k": 3, "min_seq": seq, "right": {"build": base_root[1]}})
    assert staged.status_code == 200, staged.text  # another build: no writes to wait for
    assert NEW_ID not in [h["doc_id"] for h in staged.json()["right"]["hits"]]


def test_a_seq_no_write_reached_is_still_refused(client, root, encoder):
    seq = write(root, encoder)
    answer = client.post("/v1/console/search", json={
        "query": WORD, "min_seq": seq + 1000, "side": {"ranking": RANKINGS[0]}})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["type"] == "SequenceNotReachedError"


def test_the_schema_counts_the_documents_served_as_the_index_does(client, serving, root,
                                                                  encoder):
    """It counted the doc store's rows: replaced and deleted ones too (152, not 148)."""
    serving.wait_for_seq(write(root, encoder))
    rows = client.get("/v1/console/schema").json()["rows"]
    assert rows == client.get("/v1/index").json()["documents"] == LIVE_DOCS + 1 - 3


def test_the_schemas_fields_follow_the_writes_served(client, serving, root, encoder):
    """The fields' summary is kept per snapshot: a write served is a new one, summarized
    anew."""
    assert client.get("/v1/console/schema").json()["fields"]["department"]["of"] == LIVE_DOCS
    serving.wait_for_seq(write(root, encoder))
    fields = client.get("/v1/console/schema").json()["fields"]
    assert fields["department"]["of"] == LIVE_DOCS + 1 - 3


def test_a_variant_says_it_serves_the_writes_its_snapshot_holds(serving, root, encoder):
    """``with_ranking`` over the serving snapshot holds that snapshot's live writes, and its
    ``applied_seq`` says so (it said its build's, so ``min_seq`` on it was refused); over
    another snapshot (the build alone) it holds that build's writes only."""
    seq = write(root, encoder)
    serving.refresh()
    assert serving.applied_seq == seq
    for snapshot in (None, serving.snapshot):  # the console names the serving snapshot
        with serving.with_ranking(snapshot, fusion="rrf") as variant:
            assert variant.applied_seq == seq
            hits = variant.search(WORD, k=3, min_seq=seq).hits
            assert [h.doc_id for h in hits][:1] == [NEW_ID]
    base = serving.snapshot.base
    assert base is not None
    with serving.with_ranking(base, fusion="rrf") as variant:
        assert variant.applied_seq == base.manifest.log_seq < seq
