"""Session fixtures for passage tests: long documents made of SciFact abstracts, built once
with one vector per document and once with passages."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from indexes import BuildConfig, Document, PassageConfig, build_index, read_corpus

CAR = ("Automobile prices in Norway fell sharply after the government changed its tax rules. "
       "Dealers reported record sales of vehicles that year.")
# A paraphrase sharing no word (and no stem) with the paragraph above.
CAR_QUERY = "cheaper cars in Scandinavia following new levies"
TARGET = "long-3"
N_DOCS = 12


@pytest.fixture(scope="session")
def long_docs(dataset) -> list[Document]:
    """Two abstracts per document; ``TARGET`` ends with the ``CAR`` paragraph."""
    abstracts = list(itertools.islice(read_corpus(dataset("scifact")), 2 * N_DOCS))
    docs = [Document(f"long-{i}", f"{a.text}\n\n{b.text}", a.title, {"group": i % 3})
            for i, (a, b) in enumerate(zip(abstracts[::2], abstracts[1::2], strict=True))]
    target = int(TARGET.split("-")[1])
    docs[target] = Document(TARGET, f"{docs[target].text}\n\n{CAR}", docs[target].title,
                            docs[target].metadata)
    return docs


@pytest.fixture(scope="session")
def passage_roots(long_docs, encoder, tmp_path_factory):
    """passage_roots(name) -> index root, built on first use: "whole" (one vector per
    document) or "passages" (256-token passages)."""
    configs = {"whole": BuildConfig(),
               "passages": BuildConfig(passages=PassageConfig(max_tokens=256))}
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            root = tmp_path_factory.mktemp(name)
            build_index(long_docs, root, encoder=encoder, config=configs[name], progress=False)
            built[name] = root
        return built[name]

    return get
