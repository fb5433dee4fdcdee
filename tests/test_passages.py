"""Long documents: the window report, passages, grouping by document, offsets and reuse.

Real model, real SciFact abstracts (``passage_fixtures``): long documents are two abstracts
each, and one of them ends with a paragraph on another subject, past the 256-token window.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from passage_fixtures import CAR_QUERY, N_DOCS, TARGET

from indexes import BuildConfig, Document, PassageConfig, build_index
from indexes.errors import CorpusError, InvalidQueryError, LimitExceededError
from indexes.passages import TokenCounter, split_text
from indexes.publish import read_contents
from retrieval import Retriever
from retrieval.publishing.structure import Served, content_diff


@pytest.fixture(scope="module")
def counter(encoder) -> TokenCounter:
    return TokenCounter.for_model(encoder.model_path)


@pytest.fixture(scope="module")
def retrievers(passage_roots, encoder):
    """(one vector per document, passages) retrievers over the same long documents."""
    made = {name: Retriever.load(passage_roots(name), {"cache": {"backend": "none"}},
                                 encoder=encoder) for name in ("whole", "passages")}
    yield made
    for retriever in made.values():
        retriever.close()


def test_the_relevant_paragraph_sits_past_the_window(long_docs, counter):
    target = next(d for d in long_docs if d.id == TARGET)
    before = target.content[: target.content.index("Automobile")]
    assert counter.count([before])[0] > counter.window


def test_window_report_counts_documents_the_encoder_truncates(retrievers, long_docs, encoder):
    tokenizer = encoder._model.tokenizer  # the model's own (transformers) tokenizer: an oracle
    lengths = [len(tokenizer(d.content)["input_ids"]) for d in long_docs]
    expected = sum(n > 256 for n in lengths)
    for name, retriever in retrievers.items():
        window = retriever.snapshot.manifest.window
        assert window is not None and window.window == 256
        assert window.over_window == expected > 0
        assert window.longest_tokens == max(lengths)
        assert window.rows_over_window == (expected if name == "whole" else 0)


def test_a_split_build_is_not_told_to_split(counter):
    """A title longer than the window leaves its passages over it: the report says why, and
    does not advise the passages the build already has."""
    from indexes import split_documents

    long_title = Document(id="t", title="cell " * 400, text="protein folding " * 300)
    *_, window = split_documents([long_title], counter, PassageConfig())
    assert window.split and window.rows_over_window > 0
    assert "--passages" not in window.describe() and "whole title" in window.describe()


def test_paraphrase_past_the_window_found_with_passages_only(retrievers):
    whole = [h.doc_id for h in retrievers["whole"].search(CAR_QUERY, k=3).hits]
    grouped = retrievers["passages"].search(CAR_QUERY, k=3, group_by="document").hits
    assert TARGET not in whole
    assert grouped[0].doc_id == TARGET
    assert "Automobile" in grouped[0].text and grouped[0].passage and grouped[0].passage > 0


def test_grouping_returns_each_document_once_and_k_documents(retrievers):
    passages = retrievers["passages"]
    # Five candidate passages span fewer than five documents: grouping must widen.
    flat = passages.search("protein expression in cells", k=5, candidates=5).hits
    assert len({h.doc_id for h in flat}) < 5
    for k in (1, 5, N_DOCS):
        hits = passages.search("protein expression in cells", k=k, candidates=5,
                               group_by="document").hits
        assert len(hits) == k
        assert len({h.doc_id for h in hits}) == k


def test_grouping_widens_by_bm25_under_the_keyword_policy(passage_roots, encoder):
    config = {"cache": {"backend": "none"}, "candidate_policy": "keyword"}
    with Retriever.load(passage_roots("passages"), config, encoder=encoder) as keyword:
        flat = keyword.search("protein expression in cells", k=5, candidates=5).hits
        hits = keyword.search("protein expression in cells", k=5, candidates=5,
                              group_by="document").hits
    assert len({h.doc_id for h in flat}) < 5 == len({h.doc_id for h in hits}) == len(hits)
    assert all(h.bm25_score > 0 for h in hits)  # no dense-only candidate came in


def test_grouping_with_a_filter_is_exact_and_capped(retrievers, long_docs):
    allowed = {d.id for d in long_docs if d.metadata["group"] == 1}
    hits = retrievers["passages"].search("protein", {"group": 1}, k=10,
                                         group_by="document").hits
    assert {h.doc_id for h in hits} == allowed and len(hits) == len(allowed)


def test_every_passage_and_context_is_its_documents_text_at_its_offsets(retrievers, long_docs):
    text_of = {d.id: d.text for d in long_docs}
    result = retrievers["passages"].search("cell biology", k=30, context=1)
    assert len(result.hits) == 30
    for hit in result.hits:
        parent = text_of[hit.parent_id]
        assert hit.parent_id == hit.doc_id and hit.start is not None and hit.end is not None
        assert hit.text == parent[hit.start:hit.end]
        assert hit.context is not None
        assert hit.context.text == parent[hit.context.start:hit.context.end]
        assert hit.context.start <= hit.start and hit.end <= hit.context.end
        assert hit.context.first_passage <= hit.passage <= hit.context.last_passage


def test_whole_document_hits_have_no_passage_fields(retrievers):
    hit = retrievers["whole"].search("protein", k=1, group_by="document", context=1).hits[0]
    assert (hit.parent_id, hit.passage, hit.start, hit.end, hit.context) == (None,) * 5


@pytest.mark.parametrize(("options", "error"), [
    ({"group_by": "paragraph"}, InvalidQueryError),
    ({"context": -1}, InvalidQueryError),
    ({"context": 1.5}, InvalidQueryError),
    ({"context": 99}, LimitExceededError),
])
def test_bad_grouping_options_are_typed_errors(retrievers, options, error):
    with pytest.raises(error, match="group_by|context"):
        retrievers["passages"].search("protein", **options)


def test_passages_longer_than_the_window_are_refused(long_docs, encoder, tmp_path):
    config = BuildConfig(passages=PassageConfig(max_tokens=512, overlap_tokens=0))
    with pytest.raises(CorpusError, match="max_tokens <= 256"):
        build_index(long_docs[:1], tmp_path, encoder=encoder, config=config, progress=False)


def test_split_prefers_paragraphs_tiles_the_text_and_fits(counter):
    text = "\n\n".join(" ".join(f"Sentence {p}.{s} has a few words." for s in range(12))
                       for p in range(4)) + " " + "word " * 400
    starts = counter.starts([text])[0]
    spans = split_text(text, starts, budget=60, overlap=12)
    assert spans[0].start == 0 and spans[-1].end == len(text)
    for before, after in itertools.pairwise(spans):
        assert after.start <= before.end  # consecutive passages tile the text
    counts = [counter.count([text[s.start:s.end]])[0] - 2 for s in spans]
    assert max(counts) <= 60
    assert sum(text[s.start:s.end].rstrip().endswith(".") for s in spans) >= len(spans) - 8


def test_a_sentence_too_long_is_cut_between_words(counter):
    # one 300-word sentence of words the tokenizer splits into several pieces
    text = " ".join(["supercalifragilistic", "naïveté", "immunohistochemistry"] * 100) + "."
    starts = counter.starts([text])[0]
    spans = split_text(text, starts, budget=50, overlap=0)
    assert len(spans) > 10
    for span in spans[1:]:
        assert text[span.start - 1] == " ", text[span.start - 10:span.start + 10]
        assert span.tokens <= 50


def test_one_word_longer_than_a_passage_is_still_cut(counter):
    text = "ACGT-" * 300 + "."  # no space anywhere: cut between tokens
    starts = counter.starts([text])[0]
    spans = split_text(text, starts, budget=40, overlap=0)
    assert len(spans) > 1 and max(s.tokens for s in spans) <= 40
    assert "".join(text[s.start:s.end] for s in spans) == text


WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "supercalifragilistic", "x1",
                         "naïve", "co-operation", "42"])
SENTENCES = st.lists(WORDS, min_size=1, max_size=60).map(lambda w: " ".join(w) + ".")
PARAGRAPHS = st.lists(SENTENCES, min_size=1, max_size=8).map(" ".join)
TEXTS = st.lists(PARAGRAPHS, min_size=1, max_size=6).map("\n\n".join)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS, budget=st.integers(8, 120), overlap=st.integers(0, 60))
def test_split_property_tiles_and_fits_any_text(counter, text, budget, overlap):
    starts = counter.starts([text])[0]
    spans = split_text(text, starts, budget, overlap)
    assert spans[0].start == 0 and spans[-1].end == len(text)
    for before, after in itertools.pairwise(spans):
        assert before.start < after.start <= before.end
    for span in spans:
        inside = np.count_nonzero((starts >= span.start) & (starts < span.end))
        assert inside == span.tokens <= budget


class CountingEncoder:
    """The real encoder, recording every text it is asked to encode."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.model_path = inner.model_path
        self.texts: list[str] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.encode(texts, batch_size=batch_size)


