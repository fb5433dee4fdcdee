"""Passages through every door: the LangChain and LlamaIndex adapters, the HTTP service and
``RemoteRetriever`` return the same grouped passages, with their parents and offsets."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from passage_fixtures import CAR_QUERY, TARGET

from retrieval import InvalidQueryError, Retriever
from retrieval.cli import main
from retrieval.client import RemoteRetriever
from retrieval.integrations.langchain import LangChainRetriever
from retrieval.integrations.llamaindex import LlamaIndexRetriever
from retrieval.service.app import create_app
from retrieval.service.settings import ServeConfig

QUERY = "protein expression in cells"


@pytest.fixture(scope="module")
def passages(passage_roots, encoder) -> Iterator[Retriever]:
    retriever = Retriever.load(passage_roots("passages"), {"cache": {"backend": "none"}},
                               encoder=encoder)
    yield retriever
    retriever.close()


def test_langchain_documents_carry_parent_and_offsets(passages, long_docs):
    text_of = {d.id: d.text for d in long_docs}
    docs = LangChainRetriever(passages, k=4, group_by="document").invoke(QUERY)
    assert len({d.metadata["parent_id"] for d in docs}) == len(docs) == 4
    for doc in docs:
        meta = doc.metadata
        assert doc.id == f"{meta['parent_id']}#{meta['passage']}"
        assert text_of[meta["parent_id"]][meta["start"]:meta["end"]] in doc.page_content
    flat = LangChainRetriever(passages, k=10).invoke(QUERY)
    assert len({d.id for d in flat}) == 10  # passages of one document keep distinct ids
    with_context = LangChainRetriever(passages, k=1).invoke(CAR_QUERY, group_by="document",
                                                            context=1)
    assert with_context[0].metadata["parent_id"] == TARGET
    assert len(with_context[0].page_content) > with_context[0].metadata["end"] - \
        with_context[0].metadata["start"]


def test_llamaindex_nodes_group_by_document(passages):
    nodes = LlamaIndexRetriever(passages, k=4, group_by="document").retrieve(QUERY)
    parents = [n.node.metadata["parent_id"] for n in nodes]
    assert len(set(parents)) == len(parents) == 4
    assert "parent_id" not in nodes[0].node.get_content(metadata_mode="llm")


def test_adapters_refuse_a_bad_group_by(passages):
    with pytest.raises(InvalidQueryError, match="group_by"):
        LangChainRetriever(passages, group_by="sentence")
    with pytest.raises(InvalidQueryError, match="group_by"):
        LlamaIndexRetriever(passages, group_by="sentence")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def remote(passage_roots, encoder) -> Iterator[RemoteRetriever]:
    """The HTTP service over the passage build, on a real port, and a client of it."""
    root = passage_roots("passages")
    app = create_app(root, ServeConfig(), keys=None, loader=lambda: Retriever.load(
        root, {"cache": {"backend": "none"}}, encoder=encoder))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    client = RemoteRetriever(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while not app.state.service.ready:
        assert time.monotonic() < deadline, "the service did not load the passage build"
        time.sleep(0.1)
    yield client
    client.close()
    server.should_exit = True
    thread.join(timeout=30)


def test_service_groups_and_returns_offsets_like_the_library(remote, passages):
    over_http = remote.search(QUERY, k=5, group_by="document", context=1)
    local = passages.search(QUERY, k=5, group_by="document", context=1)
    assert [(h.doc_id, h.passage, h.start, h.end, h.context) for h in over_http.hits] == \
        [(h.doc_id, h.passage, h.start, h.end, h.context) for h in local.hits]
    batch = remote.search_batch([QUERY, CAR_QUERY], k=3, group_by="document")
    assert [len({h.parent_id for h in r.hits}) for r in batch] == [3, 3]
    with pytest.raises(InvalidQueryError, match="group_by"):
        remote.search(QUERY, group_by="chapter")


def test_cli_builds_passages_and_searches_grouped(long_docs, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n"
                              for d in long_docs[:2]))
    out = tmp_path / "index"
    assert main(["build", "--corpus", str(corpus), "--out", str(out), "--passages",
                 "--passage-tokens", "128", "--passage-overlap", "16"]) == 0
    printed = capsys.readouterr().out
    assert "2 of 2 documents (100.0%) are longer than the encoder's 256-token window" in printed
    assert "passages from 2 documents" in printed and "0 passages exceed the window" in printed
    assert main(["describe", str(out)]) == 0
    assert "rows are passages" in capsys.readouterr().out
    assert main(["search", str(out), "protein", "--k", "2", "--group-by", "document"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4].strip(". ")
             .isdigit()]
    assert len(lines) == 2 and {line.split()[1].split("#")[0] for line in lines} == {
        "long-0", "long-1"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--passage-tokens", "128"], "need --passages"),
    (["--passages", "--passage-tokens", "100", "--passage-overlap", "60"], "more than half"),
])
def test_cli_refuses_bad_passage_options_before_the_model_loads(tmp_path, capsys, argv,
                                                                message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "text"}) + "\n")
    code = main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "i"), "--model",
                 str(tmp_path / "no-model"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err