def test_rebuild_reencodes_only_the_changed_passages(encoder, tmp_path: Path):
    paragraphs = [" ".join(f"Paragraph {p} sentence {s} talks about topic {p}." for s in range(9))
                  for p in range(4)]
    config = BuildConfig(passages=PassageConfig(max_tokens=128, overlap_tokens=16))
    counting = CountingEncoder(encoder)
    first = build_index([Document("doc", "\n\n".join(paragraphs), "Title")], tmp_path,
                        encoder=counting, config=config, progress=False)
    assert first.n_docs == len(counting.texts) >= 4
    paragraphs[2] = paragraphs[2].replace("sentence 4 talks", "sentence 4 now speaks")
    counting.texts.clear()
    second = build_index([Document("doc", "\n\n".join(paragraphs), "Title")], tmp_path,
                         encoder=counting, config=config, progress=False)
    assert len(counting.texts) == second.vectors_encoded == 1
    assert "now speaks" in counting.texts[0]
    assert second.vectors_reused == second.n_docs - 1
    # The publish gate compares documents: one changed, none added or removed.
    diff = content_diff(Served.alone(read_contents(first.path)).hashes,
                        Served.alone(read_contents(second.path)).hashes)
    assert diff == {"added": [], "removed": [], "changed": ["doc"]}


def test_grouped_and_flat_results_are_cached_apart(passage_roots, encoder):
    with Retriever.load(passage_roots("passages"), encoder=encoder) as cached:
        flat = cached.search("protein expression in cells", k=5, candidates=5)
        grouped = cached.search("protein expression in cells", k=5, candidates=5,
                                group_by="document")
        again = cached.search("protein expression in cells", k=5, candidates=5,
                              group_by="document")
    assert (flat.cache.result, grouped.cache.result, again.cache.result) == ("miss", "miss",
                                                                             "hit")
    assert len({h.doc_id for h in flat.hits}) < 5 == len({h.doc_id for h in grouped.hits})
